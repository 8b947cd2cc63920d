"""`kgate comment`: create or update the one sticky PR comment from a JSON report.

The token comes from the environment (GITHUB_TOKEN), never from the command line, and is never
printed. A token that may not write (pull requests from forks get a read-only one) is a warning,
not a failure: the job summary and the annotations still carry the results.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from kgate.report import Report
from kgate.reports import github as gh


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "comment", help="create or update the sticky PR comment from a JSON report",
        description="Post the violated gates of REPORT as one pull-request comment, found again by a hidden "
        "marker and updated in place on every push (never a second comment). Reads GITHUB_TOKEN, "
        "GITHUB_REPOSITORY, GITHUB_EVENT_PATH and GITHUB_API_URL as GitHub Actions sets them. A token "
        "without write access gives a warning and exit 0.")
    p.add_argument("report", nargs="?", default="kgate-out/report.json", help="the JSON report (kgate run --json)")
    add_comment_options(p)
    p.add_argument("--pr", type=int, metavar="N", help="the pull request (default: from GITHUB_EVENT_PATH)")
    p.set_defaults(func=main)


def add_comment_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--comment-key", metavar="KEY",
                   help="what tells this job's comment from others' (default: the report's manifest path); "
                   "jobs with different keys keep separate comments")
    p.add_argument("--fail-on", choices=gh.FAIL_ON, default="violation",
                   help="which findings fail the job: violation (any), broken, never (default violation)")
    p.add_argument("--workspace", metavar="DIR",
                   help="the repository root that paths are shown relative to (default $GITHUB_WORKSPACE or .)")


@dataclass
class CommentOutcome:
    ok: bool
    note: str  # one line for the log and the job summary


def github_context(workspace: str | None) -> dict[str, str | None]:
    env = os.environ
    event = gh.read_event(env.get("GITHUB_EVENT_PATH"))
    repo = env.get("GITHUB_REPOSITORY")
    server = env.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
    head = (event.get("pull_request") or {}).get("head", {}).get("sha") if isinstance(
        event.get("pull_request"), dict) else None
    sha = head or env.get("GITHUB_SHA")
    run_id = env.get("GITHUB_RUN_ID")
    return {
        "repo": repo, "api": env.get("GITHUB_API_URL", "https://api.github.com"),
        "workspace": workspace or env.get("GITHUB_WORKSPACE") or os.getcwd(),
        "link_base": f"{server}/{repo}/blob/{sha}" if repo and sha else None,
        "run_url": f"{server}/{repo}/actions/runs/{run_id}" if repo and run_id else None,
        "pr": str(gh.pull_request_number(event) or "") or None,
    }


def post(report: Report | None, *, key: str, fail_on: str, workspace: Path, run_exit_code: int | None = None,
         pr: int | None = None) -> CommentOutcome:
    ctx = github_context(str(workspace))
    number = pr or (int(ctx["pr"]) if ctx["pr"] else None)
    if number is None:
        return CommentOutcome(True, "not a pull request event: no PR comment")
    if not ctx["repo"]:
        return CommentOutcome(False, "GITHUB_REPOSITORY is not set: cannot find the pull request to comment on")
    token = os.environ.get("GITHUB_TOKEN", "")
    if not token:
        return CommentOutcome(False, "no token (GITHUB_TOKEN is empty): the PR comment was not posted; "
                              "the results are in the job summary and the annotations")
    body = gh.comment_markdown(report, key=key, fail_on=fail_on, workspace=workspace, run_exit_code=run_exit_code,
                               link_base=ctx["link_base"], run_url=ctx["run_url"])
    client = gh.GitHubClient(str(ctx["api"]), token)
    # A clean pass opens no new comment; an existing one is updated so it never shows stale failures.
    create = gh.verdict_of(report, run_exit_code) != "pass"
    try:
        action, comment_id = gh.upsert_comment(client, str(ctx["repo"]), number, body, key, create=create)
    except gh.GitHubAPIError as exc:
        if exc.status in (401, 403, 404):
            return CommentOutcome(False, f"cannot post the PR comment ({exc}): the token has no write access to "
                                  "pull requests (as for PRs from forks, or without `permissions: "
                                  "pull-requests: write`); the results are in the job summary and the annotations")
        return CommentOutcome(False, f"cannot post the PR comment: {exc}; the results are in the job summary "
                              "and the annotations")
    if action == "skipped":
        return CommentOutcome(True, f"all kernels passed: no PR comment needed on #{number}")
    return CommentOutcome(True, f"PR comment {action} on #{number} (id {comment_id})")


def main(args: argparse.Namespace) -> int:
    report = Report.read(args.report)
    workspace = Path(args.workspace or os.environ.get("GITHUB_WORKSPACE") or ".")
    outcome = post(report, key=args.comment_key or report.manifest, fail_on=args.fail_on, workspace=workspace,
                   pr=args.pr)
    if outcome.ok:
        print(f"kgate: {outcome.note}")
    else:
        print(gh.workflow_command("warning", outcome.note, title="kgate: PR comment"))
    return 0
