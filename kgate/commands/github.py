"""`kgate github`: turn a JSON report into GitHub's outputs on the host, after the kernels ran.

Prints the annotations (workflow commands), appends the job summary to $GITHUB_STEP_SUMMARY, creates
or updates the sticky PR comment, writes the step outputs (verdict, violated-gates, report, junit) to
$GITHUB_OUTPUT, and exits by `--fail-on`. This is the Action's last step; it is the only one that
sees the token.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kgate.commands import comment
from kgate.errors import UsageError
from kgate.report import Report
from kgate.reports import github as gh


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "github", help="annotations, job summary, PR comment and step outputs from a JSON report",
        description="Report REPORT (written by `kgate run`) to GitHub: ::error/::warning annotations on the "
        "kernels' source lines, a markdown job summary in $GITHUB_STEP_SUMMARY, one sticky PR comment "
        "(with --comment; token from GITHUB_TOKEN) and the step outputs verdict, violated-gates, report and "
        "junit in $GITHUB_OUTPUT. Exit 1 when a finding fails the job under --fail-on, 2 when the run "
        "judged nothing (--run-exit-code 2 or no report), else 0.")
    p.add_argument("report", nargs="?", default="kgate-out/report.json", help="the JSON report (kgate run --json)")
    comment.add_comment_options(p)
    p.add_argument("--comment", action=argparse.BooleanOptionalAction, default=False,
                   help="create or update the sticky PR comment (default: no)")
    p.add_argument("--run-exit-code", type=int, metavar="N",
                   help="exit code of the `kgate run` that wrote REPORT; 2 means nothing was judged")
    p.add_argument("--run-log", metavar="PATH", help="that run's error output, quoted in the summary on exit 2")
    p.add_argument("--junit", metavar="PATH", default="", help="the JUnit XML path, passed on as the junit output")
    p.add_argument("--summary", metavar="PATH", help="write the summary here (default: $GITHUB_STEP_SUMMARY)")
    p.set_defaults(func=main)


def exit_code_for(verdict: str, fail_on: str) -> int:
    if verdict == "error":
        return 2  # nothing was judged: that is never a pass, whatever fail-on says
    if fail_on == "never" or verdict == "pass":
        return 0
    if fail_on == "broken":
        return 1 if verdict == "broken" else 0
    return 1


def _read_log(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def main(args: argparse.Namespace) -> int:
    workspace = Path(args.workspace or os.environ.get("GITHUB_WORKSPACE") or ".")
    report: Report | None = None
    if args.run_exit_code is None or args.run_exit_code < 2:
        if args.run_exit_code is None and not Path(args.report).exists():
            raise UsageError(f"{args.report}: report not found; run `kgate run --json {args.report}` first, or pass "
                             "--run-exit-code to report a run that judged nothing")
        if Path(args.report).exists():
            report = Report.read(args.report)
    notes: list[str] = []
    if report is not None and args.run_exit_code is not None and report.exit_code != args.run_exit_code:
        # A report that says otherwise than the run that wrote it was changed after it (a process the code under
        # judgment left behind, where workers ran unsandboxed) or comes from another run: none of it is trusted.
        said = (f"{args.report} says exit {report.exit_code} ({gh.headline(report)}) but the run that wrote it "
                f"exited {args.run_exit_code}: the report was changed after the run or belongs to another run; "
                "nothing in it is used")
        print(gh.workflow_command("error", said, title="kgate: report contradicts the run"))
        notes.append(f"❌ {said}")
        report = None
    verdict = gh.verdict_of(report, args.run_exit_code)
    key = args.comment_key or (report.manifest if report else "kgate")

    if report is not None:
        for line in gh.annotations(report, fail_on=args.fail_on, workspace=workspace):
            print(line)
    elif not notes:
        print(gh.workflow_command("error", "kgate could not judge the kernels (usage, manifest or infrastructure "
                                  "error): see the log of the gating step", title="kgate: nothing judged"))

    if args.comment:
        outcome = comment.post(report, key=key, fail_on=args.fail_on, workspace=workspace,
                               run_exit_code=args.run_exit_code)
        if outcome.ok:
            print(f"kgate: {outcome.note}")
        else:
            print(gh.workflow_command("warning", outcome.note, title="kgate: PR comment"))
            notes.append(f"⚠️ {outcome.note}")

    ctx = comment.github_context(str(workspace))
    summary = gh.summary_markdown(report, fail_on=args.fail_on, workspace=workspace, run_exit_code=args.run_exit_code,
                                  run_log=_read_log(args.run_log), link_base=ctx["link_base"], notes=notes)
    summary_path = args.summary or os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a", encoding="utf-8") as f:
            f.write(summary + "\n")
    else:
        sys.stdout.write(summary + "\n")

    gh.write_outputs({
        "verdict": verdict,
        "violated-gates": ",".join(report.violated_gates()) if report else "",
        "report": str(Path(args.report).resolve()) if report else "",
        "junit": args.junit,
    }, os.environ.get("GITHUB_OUTPUT"))
    code = exit_code_for(verdict, args.fail_on)
    print(f"kgate: verdict {verdict}, fail-on {args.fail_on}: exit {code}")
    return code
