"""`kgate selftest`: run the catalogue of positive controls and check every verdict.

The catalogue (`gates/kgate.yaml` in the source tree, `kgate/catalogue/` in an installed kgate: the
wheel carries it there) lists, for every gate, kernels that violate it
and kernels that are correct, each with `expect: {gate: verdict}`. A control is as expected when every
gate it lists got exactly that verdict and every other gate that ran passed or skipped. Controls with
`device: cuda` are skipped (and not counted) when the run is on the CPU. Exit 0 only when every control
that ran is as expected.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kgate
from kgate import gates as registry
from kgate.commands import add_sandbox_option
from kgate.commands.run import make_console
from kgate.errors import UsageError
from kgate.manifest import ResolvedKernel, load
from kgate.report import KernelResult, Report, environment, now
from kgate.reports.github import plain
from kgate.runner import Events, Runner, RunOptions, resolve_device
from kgate.selection import matcher


def default_catalogue() -> Path:
    """The catalogue this kgate comes with: kgate/catalogue/ of an installed kgate (the wheel maps gates/
    there, see pyproject.toml), else gates/ of the source tree kgate runs from (a checkout, an editable
    install)."""
    package = Path(kgate.__file__).resolve().parent
    installed = package / "catalogue" / "kgate.yaml"
    return installed if installed.is_file() else package.parent / "gates" / "kgate.yaml"


DEFAULT_CATALOGUE = default_catalogue()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "selftest", help="run the catalogue of positive controls and check each gets its expected verdicts",
        description="Run every control kernel of the catalogue (default: the one this kgate comes with, "
        "gates/kgate.yaml of the source tree or kgate/catalogue/ of an installed kgate) "
        "through the real runner and compare its verdicts with its `expect:` entry: listed gates must get "
        "exactly the listed verdict, every other gate that runs must pass or skip. Controls marked "
        "`device: cuda` are skipped on the CPU. Prints a table, then `selftest: N/M controls as expected`. "
        "Exit 0 only when all are as expected, 1 otherwise, 2 on a usage or catalogue error.")
    p.add_argument("--catalogue", metavar="PATH", default=None,
                   help=f"the catalogue manifest (default: {DEFAULT_CATALOGUE})")
    p.add_argument("--device", metavar="D", default="auto",
                   help="auto (default: cuda when available), cpu, cuda or cuda:N; every control runs there")
    p.add_argument("-k", dest="select", metavar="EXPR", help="only controls matching EXPR (like pytest -k)")
    p.add_argument("--jobs", "-j", type=int, default=2, metavar="N", help="controls judged at once (default 2)")
    p.add_argument("--out", metavar="DIR", default="kgate-out/selftest",
                   help="folder for the results, the JSON report and worker logs (default kgate-out/selftest)")
    p.add_argument("--sanitizer", action="store_true",
                   help="let the bounds gate run compute-sanitizer on GPU controls (slow; off by default here)")
    add_sandbox_option(p)
    p.set_defaults(func=main)


def judge(kernel: ResolvedKernel, result: KernelResult) -> list[str]:
    """What differs from the control's expectations (empty: as expected)."""
    expect = kernel.entry.expect or {}
    got = {g.gate: g for g in result.gates}
    problems = []
    for gate, verdict in expect.items():
        if gate not in got:
            problems.append(f"{gate}: expected {verdict}, but the gate did not run (not selected?)")
        elif got[gate].verdict != verdict:
            problems.append(f"{gate}: expected {verdict}, got {got[gate].verdict}: {got[gate].message}")
    for gate, g in got.items():
        if gate not in expect and g.verdict not in (registry.PASS, registry.SKIP):
            problems.append(f"{gate}: expected pass or skip, got {g.verdict}: {g.message}")
    return problems


def _verdicts(expect: dict[str, str]) -> str:
    return " ".join(f"{g}={v}" for g, v in expect.items()) or "all pass"


def _notable(result: KernelResult) -> str:
    """The verdicts other than pass/skip, which is what a control's expectations are about."""
    return " ".join(f"{g.gate}={g.verdict}" for g in result.gates if g.verdict not in ("pass", "skip")) or "all pass"


@contextmanager
def _environment(sanitizer: bool):
    """Workers inherit the environment: the sanitizer is off unless asked for."""
    saved = os.environ.get("KGATE_SANITIZER")
    if not sanitizer:
        os.environ["KGATE_SANITIZER"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("KGATE_SANITIZER", None)
        else:
            os.environ["KGATE_SANITIZER"] = saved


def main(args: argparse.Namespace) -> int:
    console = make_console()
    path = Path(args.catalogue) if args.catalogue else DEFAULT_CATALOGUE
    if not path.exists():
        raise UsageError(f"catalogue not found: {path}" if args.catalogue else
                         f"catalogue not found: this kgate ({Path(kgate.__file__).parent}) has neither "
                         "catalogue/kgate.yaml (an installed kgate) nor ../gates/kgate.yaml (a source tree); "
                         "reinstall kgate, or pass --catalogue PATH")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
        raise UsageError(f"--device {args.device}: use auto, cpu, cuda or cuda:N")
    manifest = load(path)
    device = resolve_device(args.device)
    kernels = manifest.kernels
    if args.select:
        keep = matcher(args.select, [k.name for k in kernels])
        kernels = [k for k in kernels if keep(k.name)]
        if not kernels:
            raise UsageError(f"-k {args.select!r} selects no control of {path}")
    missing = [k.name for k in kernels if not k.entry.expect]
    if missing:
        raise UsageError(f"{path}: control(s) without `expect:`: {', '.join(missing)}")
    skipped = [k for k in kernels if device == "cpu" and str(k.device).startswith("cuda")]
    run = [k for k in kernels if k not in skipped]
    started = time.perf_counter()
    options = RunOptions(device=device, jobs=args.jobs, out_dir=Path(args.out))
    report = Report(manifest=str(path), kernels=[], environment=environment())
    with _environment(args.sanitizer):
        report.kernels = Runner(manifest, run, options, events=_Progress(console)).run()
    report.finished = now()
    report.write(Path(args.out) / "report.json")
    return render(console, run, report.kernels, skipped, device, time.perf_counter() - started)


def render(console: Console, kernels: list[ResolvedKernel], results: list[KernelResult],
           skipped: list[ResolvedKernel], device: str, seconds: float) -> int:
    table = Table(title=f"kgate selftest ({device})", header_style="bold")
    table.add_column("control", no_wrap=True)
    table.add_column("expected")
    table.add_column("got")
    table.add_column("", no_wrap=True)
    failures: list[tuple[str, list[str]]] = []
    for kernel, result in zip(kernels, results):
        problems = judge(kernel, result)
        status = "[green]as expected[/]" if not problems else "[bold red]UNEXPECTED[/]"
        table.add_row(escape(kernel.name), escape(_verdicts(kernel.entry.expect or {})),
                      escape(_notable(result)), status)
        if problems:
            failures.append((kernel.name, problems))
    for kernel in skipped:
        table.add_row(escape(kernel.name), escape(_verdicts(kernel.entry.expect or {})), "",
                      f"[dim]skipped: needs {kernel.device}[/]")
    console.print(table)
    for name, problems in failures:
        for problem in problems:
            console.print(f"[bold red]UNEXPECTED[/] {escape(name)} / {escape(plain(problem))}", soft_wrap=True)
    good = len(results) - len(failures)
    if skipped:
        console.print(f"{len(skipped)} control(s) skipped: they need a CUDA device (run `kgate selftest "
                      "--device cuda` on a GPU machine)")
    console.print(f"({seconds:.1f}s)")
    console.print(f"selftest: {good}/{len(results)} controls as expected", markup=False, highlight=False)
    return 0 if results and good == len(results) else 1


class _Progress(Events):
    """One line per finished control (the table comes at the end)."""

    def __init__(self, console: Console):
        self.console = console

    def kernel_finished(self, result: KernelResult) -> None:
        self.console.print(f"[dim]ran {escape(result.name)} ({result.duration_s:.1f}s)[/]", highlight=False)
