"""Throughput of `kgate audit` over a fixed set of candidates: the standard test alone against the full
gates (each mode judges every candidate once, in the same run), excluding compile time and with it.

Stages, in order, on the same candidates and the same worker pool:
1. compile: every candidate that builds an extension is built on the CPU cores (`--compile-jobs` at a
   time) into a fresh cache, timed as a wall-clock stage;
2. standard: the standard test alone (no gates), extensions already built;
3. gates: the standard test and every registered gate, extensions already built.
Reported per mode: wall seconds, seconds per kernel (wall / kernels: what the pool delivers) and
worker seconds per kernel (mean time one candidate holds a worker), kernels per hour, and the same
with the compile stage's wall time added. The goal in issue 7: gates <= 5x the standard test per
kernel, >= 3,000 kernels/hour on one H200.

    python bench/audit_throughput.py --problems P --candidates C [--index I] --device cuda --jobs 8 \
        --limit 100 --out kgate-bench --json bench.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from kgate import gates as registry
from kgate.audit.evaluate import AuditOptions, compile_pair, needs_compile
from kgate.audit.report import timeline_median
from kgate.audit.scheduler import arch_list, make_plan, run_local
from kgate.kernelbench import discover
from kgate.selection import matcher


def _mode(pairs, options, plan, label):
    records = []
    start = time.perf_counter()
    run_local(pairs, options, plan, records.append)
    wall = time.perf_counter() - start
    n = max(1, len(records))
    worker = sum(float(r.get("duration_s") or 0) for r in records) / n
    judged = [r for r in records if not r.get("problem_error") and not r.get("environment_error")]
    return {"mode": label, "kernels": len(records), "judged": len(judged), "wall_s": round(wall, 2),
            "s_per_kernel": round(wall / n, 3), "worker_s_per_kernel": round(worker, 3),
            "kernels_per_hour": round(3600 * n / wall, 1) if wall else None,
            # median seconds from a candidate's start to each worker event (kgate.audit.report)
            "timeline_median": timeline_median(records)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", required=True, type=Path)
    parser.add_argument("--candidates", required=True, type=Path)
    parser.add_argument("--index", type=Path)
    parser.add_argument("-k", dest="select", help="only candidates whose id matches (like kgate audit -k)")
    parser.add_argument("--limit", type=int, help="the first N candidates in id order")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--compile-jobs", type=int)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("kgate-bench"))
    parser.add_argument("--keep-cache", action="store_true", help="do not empty the extension cache first")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--pch", action="store_true", help="as kgate audit --pch (its build is timed with the compile "
                        "stage)")
    args = parser.parse_args(argv)

    pairs = sorted(discover(args.problems, args.candidates, args.index), key=lambda p: p.id)
    if args.select:
        keep = matcher(args.select, [p.id for p in pairs])
        pairs = [p for p in pairs if keep(p.id)]
    pairs = pairs[: args.limit] if args.limit else pairs
    if not pairs:
        sys.exit("no candidates selected")
    if not args.keep_cache:
        shutil.rmtree(args.out / "torch_extensions", ignore_errors=True)
    plan = make_plan(args.device, args.jobs, args.compile_jobs)
    base = dict(out_dir=args.out, timeout=args.timeout, arch_list=arch_list(plan.devices),
                threads=1 if plan.devices == ["cpu"] else None, pch=args.pch)
    print(f"{len(pairs)} candidate(s); {plan.describe()}", flush=True)

    from concurrent.futures import ThreadPoolExecutor

    to_build = [p for p in pairs if p.problem is not None and needs_compile(p)]
    start = time.perf_counter()
    if args.pch and to_build:
        from kgate.audit import pch

        print(pch.build()[1], flush=True)
    with ThreadPoolExecutor(max_workers=plan.compile_jobs) as pool:
        builds = list(pool.map(lambda p: compile_pair(p, AuditOptions(gates=[], **base)), to_build))
    compile_wall = time.perf_counter() - start
    compile_row = {"mode": "compile", "kernels": len(to_build), "built": sum(bool(b.get("ok")) for b in builds),
                   "wall_s": round(compile_wall, 2),
                   "worker_s_per_kernel": round(sum(b.get("wall_s", 0) for b in builds) / max(1, len(builds)), 3)}
    print(json.dumps(compile_row), flush=True)

    plan.compile_stage = False  # built above: the modes below time evaluation only
    standard = _mode(pairs, AuditOptions(gates=[], **base), plan, "standard test alone")
    print(json.dumps(standard), flush=True)
    full = _mode(pairs, AuditOptions(gates=list(registry.GATE_NAMES), **base), plan,
                 f"standard test + {len(registry.GATE_NAMES)} gates")
    print(json.dumps(full), flush=True)
    for row in (standard, full):
        total = row["wall_s"] + compile_wall
        row["with_compile_wall_s"] = round(total, 2)
        row["with_compile_s_per_kernel"] = round(total / max(1, row["kernels"]), 3)
        row["with_compile_kernels_per_hour"] = round(3600 * row["kernels"] / total, 1) if total else None
    ratio = round(full["s_per_kernel"] / standard["s_per_kernel"], 2) if standard["s_per_kernel"] else None
    result = {"device": plan.describe(), "candidates": len(pairs), "compile": compile_row, "modes": [standard, full],
              "gates_over_standard": ratio, "goal": {"gates_over_standard_max": 5, "kernels_per_hour_min": 3000}}
    print("\n| mode | kernels | wall s | s/kernel | worker s/kernel | kernels/h | with compile: s/kernel | "
          "kernels/h |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in (standard, full):
        print(f"| {row['mode']} | {row['kernels']} | {row['wall_s']} | {row['s_per_kernel']} | "
              f"{row['worker_s_per_kernel']} | {row['kernels_per_hour']} | {row['with_compile_s_per_kernel']} | "
              f"{row['with_compile_kernels_per_hour']} |")
    print(f"\ncompile stage: {compile_row['kernels']} built in {compile_row['wall_s']} s wall; "
          f"gates / standard per kernel: {ratio}x")
    for row in (standard, full):
        print(f"{row['mode']}: median seconds from a candidate's start to: "
              + ", ".join(f"{k} {v}" for k, v in row["timeline_median"].items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
