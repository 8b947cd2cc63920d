"""Test doubles for GitHub: a fake REST API on 127.0.0.1 that records every request, and a harness
that executes action.yml's composite steps with bash the way the Actions runner does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Recorded:
    method: str
    path: str
    authorization: str | None
    body: Any


class FakeGitHub:
    """Issue comments of one repository: list (paginated with Link headers), create, update.
    `read_only=True` answers writes with 403 as GitHub does for a fork's token."""

    def __init__(self, repo: str = "octo/kernels", token: str = "ghs_fake", read_only: bool = False):
        self.repo = repo
        self.token = token
        self.read_only = read_only
        self.requests: list[Recorded] = []
        self.comments: dict[int, list[dict[str, Any]]] = {}
        self._next_id = 1000
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with fake._lock:
                    fake.requests.append(Recorded(method, self.path, self.headers.get("Authorization"), body))
                    status, payload, headers = fake.route(method, self.path, body, self.headers)
                self._send(status, payload, headers)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeGitHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def seed(self, number: int, count: int, author: str = "someone") -> None:
        """Comments by others, so the sticky one lands past the first page."""
        for i in range(count):
            self._add(number, f"comment {i} by {author}")

    def _add(self, number: int, body: str) -> dict[str, Any]:
        self._next_id += 1
        comment = {"id": self._next_id, "body": body, "user": {"login": "github-actions[bot]"}}
        self.comments.setdefault(number, []).append(comment)
        return comment

    def route(self, method: str, path: str, body: Any, headers: Any) -> tuple[int, Any, dict[str, str]]:
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}, {}
        url = urlparse(path)
        prefix = f"/repos/{self.repo}/issues/"
        m = re.fullmatch(re.escape(prefix) + r"(\d+)/comments", url.path)
        if m and method == "GET":
            number = int(m.group(1))
            query = parse_qs(url.query)
            per_page = int(query.get("per_page", ["30"])[0])
            page = int(query.get("page", ["1"])[0])
            items = self.comments.get(number, [])
            chunk = items[(page - 1) * per_page: page * per_page]
            links = {}
            if page * per_page < len(items):
                links["Link"] = (f'<{self.url}{url.path}?per_page={per_page}&page={page + 1}>; rel="next", '
                                 f'<{self.url}{url.path}?per_page={per_page}&page=1>; rel="first"')
            return 200, chunk, links
        if m and method == "POST":
            if self.read_only:
                return 403, {"message": "Resource not accessible by integration"}, {}
            return 201, self._add(int(m.group(1)), body["body"]), {}
        m = re.fullmatch(re.escape(prefix) + r"comments/(\d+)", url.path)
        if m and method == "PATCH":
            if self.read_only:
                return 403, {"message": "Resource not accessible by integration"}, {}
            for items in self.comments.values():
                for c in items:
                    if c["id"] == int(m.group(1)):
                        c["body"] = body["body"]
                        return 200, c, {}
            return 404, {"message": "Not Found"}, {}
        return 404, {"message": "Not Found"}, {}

    def sticky(self, number: int) -> list[dict[str, Any]]:
        return [c for c in self.comments.get(number, []) if "<!-- kgate-report" in c["body"]]

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method in ("POST", "PATCH")]


# --------------------------------------------------------------------------------------------------
# The composite action, executed step by step.

_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class ActionRun:
    returncode: int
    log: str
    outputs: dict[str, str]
    step_outputs: dict[str, dict[str, str]] = field(default_factory=dict)


def parse_output_file(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT: `name=value` lines and `name<<DELIM` heredocs."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            value: list[str] = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                value.append(lines[i])
                i += 1
            out[name] = "\n".join(value)
        elif "=" in line:
            name, value_ = line.split("=", 1)
            out[name] = value_
        i += 1
    return out


def run_action(inputs: dict[str, str], *, workspace: Path, env: dict[str, str], runner_temp: Path,
               action_dir: Path = ROOT) -> ActionRun:
    """Run action.yml as the runner would: each `run` step through `bash --noprofile --norc -eo pipefail`
    with its `env`, expressions (inputs, github.token, steps.*.outputs) substituted, and a fresh
    GITHUB_OUTPUT file per step. Stops at the first failing step, like a composite action."""
    action = yaml.safe_load((action_dir / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    values = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    unknown = set(inputs) - set(values)
    assert not unknown, f"inputs the action does not declare: {unknown}"
    values.update(inputs)
    steps: dict[str, dict[str, str]] = {}
    context = {"github.action_path": str(action_dir), "runner.temp": str(runner_temp)}

    def evaluate(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            expr = m.group(1)
            if expr.startswith("inputs."):
                return values[expr[len("inputs."):]]
            if expr == "github.token":
                return env.get("GITHUB_TOKEN_FOR_HARNESS", "")
            sm = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
            if sm:
                return steps.get(sm.group(1), {}).get(sm.group(2), "")
            if expr in context:
                return context[expr]
            raise AssertionError(f"the harness does not evaluate ${{{{ {expr} }}}}")
        return _EXPR.sub(one, text)

    values = {k: evaluate(v) for k, v in values.items()}
    logs: list[str] = []
    runner_temp.mkdir(parents=True, exist_ok=True)
    for index, step in enumerate(action["runs"]["steps"]):
        assert "uses" not in step, "the harness runs only `run` steps"
        assert step.get("shell") == "bash", "every step must say shell: bash"
        assert "if" not in step, "the harness does not evaluate `if:`"
        output_file = runner_temp / f"output-{index}"
        output_file.write_text("")
        script = runner_temp / f"step-{index}.sh"
        script.write_text(evaluate(step["run"]))
        step_env = {**env, "GITHUB_ACTION_PATH": str(action_dir), "GITHUB_OUTPUT": str(output_file),
                    "RUNNER_TEMP": str(runner_temp), "GITHUB_WORKSPACE": str(workspace)}
        step_env.pop("GITHUB_TOKEN_FOR_HARNESS", None)
        step_env.update({k: evaluate(str(v)) for k, v in (step.get("env") or {}).items()})
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workspace,
                              env=step_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)
        logs.append(f"##[group]Run {step.get('name', index)}\n{proc.stdout}##[endgroup]\n")
        if step.get("id"):
            steps[step["id"]] = parse_output_file(output_file.read_text())
        if proc.returncode != 0:
            break
    # Like the runner, the action's outputs are evaluated also when a step failed.
    outputs = {name: evaluate(spec["value"]) for name, spec in (action.get("outputs") or {}).items()}
    return ActionRun(proc.returncode, "".join(logs), outputs, steps)


def base_env(fake: FakeGitHub, *, workspace: Path, event_path: Path, summary: Path, token: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_CERT", "PIP_FIND_LINKS")}
    return {**keep, "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "pull_request",
            "GITHUB_EVENT_PATH": str(event_path), "GITHUB_REPOSITORY": fake.repo, "GITHUB_API_URL": fake.url,
            "GITHUB_SERVER_URL": "https://github.com", "GITHUB_SHA": "0" * 40, "GITHUB_RUN_ID": "4242",
            "GITHUB_WORKSPACE": str(workspace), "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_TOKEN_FOR_HARNESS": token}
