"""GitHub outputs from a report: escaping and per-step limits of annotations, the summary and the
comment's markdown, the sticky comment through a fake REST API (pagination, update in place,
read-only tokens), step outputs and exit codes by fail-on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kgate.cli import main as kgate_main
from kgate.commands.github import exit_code_for
from kgate.gates.base import GateResult
from kgate.report import KernelResult, Report
from kgate.reports import github as gh
from tests.github_support import FakeGitHub, parse_output_file

TOKEN = "ghs_unitTestToken_abcdef0123456789"


def _gate(name: str, verdict: str, message: str = "ok", broken: bool = False, **extra) -> GateResult:
    return GateResult(name, verdict, message, tolerance_free=broken, broken=broken, **extra)


def _report(workspace: Path, n_bad: int = 2, broken: bool = True) -> Report:
    kernels = [KernelResult("good", "k.py:good", "k.py:ref", "cpu", [_gate("contract", "pass")],
                            source_file=str(workspace / "k.py"), source_line=3)]
    for i in range(n_bad):
        kernels.append(KernelResult(
            f"bad-{i}", f"k.py:bad{i}", "k.py:ref", "cpu",
            [_gate("contract", "pass"),
             _gate("special_values", "fail", f"out[0]: NaN expected, 0.0 got; 50% of, rows: {i}\nsecond line",
                   broken=broken, expected="NaN", got="0.0", where="out[0]", case={"shape": [1, 8], "seed": 0},
                   repro=f"kgate run kgate.yaml -k bad-{i} --gate special_values")],
            source_file=str(workspace / "sub dir" / "k.py"), source_line=10 + i, manifest_line=5))
    return Report(manifest="kgate.yaml", kernels=kernels)


def test_escaping_follows_githubs_rules():
    assert gh.escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert gh.escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    line = gh.workflow_command("error", "x: y, z\nw", file="a,b.py", line=3, title="kgate/oracle: k")
    assert line == "::error file=a%2Cb.py,line=3,title=kgate/oracle%3A k::x: y, z%0Aw"


def test_annotations_point_at_the_kernels_lines_relative_to_the_repository(tmp_path):
    lines = gh.annotations(_report(tmp_path), fail_on="violation", workspace=tmp_path)
    assert len(lines) == 2
    assert lines[0].startswith("::error file=sub dir/k.py,line=10,title=kgate/special_values (broken)%3A bad-0::")
    assert "%0Areproduce: kgate run kgate.yaml -k bad-0 --gate special_values" in lines[0]
    assert "\n" not in lines[0]
    # A finding that does not fail the job under fail-on is a warning, not an error.
    soft = gh.annotations(_report(tmp_path, broken=False), fail_on="broken", workspace=tmp_path)
    assert all(line.startswith("::warning ") for line in soft)


def test_annotations_respect_the_per_step_limit_and_summarise_the_rest(tmp_path):
    lines = gh.annotations(_report(tmp_path, n_bad=14), fail_on="violation", workspace=tmp_path)
    assert len(lines) == gh.MAX_ANNOTATIONS_PER_LEVEL
    assert lines[-1].startswith("::error title=kgate%3A 5 more::5 more finding(s) not annotated")
    assert "bad-13/special_values" in lines[-1]


def test_kernel_outside_the_workspace_is_annotated_on_the_manifest(tmp_path, monkeypatch):
    report = _report(tmp_path / "elsewhere", n_bad=1)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "kgate.yaml").write_text("version: 1\n")
    monkeypatch.chdir(tmp_path / "ws")
    lines = gh.annotations(report, fail_on="violation", workspace=tmp_path / "ws")
    assert lines[0].startswith("::error file=kgate.yaml,line=5,")


def test_summary_and_comment_markdown(tmp_path):
    report = _report(tmp_path)
    summary = gh.summary_markdown(report, fail_on="violation", workspace=tmp_path,
                                  link_base="https://github.com/o/r/blob/abc")
    assert "❌ **2 of 3 kernel(s) violate gates (2 broken)**" in summary
    assert "| bad-1 | **FAIL** (broken) | `special_values` |" in summary
    assert "[sub dir/k.py:11](https://github.com/o/r/blob/abc/sub%20dir/k.py#L11)" in summary
    assert "  - reproduce: `kgate run kgate.yaml -k bad-1 --gate special_values`" in summary
    assert "50% of, rows: 1 second line" in summary  # one line per finding
    body = gh.comment_markdown(report, key="kgate.yaml", fail_on="violation", workspace=tmp_path)
    assert body.splitlines()[0] == "<!-- kgate-report kgate.yaml -->"
    passing = gh.comment_markdown(_report(tmp_path, n_bad=0), key="k", fail_on="violation", workspace=tmp_path)
    assert "✅ **all 1 kernel(s) passed every gate**" in passing
    nothing = gh.summary_markdown(None, fail_on="never", workspace=tmp_path, run_exit_code=2,
                                  run_log="kgate.yaml:3: error: unknown key")
    assert "could not judge" in nothing and "unknown key" in nothing


def test_what_a_kernel_wrote_stays_text_in_the_summary_and_the_comment(tmp_path):
    """A kernel's exception lands in its finding: markdown there (a heading, a link, an image, an
    @mention, HTML, a fence that ends the log's) must render as text, not as the bot's own markup."""
    hostile = "oops ``` </details>\n# Injected heading\n![pixel](https://x.example/p.png) [click](https://x.example) @someone"
    kernel = KernelResult("evil", "k.py:evil", "k.py:ref", "cpu",
                          [_gate("contract", "error", hostile, broken=True, got=hostile)],
                          source_file=str(tmp_path / "k.py"), source_line=1)
    report = Report(manifest="kgate.yaml", kernels=[kernel])
    for text in (gh.summary_markdown(report, fail_on="violation", workspace=tmp_path),
                 gh.comment_markdown(report, key="k", fail_on="violation", workspace=tmp_path)):
        lines = text.splitlines()
        assert not any(line.startswith("# Injected") for line in lines)
        finding = next(line for line in lines if "oops" in line)
        # the whole text inside one code span, delimited by more backticks than it holds
        assert "```` oops ``` </details> # Injected heading ![pixel](https://x.example/p.png) [click](https://x.example) " \
               "@someone ````" in finding, finding
        got = next(line for line in lines if line.strip().startswith("- got:"))
        assert got.strip().startswith("- got: ```` oops") and got.endswith("````")
    log = gh.summary_markdown(None, fail_on="never", workspace=tmp_path, run_exit_code=2,
                              run_log="error\n```\n# Injected heading")
    fence = next(line for line in log.splitlines() if line.startswith("```"))
    assert fence == "````text" and "\n# Injected heading\n````" in log


def test_big_reports_fit_githubs_size_limits(tmp_path):
    report = _report(tmp_path, n_bad=3000)
    body = gh.comment_markdown(report, key="k", fail_on="violation", workspace=tmp_path)
    assert len(body) <= gh.MAX_COMMENT_CHARS + 100
    assert "more finding(s) left out to fit GitHub's size limit" in body and "| _2900 more_ | | |" in body
    assert "(cut to fit)" not in body


@pytest.mark.parametrize(("verdict", "fail_on", "code"), [
    ("pass", "violation", 0), ("violation", "violation", 1), ("broken", "violation", 1),
    ("violation", "broken", 0), ("broken", "broken", 1), ("broken", "never", 0), ("error", "never", 2),
])
def test_exit_code_by_fail_on(verdict, fail_on, code):
    assert exit_code_for(verdict, fail_on) == code


def test_pull_request_number_from_events():
    assert gh.pull_request_number({"pull_request": {"number": 5}}) == 5
    assert gh.pull_request_number({"issue": {"number": 6, "pull_request": {}}}) == 6
    assert gh.pull_request_number({"ref": "refs/heads/main"}) is None


def test_next_link_header():
    header = '<https://api.github.com/x?page=2>; rel="next", <https://api.github.com/x?page=9>; rel="last"'
    assert gh._next_link(header) == "https://api.github.com/x?page=2"
    assert gh._next_link('<https://api.github.com/x?page=1>; rel="prev"') is None


def test_upsert_pages_through_comments_and_updates_in_place():
    with FakeGitHub(token=TOKEN) as fake:
        fake.seed(3, 250)
        client = gh.GitHubClient(fake.url, TOKEN)
        assert gh.upsert_comment(client, fake.repo, 3, gh.marker("k") + "\none", "k")[0] == "created"
        assert gh.upsert_comment(client, fake.repo, 3, gh.marker("k") + "\ntwo", "k")[0] == "updated"
        assert gh.upsert_comment(client, fake.repo, 3, gh.marker("other") + "\nx", "other")[0] == "created"
        assert len(fake.sticky(3)) == 2 and fake.sticky(3)[0]["body"].endswith("two")
        assert {r.path.split("page=")[-1] for r in fake.requests if r.method == "GET"} >= {"2", "3"}
        # a clean pass does not open a comment, but updates an existing one
        assert gh.upsert_comment(client, fake.repo, 4, "x", "k", create=False) == ("skipped", None)


def _env(monkeypatch, fake: FakeGitHub, tmp_path: Path, token: str = TOKEN) -> Path:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 9, "head": {"sha": "f" * 40}}}))
    for k, v in {"GITHUB_TOKEN": token, "GITHUB_REPOSITORY": fake.repo, "GITHUB_API_URL": fake.url,
                 "GITHUB_EVENT_PATH": str(event), "GITHUB_WORKSPACE": str(tmp_path),
                 "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GITHUB_OUTPUT": str(tmp_path / "out.txt"),
                 "GITHUB_RUN_ID": "1"}.items():
        monkeypatch.setenv(k, v)
    report_path = tmp_path / "report.json"
    _report(tmp_path).write(report_path)
    return report_path


def test_kgate_github_writes_everything_and_exits_by_fail_on(monkeypatch, tmp_path, capsys):
    with FakeGitHub(token=TOKEN) as fake:
        report = _env(monkeypatch, fake, tmp_path)
        assert kgate_main(["github", str(report), "--comment", "--junit", "j.xml"]) == 1
        assert kgate_main(["github", str(report), "--comment", "--fail-on", "never"]) == 0
    out = capsys.readouterr().out
    assert out.count("::error file=sub dir/k.py") == 2 and "PR comment created on #9" in out
    assert "PR comment updated on #9" in out
    outputs = parse_output_file((tmp_path / "out.txt").read_text())
    assert outputs["verdict"] == "broken" and outputs["violated-gates"] == "special_values"
    assert outputs["report"] == str(report)
    assert (tmp_path / "summary.md").read_text().count("## kgate") == 2
    assert len(fake.sticky(9)) == 1 and TOKEN not in out


def test_read_only_token_is_a_warning_and_the_token_is_never_printed(monkeypatch, tmp_path, capsys):
    with FakeGitHub(token=TOKEN, read_only=True) as fake:
        report = _env(monkeypatch, fake, tmp_path)
        assert kgate_main(["comment", str(report)]) == 0
        assert kgate_main(["github", str(report), "--comment", "--fail-on", "never"]) == 0
    captured = capsys.readouterr()
    assert "::warning title=kgate%3A PR comment::cannot post the PR comment (HTTP 403" in captured.out
    assert "no write access" in (tmp_path / "summary.md").read_text()
    assert TOKEN not in captured.out + captured.err + (tmp_path / "summary.md").read_text()


def test_bad_token_and_unreachable_api_do_not_leak_the_token(monkeypatch, tmp_path, capsys):
    with FakeGitHub(token="another") as fake:
        report = _env(monkeypatch, fake, tmp_path)
        assert kgate_main(["comment", str(report)]) == 0
    monkeypatch.setenv("GITHUB_API_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert kgate_main(["comment", str(report)]) == 0
    out = capsys.readouterr().out
    assert "HTTP 401" in out and "request failed" in out and TOKEN not in out


def test_github_without_a_report_or_run_is_a_usage_error(tmp_path, capsys):
    assert kgate_main(["github", str(tmp_path / "none.json")]) == 2
    assert "report not found" in capsys.readouterr().err
