"""GitHub outputs, all derived from the JSON report: workflow-command annotations on the kernels'
source lines, the markdown job summary, and one sticky pull-request comment kept up to date through
the REST API.

Runs on the host, never inside the container that ran the kernels: it is the only part of kgate that
holds the token, and it never prints it (error messages carry the URL, the status and GitHub's
message, never a header).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgate.gates.base import ERROR, FAIL, GateResult
from kgate.report import KernelResult, Report

# GitHub shows at most 10 error and 10 warning annotations per step (and 50 per job); the rest are
# dropped silently, so kgate summarises what does not fit in the last one of each kind.
MAX_ANNOTATIONS_PER_LEVEL = 10
# A step summary may hold 1 MiB; a comment body 65,536 characters.
MAX_SUMMARY_CHARS = 1_000_000
MAX_COMMENT_CHARS = 65_000
FAIL_ON = ("violation", "broken", "never")
MARKER_PREFIX = "<!-- kgate-report"
API_VERSION = "2022-11-28"


# --------------------------------------------------------------------------------------------------
# Workflow commands (annotations).


def escape_data(text: str) -> str:
    """The message part of a workflow command: `%`, CR and LF are escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (file=, title=, ...): also `:` and `,`, which would end the value."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


# C0 and C1 controls but tab and newline (ESC starts ANSI sequences; CR rewrites a line in a log viewer), and
# the Unicode controls that reorder or hide text on screen.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
# A line that starts with `::` (after blanks) is a workflow command in a GitHub Actions log; `##[` anywhere
# is the older form.
_COMMAND_START = re.compile(r"^(\s*)::", re.MULTILINE)


def plain(text: str) -> str:
    """Text that came from a kernel (its messages, exceptions, log tails), made safe to print in a terminal
    or a CI log: control characters are shown as \\xNN instead of acting (no ANSI colours, cursor moves or
    carriage returns), and no line can start a workflow command (`::error`, `::add-mask::`, `::stop-commands::`
    ...): its `::` is written as escape_property writes it in a command's properties, `%3A%3A`, and `##[` as
    `##%5B`. Newlines and tabs stay."""
    text = _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                         else f"\\u{ord(m.group()):04x}", text)
    return _COMMAND_START.sub(lambda m: m.group(1) + escape_property("::"), text).replace("##[", "##%5B")


def workflow_command(level: str, message: str, **properties: Any) -> str:
    props = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items()
                     if value is not None and value != "")
    return f"::{level}{' ' + props if props else ''}::{escape_data(message)}"


@dataclass
class Finding:
    """One violated gate of one kernel, as every GitHub output shows it."""

    kernel: KernelResult
    gate: GateResult

    @property
    def broken(self) -> bool:
        return bool(self.gate.broken)

    def one_line(self) -> str:
        return " ".join(self.gate.message.split())

    def detail_lines(self) -> list[str]:
        g = self.gate
        lines = [f"{label}: {value}" for label, value in (("expected", g.expected), ("got", g.got),
                                                           ("where", g.where)) if value]
        if g.case:
            lines.append("case: " + ", ".join(f"{k}={v}" for k, v in g.case.items()))
        if g.repro:
            lines.append(f"reproduce: {g.repro}")
        return lines


def findings(report: Report) -> list[Finding]:
    return [Finding(k, g) for k in report.kernels for g in k.gates if g.verdict in (FAIL, ERROR)]


def fails_job(finding: Finding, fail_on: str) -> bool:
    return fail_on == "violation" or (fail_on == "broken" and finding.broken)


def relative_path(path: str | None, workspace: Path) -> str | None:
    """A path as GitHub wants it in annotations: relative to the repository root."""
    if not path:
        return None
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.resolve().relative_to(workspace.resolve()).as_posix()
    except ValueError:
        return None


def annotations(report: Report, *, fail_on: str, workspace: Path,
                limit: int = MAX_ANNOTATIONS_PER_LEVEL) -> list[str]:
    """`::error`/`::warning` lines: an error where the finding fails the job under `fail_on`, a
    warning otherwise; at most `limit` of each level, the last one summarising the others."""
    by_level: dict[str, list[Finding]] = {"error": [], "warning": []}
    for f in findings(report):
        by_level["error" if fails_job(f, fail_on) else "warning"].append(f)
    manifest_file = relative_path(str(Path(report.manifest).resolve()) if report.manifest else None, workspace)
    lines: list[str] = []
    for level, items in by_level.items():
        shown = items if len(items) <= limit else items[: limit - 1]
        for f in shown:
            file = relative_path(f.kernel.source_file, workspace)
            line = f.kernel.source_line
            if file is None:  # kernel outside the repository (an installed module): point at the manifest
                file, line = manifest_file, f.kernel.manifest_line
            kind = "broken" if f.broken else "violation"
            message = "\n".join([f"{f.kernel.name}: {f.one_line()}", *f.detail_lines()])
            lines.append(workflow_command(level, message, file=file, line=line,
                                          title=f"kgate/{f.gate.gate} ({kind}): {f.kernel.name}"))
        rest = items[len(shown):]
        if rest:
            names = ", ".join(f"{f.kernel.name}/{f.gate.gate}" for f in rest)
            lines.append(workflow_command(
                level, f"{len(rest)} more finding(s) not annotated (GitHub shows {limit} {level}s per step): "
                f"{names}. The job summary lists them all.", title=f"kgate: {len(rest)} more"))
    return lines


# --------------------------------------------------------------------------------------------------
# Markdown (job summary and PR comment).


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def _code(text: str) -> str:
    """Inline code, whatever backticks the text holds: GitHub renders nothing inside (no links, images,
    headings, HTML or @mentions), so text a kernel wrote (its exception, its output) stays text."""
    text = " ".join(str(text).split())
    ticks = "`" * (_longest_backticks(text) + 1)
    return f"{ticks} {text} {ticks}" if len(ticks) > 1 else f"`{text}`"


def _fenced(text: str, info: str = "text") -> list[str]:
    """A code block that text with backtick fences of its own cannot end early."""
    fence = "`" * max(3, _longest_backticks(text) + 1)
    return [fence + info, text, fence]


def verdict_of(report: Report | None, run_exit_code: int | None) -> str:
    """pass | violation | broken | error (nothing judged)."""
    if report is None or (run_exit_code is not None and run_exit_code >= 2):
        return "error"
    found = findings(report)
    if not found:
        return "pass"
    return "broken" if any(f.broken for f in found) else "violation"


def headline(report: Report) -> str:
    counts = report.counts()
    total = len(report.kernels)
    broken = sum(k.broken for k in report.kernels)
    if total == 0:
        return "no kernel was selected (nothing the change touches is in the manifest)"
    bad = counts[FAIL] + counts[ERROR]
    if bad == 0:
        return f"all {total} kernel(s) passed every gate"
    return f"{bad} of {total} kernel(s) violate gates ({broken} broken)"


def _kernel_table(report: Report, *, only_violations: bool = False, limit: int = 500) -> list[str]:
    rows = ["| kernel | verdict | violated gates |", "|---|---|---|"]
    kernels = [k for k in report.kernels if k.violated or not only_violations]
    for k in kernels[:limit]:
        violated = ", ".join(f"`{g.gate}`" for g in k.violated) or "none"
        verdict = {"pass": "pass", "fail": "**FAIL**", "error": "**ERROR**"}[k.verdict]
        if k.broken:
            verdict += " (broken)"
        rows.append(f"| {_cell(k.name)} | {verdict} | {violated} |")
    if len(kernels) > limit:
        rows.append(f"| _{len(kernels) - limit} more_ | | |")
    return rows


def _finding_block(f: Finding, workspace: Path, link_base: str | None) -> list[str]:
    kind = "broken" if f.broken else "violation"
    out = [f"- **`{f.gate.gate}`** ({kind}): {_code(f.one_line())}"]
    file = relative_path(f.kernel.source_file, workspace)
    if file:
        where = f"{file}:{f.kernel.source_line}" if f.kernel.source_line else file
        if link_base:
            anchor = f"#L{f.kernel.source_line}" if f.kernel.source_line else ""
            out.append(f"  - kernel: [{where}]({link_base}/{urllib.parse.quote(file)}{anchor})")
        else:
            out.append(f"  - kernel: `{where}`")
    details = [line for line in f.detail_lines() if not line.startswith("reproduce:")]
    for line in details:
        label, _, value = line.partition(": ")
        out.append(f"  - {label}: {_code(value)}")
    if f.gate.repro:
        out.append(f"  - reproduce: {_code(f.gate.repro)}")
    return out


def _violations(report: Report, workspace: Path, link_base: str | None, budget: int) -> list[str]:
    lines: list[str] = []
    size = 0
    items = findings(report)
    by_kernel: dict[str, list[Finding]] = {}
    for f in items:
        by_kernel.setdefault(f.kernel.name, []).append(f)
    shown = 0
    for name, group in by_kernel.items():
        block = [f"#### {name}", ""]
        for f in group:
            block += _finding_block(f, workspace, link_base)
        block.append("")
        chunk = sum(len(x) + 1 for x in block)
        if size + chunk > budget:
            lines.append(f"_{len(items) - shown} more finding(s) left out to fit GitHub's size limit; "
                         "the JUnit XML and the JSON report have them all._")
            break
        lines += block
        size += chunk
        shown += len(group)
    return lines


def summary_markdown(report: Report | None, *, fail_on: str, workspace: Path, run_exit_code: int | None = None,
                     run_log: str | None = None, link_base: str | None = None, notes: list[str] | None = None) -> str:
    lines = ["## kgate", ""]
    verdict = verdict_of(report, run_exit_code)
    if verdict == "error" or report is None:
        lines += ["**kgate could not judge the kernels** (exit code "
                  f"{run_exit_code if run_exit_code is not None else '?'}: a usage, manifest or infrastructure "
                  "error). Nothing was judged.", ""]
        if run_log:
            lines += [*_fenced(run_log.strip()[-4000:]), ""]
    else:
        icon = {"pass": "✅", "violation": "❌", "broken": "❌"}[verdict]
        lines += [f"{icon} **{headline(report)}** — manifest `{report.manifest}`, fail-on `{fail_on}`", ""]
        if report.kernels:
            lines += _kernel_table(report) + [""]
        if findings(report):
            lines += ["### Violations", ""]
            used = sum(len(x) + 1 for x in lines)
            lines += _violations(report, workspace, link_base, MAX_SUMMARY_CHARS - used - 20_000)
        env = report.environment or {}
        facts = [f"kgate {report.kgate_version}"] + [f"{k} {env[k]}" for k in ("torch", "gpu", "cuda", "sandbox")
                                                     if env.get(k)]
        if str(env.get("sandbox", "")).startswith("none"):
            lines += [f"> ⚠️ **Workers ran without a sandbox**: {env['sandbox']}. The kernels could reach each "
                      "other and this report; see the README's Isolation section.", ""]
        lines += [f"<sub>{' · '.join(facts)}</sub>", ""]
    for note in notes or []:
        lines += [f"> {note}", ""]
    return "\n".join(lines)


def marker(key: str) -> str:
    return f"{MARKER_PREFIX} {key} -->"


def comment_markdown(report: Report | None, *, key: str, fail_on: str, workspace: Path,
                     run_exit_code: int | None = None, link_base: str | None = None,
                     run_url: str | None = None) -> str:
    """The sticky comment: the hidden marker first, then the violated gates per kernel with their
    one-line findings and reproducers."""
    lines = [marker(key), "### kgate"]
    verdict = verdict_of(report, run_exit_code)
    if verdict == "error" or report is None:
        lines += ["", "⚠️ **kgate could not judge the kernels** (a usage, manifest or infrastructure error): "
                  "see the job log."]
    else:
        icon = "✅" if verdict == "pass" else "❌"
        lines += ["", f"{icon} **{headline(report)}** (manifest `{report.manifest}`)"]
        if findings(report):
            lines += [""] + _kernel_table(report, only_violations=True, limit=100) + [
                "", "<details open><summary>Findings and reproducers"
                                                     "</summary>", ""]
            used = sum(len(x) + 1 for x in lines)
            lines += _violations(report, workspace, link_base, MAX_COMMENT_CHARS - used - 1_000)
            lines += ["</details>"]
    footer = "Updated on every push by kgate"
    if run_url:
        footer += f" · [job log and summary]({run_url})"
    lines += ["", f"<sub>{footer}.</sub>", ""]
    text = "\n".join(lines)
    return text if len(text) <= MAX_COMMENT_CHARS else text[:MAX_COMMENT_CHARS] + "\n\n_(cut to fit)_\n"


# --------------------------------------------------------------------------------------------------
# The sticky comment through the REST API.


class GitHubAPIError(Exception):
    def __init__(self, status: int | None, url: str, message: str):
        self.status = status
        super().__init__(f"{'HTTP ' + str(status) if status else 'request failed'} on {url}: {message}")


@dataclass
class GitHubClient:
    api_url: str
    token: str = field(repr=False)
    timeout: float = 30.0

    def request(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[Any, dict[str, str]]:
        if not url.startswith(("http://", "https://")):
            url = self.api_url.rstrip("/") + url
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Accept": "application/vnd.github+json", "Authorization": f"Bearer {self.token}",
            "X-GitHub-Api-Version": API_VERSION, "User-Agent": "kgate",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - the API URL
                payload = resp.read()
                headers = {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            raise GitHubAPIError(exc.code, url, _api_message(exc)) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise GitHubAPIError(None, url, str(getattr(exc, "reason", exc))) from None
        return (json.loads(payload) if payload.strip() else None), headers

    def paginate(self, url: str) -> list[Any]:
        items: list[Any] = []
        next_url: str | None = url
        for _ in range(100):  # 10,000 comments at 100 a page: far past any real PR
            if next_url is None:
                break
            page, headers = self.request("GET", next_url)
            items += page or []
            next_url = _next_link(headers.get("link", ""))
        return items


def _api_message(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read() or b"{}")
        return str(data.get("message") or exc.reason)
    except (ValueError, OSError):
        return str(exc.reason)


def _next_link(link_header: str) -> str | None:
    for part in link_header.split(","):
        match = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', part)
        if match:
            return match.group(1)
    return None


def upsert_comment(client: GitHubClient, repo: str, number: int, body: str, key: str, *,
                   create: bool = True) -> tuple[str, int | None]:
    """Update the comment that carries this key's marker, or create it. Returns (action, id):
    action is 'created', 'updated' or 'skipped'."""
    comments = client.paginate(f"/repos/{repo}/issues/{number}/comments?per_page=100")
    mark = marker(key)
    existing = [c for c in comments if isinstance(c, dict) and mark in str(c.get("body", ""))]
    if existing:
        comment_id = existing[0]["id"]
        client.request("PATCH", f"/repos/{repo}/issues/comments/{comment_id}", {"body": body})
        return "updated", comment_id
    if not create:
        return "skipped", None
    created, _ = client.request("POST", f"/repos/{repo}/issues/{number}/comments", {"body": body})
    return "created", (created or {}).get("id")


def pull_request_number(event: dict[str, Any]) -> int | None:
    """The PR of a pull_request / pull_request_target event (or an issue_comment on a PR)."""
    pr = event.get("pull_request")
    if isinstance(pr, dict) and isinstance(pr.get("number"), int):
        return pr["number"]
    issue = event.get("issue")
    if isinstance(issue, dict) and "pull_request" in issue and isinstance(issue.get("number"), int):
        return issue["number"]
    number = event.get("number")
    return number if isinstance(number, int) and "pull_request" in event else None


def read_event(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_outputs(values: dict[str, str], path: str | None) -> None:
    """Step outputs for $GITHUB_OUTPUT, in the multi-line-safe heredoc form."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        for name, value in values.items():
            delimiter = f"kgate_{os.urandom(8).hex()}"
            f.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
