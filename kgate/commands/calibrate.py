"""`kgate calibrate REPORT`: how much do the verdicts of a report depend on the tolerance?

Every tolerance-based gate (oracle, shapes, layouts, distributions, accumulation, and their
`[backward]` ids) records, per judged (case, output), the kernel's error `err`, the reference's own
error `ref_err`, the `floor` and the factor `c` it was judged with (kgate/oracle.py). This command
re-judges each such verdict from that evidence with c multiplied by each factor of the sweep
(bound = m x c x ref_err + floor; the floor stays) and prints how many verdicts move at each factor.

Verdicts that never move:
- tolerance-free gates (contract, special_values, determinism, input_integrity, initialization,
  bounds, isolation): no threshold to sweep;
- errors and skips;
- tolerance-based verdicts the evidence does not explain (the recorded cases, re-judged at 1x, do
  not give the recorded verdict: the gate failed for another reason, such as a wrong shape).
A gate stops at its first failing case, so a failure that moves to pass at a larger factor passes
on the cases it recorded; cases it never reached are not judged.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from rich.markup import escape
from rich.table import Table

from kgate.commands.run import make_console
from kgate.errors import UsageError
from kgate.gates.base import FAIL, PASS, GateResult
from kgate.report import Report

DEFAULT_FACTORS = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="re-judge a JSON report's tolerance-based verdicts over a sweep of tolerance factors",
        description="Re-judge the tolerance-based gates of REPORT (written by `kgate run --json`) from their "
        "recorded evidence with the tolerance factor c multiplied by each factor of the sweep, and print how "
        "many verdicts move at each. Tolerance-free verdicts never move and are shown as fixed.")
    p.add_argument("report", help="a JSON report (kgate run --json PATH, or kgate-out/report.json)")
    p.add_argument("--factors", metavar="F,F,...", default=",".join(f"{f:g}" for f in DEFAULT_FACTORS),
                   help="multipliers of each verdict's factor c (default 0.25,0.5,1,2,4,8,16,32,64)")
    p.add_argument("--show", type=int, default=10, metavar="N",
                   help="list the N tolerance-based verdicts nearest their threshold (default 10)")
    p.set_defaults(func=main)


def _float(value) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class Sweepable:
    """A tolerance-based verdict and the evidence it can be re-judged from."""

    kernel: str
    result: GateResult
    entries: list[tuple[float, float | None, float, float]]  # err, ref_err, floor, factor

    def verdict_at(self, multiplier: float) -> str:
        from kgate.oracle import rejudge  # (kgate.oracle imports torch: not at `kgate --help`)

        ok = all(rejudge(err, ref, floor, factor * multiplier) for err, ref, floor, factor in self.entries)
        return PASS if ok else FAIL

    def threshold(self) -> float:
        """The smallest multiplier at which every recorded case passes (inf: none does)."""
        worst = 0.0
        for err, ref, floor, factor in self.entries:
            if err <= floor:
                continue
            slope = factor * (ref or 0.0)
            if slope <= 0 or math.isinf(err):
                return math.inf
            worst = max(worst, (err - floor) / slope)
        return worst


def classify(report: Report) -> tuple[list[Sweepable], list[tuple[str, GateResult, str]]]:
    """Split a report's verdicts into re-judgeable ones and fixed ones (with the reason)."""
    sweepable: list[Sweepable] = []
    fixed: list[tuple[str, GateResult, str]] = []
    for kernel in report.kernels:
        for result in kernel.gates:
            if result.tolerance_free:
                fixed.append((kernel.name, result, "tolerance-free"))
                continue
            if result.verdict not in (PASS, FAIL):
                fixed.append((kernel.name, result, result.verdict))
                continue
            entries = []
            for e in result.evidence or []:
                err, floor, factor = _float(e.get("err")), _float(e.get("floor")), _float(e.get("factor"))
                if err is None or floor is None or factor is None:
                    continue
                entries.append((err, _float(e.get("ref_err")), floor, factor))
            item = Sweepable(kernel.name, result, entries)
            if not entries:
                fixed.append((kernel.name, result, "no evidence recorded"))
            elif item.verdict_at(1.0) != result.verdict:
                fixed.append((kernel.name, result, "not explained by the tolerance"))
            else:
                sweepable.append(item)
    return sweepable, fixed


def main(args: argparse.Namespace) -> int:
    try:
        factors = sorted({float(f) for f in args.factors.split(",") if f.strip()})
    except ValueError:
        raise UsageError(f"--factors {args.factors}: write numbers separated by commas, e.g. 0.5,1,2") from None
    if not factors or any(f <= 0 for f in factors):
        raise UsageError("--factors: give positive numbers, e.g. 0.25,1,4")
    report = Report.read(args.report)
    console = make_console()
    sweepable, fixed = classify(report)
    total = len(sweepable) + len(fixed)
    free = sum(1 for _, _, why in fixed if why == "tolerance-free")
    console.print(f"{escape(args.report)}: {total} gate verdict(s) of {len(report.kernels)} kernel(s): "
                  f"{free} tolerance-free (fixed), {len(sweepable)} tolerance-based re-judged, "
                  f"{len(fixed) - free} fixed for another reason (error, skip, no evidence, not explained by "
                  "the tolerance)", highlight=False)
    table = Table(title="verdicts at each tolerance factor (c x factor)", header_style="bold")
    for col in ("factor", "pass", "fail", "pass->fail", "fail->pass", "moved", "fixed"):
        table.add_column(col, justify="right")
    for m in factors:
        now = [(s, s.verdict_at(m)) for s in sweepable]
        p2f = sum(1 for s, v in now if s.result.verdict == PASS and v == FAIL)
        f2p = sum(1 for s, v in now if s.result.verdict == FAIL and v == PASS)
        passes = sum(1 for _, v in now if v == PASS)
        table.add_row(f"{m:g}x", str(passes), str(len(now) - passes), str(p2f), str(f2p), str(p2f + f2p),
                      str(len(fixed)))
    console.print(table)
    if sweepable and args.show > 0:
        near = sorted(sweepable, key=lambda s: abs(math.log(max(s.threshold(), 1e-300))))[: args.show]
        listing = Table(title="tolerance-based verdicts nearest their threshold", header_style="bold")
        for col in ("kernel/gate", "recorded", "passes from"):
            listing.add_column(col)
        for s in near:
            t = s.threshold()
            listing.add_row(escape(f"{s.kernel}/{s.result.gate}"), s.result.verdict,
                            "never (no factor explains it)" if math.isinf(t) else f"{t:.3g}x")
        console.print(listing)
    return 0
