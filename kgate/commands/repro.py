"""`kgate repro REPORT KERNEL/GATE`: replay one recorded failure and say whether it still fails.

The kernel is run again through the real runner (its own worker process, its limits) with only that
gate, on the case the failure was recorded at (seed, dtype, shape) and the device of the report. The
manifest is the one the report names (relative paths are relative to where `kgate run` ran), or
`--manifest`. Exit 1 when it still fails (or errors), 0 when it no longer does, 2 on a usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from kgate.commands.run import make_console
from kgate.errors import UsageError
from kgate.gates.base import ERROR, FAIL, GateResult
from kgate.manifest import load
from kgate.report import Report
from kgate.reports.console import STYLE
from kgate.reports.github import plain
from kgate.runner import Runner, RunOptions


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "repro", help="replay one recorded failure of a JSON report",
        description="Replay the failure of GATE on KERNEL recorded in REPORT (kgate run --json): run that "
        "kernel again with only that gate, on the recorded seed, dtype, shape and device, and show whether "
        "it still fails. Exit 1 if it still fails or errors, 0 if it no longer does.")
    p.add_argument("report", help="a JSON report (kgate run --json PATH, or kgate-out/report.json)")
    p.add_argument("target", metavar="KERNEL/GATE",
                   help="kernel name and gate id, e.g. softmax/oracle or softmax/oracle[backward]")
    p.add_argument("--manifest", metavar="PATH", help="the manifest to load the kernel from (default: the report's)")
    p.add_argument("--device", metavar="D", help="run on this device instead of the recorded one")
    p.add_argument("--out", metavar="DIR", default="kgate-out/repro", help="folder for logs (default kgate-out/repro)")
    p.set_defaults(func=main)


def find(report: Report, target: str) -> tuple[str, GateResult, str]:
    """(kernel name, recorded gate result, recorded device) for 'KERNEL/GATE'."""
    kernel_name, sep, gate = target.rpartition("/")
    if not sep or not kernel_name or not gate:
        raise UsageError(f"{target!r}: write KERNEL/GATE, e.g. softmax/oracle")
    kernels = {k.name: k for k in report.kernels}
    if kernel_name not in kernels:
        raise UsageError(f"no kernel {kernel_name!r} in the report; it has: {', '.join(kernels) or 'none'}")
    kernel = kernels[kernel_name]
    results = {g.gate: g for g in kernel.gates}
    if gate not in results:
        raise UsageError(f"kernel {kernel_name!r} has no result for gate {gate!r}; it has: {', '.join(results)}")
    result = results[gate]
    if result.verdict not in (FAIL, ERROR):
        failed = [g.gate for g in kernel.gates if g.verdict in (FAIL, ERROR)]
        hint = f"its failures: {', '.join(failed)}" if failed else "it has no failures"
        raise UsageError(f"{kernel_name}/{gate} was recorded as {result.verdict}: nothing to replay ({hint})")
    return kernel_name, result, kernel.device


def options_for(result: GateResult, device: str, out: str) -> RunOptions:
    case = result.case or {}
    shape = case.get("shape", None)
    return RunOptions(gates=[result.gate], device=device,
                      seeds=[int(case["seed"])] if "seed" in case else None,
                      dtypes=[case["dtype"]] if case.get("dtype") else None,
                      shapes=[tuple(shape)] if shape is not None else None, out_dir=Path(out))


def main(args: argparse.Namespace) -> int:
    report = Report.read(args.report)
    name, recorded, device = find(report, args.target)
    manifest_path = Path(args.manifest or report.manifest)
    if not manifest_path.exists():
        raise UsageError(f"manifest {manifest_path} (named by the report) not found from {Path.cwd()}: run "
                         "from the folder `kgate run` ran in, or pass --manifest PATH")
    manifest = load(manifest_path)
    try:
        kernel = manifest.by_name(name)
    except KeyError:
        raise UsageError(f"{manifest_path} has no kernel {name!r} any more") from None
    options = options_for(recorded, args.device or device, args.out)
    console = make_console()
    label, style = STYLE[recorded.verdict]
    console.print(f"recorded: [{style}]{label}[/] {escape(name)}/{escape(recorded.gate)}: {escape(plain(recorded.message))}")
    if recorded.case:
        console.print("    case: " + escape(plain(", ".join(f"{k}={v}" for k, v in recorded.case.items()))))
    results = Runner(manifest, [kernel], options).run()
    replayed = next((g for g in results[0].gates if g.gate == recorded.gate), None)
    if replayed is None:
        raise UsageError(f"gate {recorded.gate!r} did not run for {name} (is `backward:` still set?)")
    label, style = STYLE[replayed.verdict]
    console.print(f"replayed: [{style}]{label}[/] {escape(name)}/{escape(replayed.gate)} on {options.device}: "
                  f"{escape(plain(replayed.message))}")
    if replayed.repro:
        console.print(f"    reproduce: [cyan]{escape(plain(replayed.repro))}[/]")
    still = replayed.verdict in (FAIL, ERROR)
    console.print("still fails" if still else "no longer fails", highlight=False)
    return 1 if still else 0
