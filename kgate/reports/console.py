"""Console output: rich progress while running, a kernel x gate table and the findings at the end."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kgate.gates.base import ERROR, FAIL, PASS, SKIP, GateResult
from kgate.manifest import ResolvedKernel
from kgate.report import KernelResult, Report
from kgate.reports.github import plain
from kgate.runner import Events

STYLE = {PASS: ("pass", "green"), FAIL: ("FAIL", "bold red"), ERROR: ("ERROR", "bold magenta"),
         SKIP: ("skip", "dim")}


class ProgressEvents(Events):
    """Progress over all (kernel, gate) pairs, showing which kernel and gate run now."""

    def __init__(self, console: Console, total: int):
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
        self.task = self.progress.add_task("kgate", total=total)
        self.console = console

    def __enter__(self) -> ProgressEvents:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def gate_started(self, kernel: ResolvedKernel, gate: str) -> None:
        self.progress.update(self.task, description=f"{escape(kernel.name)} · {gate}")

    def gate_finished(self, kernel: ResolvedKernel, result: GateResult) -> None:
        self.progress.advance(self.task)

    def kernel_finished(self, result: KernelResult) -> None:
        label, style = STYLE[result.verdict]
        again = " (judged again alone: see below)" if "judged_alone" in result.notes else ""
        self.console.print(f"[{style}]{label:>5}[/] {escape(result.name)} ({result.duration_s:.1f}s){again}")

    def kernel_held(self, kernel: ResolvedKernel, why: str) -> None:
        self.console.print(f"{'again':>5} {escape(kernel.name)}: {escape(why)}; judged again alone, with the whole "
                           "GPU, once the shared work is done", soft_wrap=True)


def table(report: Report, width: int | None = None) -> Table:
    """The kernel x gate table, each gate's name whole (a name copied from it is a valid `--gate`). Where a
    column per gate is wider than `width`, a row per kernel lists its gates' verdicts instead, wrapped between
    gates, never inside a name."""
    gates: list[str] = []
    for k in report.kernels:
        for g in k.gates:
            if g.gate not in gates:
                gates.append(g.gate)
    wide = Table(title="kgate verdicts", show_lines=False, header_style="bold")
    wide.add_column("kernel", no_wrap=True)
    for g in gates:
        wide.add_column(escape(g), justify="center", no_wrap=True, min_width=len(g))  # escape: oracle[backward]
    wide.add_column("verdict", justify="center", no_wrap=True)
    for k in report.kernels:
        by = {g.gate: g for g in k.gates}
        cells = [_label(by[g].verdict) if g in by else "" for g in gates]
        wide.add_row(escape(k.name), *cells, _verdict(k))
    if width is None or Console(width=10**6).measure(wide).maximum <= width:
        return wide
    narrow = Table(title="kgate verdicts", show_lines=False, header_style="bold")
    narrow.add_column("kernel", no_wrap=True)
    narrow.add_column("verdict", justify="center", no_wrap=True)
    narrow.add_column("gates")
    for k in report.kernels:
        narrow.add_row(escape(k.name), _verdict(k), "  ".join(f"{escape(g.gate)} {_label(g.verdict)}" for g in k.gates))
    return narrow


def _label(verdict: str) -> str:
    label, style = STYLE[verdict]
    return f"[{style}]{label}[/]"


def _verdict(k: KernelResult) -> str:
    label, style = STYLE[k.verdict]
    return f"[{style}]{label}{' broken' if k.broken else ''}[/]"


def findings(console: Console, report: Report) -> None:
    for k in report.kernels:
        for g in k.violated:
            label, style = STYLE[g.verdict]
            console.print(f"[{style}]{label}[/] [bold]{escape(k.name)}[/] / {escape(g.gate)}: "
                          f"{escape(plain(g.message))}")
            for name, value in (("expected", g.expected), ("got", g.got), ("where", g.where)):
                if value:
                    console.print(f"    {name}: {escape(plain(str(value)))}")
            if g.case:
                console.print("    case: " + escape(plain(", ".join(f"{a}={b}" for a, b in g.case.items()))))
            if g.repro:
                console.print(f"    reproduce: [cyan]{escape(plain(g.repro))}[/]")
            if g.verdict == ERROR and k.log:
                console.print(f"    worker log: {escape(k.log)}")


def summary_line(report: Report, seconds: float) -> str:
    c = report.counts()
    parts = []
    if c[PASS]:
        parts.append(f"[green]{c[PASS]} passed[/]")
    if c[FAIL]:
        parts.append(f"[red]{c[FAIL]} with violations[/]")
    if c[ERROR]:
        parts.append(f"[magenta]{c[ERROR]} errors[/]")
    broken = sum(k.broken for k in report.kernels)
    if broken:
        parts.append(f"[red]{broken} broken[/]")
    return f"{len(report.kernels)} kernel(s): " + ", ".join(parts or ["none run"]) + f" in {seconds:.1f}s"


def sandbox_notice(console: Console, described: str) -> None:
    """The sandbox the workers run in (kgate.sandbox), loud where there is none."""
    if described.startswith("none"):
        console.print(f"[bold yellow]WARNING[/] sandbox: {escape(described)}: the kernels ran unconfined, where one "
                      "can reach the others, the reports and your files (README: Isolation)", soft_wrap=True)
    else:
        console.print(f"[dim]sandbox: {escape(described)}[/]")


def judged_alone(console: Console, report: Report) -> None:
    """How many kernels had gates judged again alone after they outgrew their share of the GPU's memory."""
    kernels = report.judged_alone()
    if not kernels:
        return
    console.print(f"{len(kernels)} kernel(s) outgrew their share of the GPU's memory beside the other workers "
                  "(-j) and had those gates judged again alone, with the whole GPU (their verdicts are the second "
                  "try's):", soft_wrap=True)
    for k in kernels:
        console.print(f"    {escape(k.name)}: {escape(k.notes['judged_alone'])}", soft_wrap=True)


def render(console: Console, report: Report, seconds: float) -> None:
    console.print(table(report, console.width))
    findings(console, report)
    judged_alone(console, report)
    console.print(summary_line(report, seconds))
    if "sandbox" in (report.environment or {}):
        sandbox_notice(console, str(report.environment["sandbox"]))
