"""Command line: parses arguments and dispatches to one module per verb under kgate/commands/."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from rich.console import Console
from rich.markup import escape

from kgate import __version__
from kgate.errors import KgateError, ManifestError
from kgate.reports.github import plain

# Each module defines add_parser(subparsers) and main(args) -> exit code.
COMMANDS = ("run", "gates", "schema", "github", "comment", "hook", "audit", "selftest", "calibrate", "repro")

EPILOG = """exit codes: 0 every kernel passed, 1 a violation or a kernel error, 2 a usage, manifest or
infrastructure error. `kgate COMMAND --help` explains each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kgate", description="Contract-grade correctness gates for GPU kernels, against a float64 oracle.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"kgate.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, bad usage exits 2
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if hasattr(args, "sandbox") and not getattr(args, "container", None):
            from kgate import sandbox

            sandbox.select(args.sandbox)  # probed once, before anything is judged: require fails here
        return int(args.func(args))
    except KgateError as exc:
        console = Console(stderr=True, highlight=False)
        if isinstance(exc, ManifestError):
            # each problem on lines of its own that start with file:line:col, as editors' and CI's problem
            # matchers read them
            console.print(f"[bold red]kgate:[/] {len(exc.problems)} problem(s) in the manifest", soft_wrap=True)
            console.print(escape(plain(exc.first())), markup=True, soft_wrap=True)
        else:  # (an error's text can quote a kernel's output)
            console.print(f"[bold red]kgate:[/] {escape(plain(str(exc)))}", markup=True, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kgate: interrupted; results so far are in the output folder's results.jsonl", file=sys.stderr)
        return 2


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def entry() -> int:
    """The `kgate` console script and `python -m kgate`: main() with SIGTERM (a cancelled CI job, a
    killed slice) handled like Ctrl-C, so the workers, each in a process session of its own, are killed with
    kgate instead of running on, and what was judged is kept."""
    signal.signal(signal.SIGTERM, _terminated)
    return main()


if __name__ == "__main__":
    raise SystemExit(entry())
