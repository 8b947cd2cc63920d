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
kernel, >= 3,000 kernels/hour on one H200. `--more-jobs N` times the full gates once more with N judges
per device (the ratio stays between the first two modes, which share `--jobs`); `--prestart` times the
full gates again with each judge count and `kgate audit --prestart`.

    python bench/audit_throughput.py --problems P --candidates C [--index I] --device cuda --jobs 8 \
        --limit 100 --out kgate-bench --json bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit_common import add_corpus_args, compile_stage, differences, select, timed_pass  # noqa: E402

from kgate import gates as registry  # noqa: E402
from kgate.audit.evaluate import AuditOptions  # noqa: E402
from kgate.audit.scheduler import arch_list, make_plan  # noqa: E402
from kgate.runner import seed_private_folders  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_args(parser)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--more-jobs", type=int, action="append", default=[], metavar="N",
                        help="after the two modes, the full gates again with N judges per device (repeatable): "
                             "how the gates' throughput scales with judges sharing a GPU")
    parser.add_argument("--prestart", action="store_true",
                        help="then the full gates again with each judge count (--jobs and every --more-jobs) and "
                             "`kgate audit --prestart` (each next worker started while the others judge)")
    parser.add_argument("--triton-emulation", action="store_true",
                        help="then the full gates again with --jobs and KGATE_TRITON_EMULATION=1 (the accumulation "
                             "gate's emulated products in Triton on a GPU), and whether any verdict changed")
    args = parser.parse_args(argv)

    pairs = select(args)
    plan = make_plan(args.device, args.jobs, args.compile_jobs)
    base = dict(out_dir=args.out, timeout=args.timeout, arch_list=arch_list(plan.devices),
                threads=1 if plan.devices == ["cpu"] else None, pch=args.pch)
    print(f"{len(pairs)} candidate(s); {plan.describe()}", flush=True)
    compile_row, compile_wall = compile_stage(pairs, base, plan.compile_jobs, args.pch)

    plan.compile_stage = False  # built above: the modes below time evaluation only
    standard, _ = timed_pass(pairs, AuditOptions(gates=[], **base), plan, "standard test alone")
    full, full_records = timed_pass(pairs, AuditOptions(gates=list(registry.GATE_NAMES), **base), plan,
                                    f"standard test + {len(registry.GATE_NAMES)} gates")
    more = []
    variants = [(jobs, False) for jobs in args.more_jobs]
    variants += [(jobs, True) for jobs in [plan.slots * len(plan.devices), *args.more_jobs]] if args.prestart else []
    for jobs, prestart in variants:
        wider = make_plan(args.device, jobs, args.compile_jobs)
        wider.compile_stage, wider.prestart = False, prestart
        row, _ = timed_pass(pairs, AuditOptions(gates=list(registry.GATE_NAMES), **base), wider,
                            f"standard test + {len(registry.GATE_NAMES)} gates, {wider.describe()}")
        more.append(row)
    if args.triton_emulation:  # the workers inherit this process's environment (kgate.audit.evaluate.worker_env)
        os.environ["KGATE_TRITON_EMULATION"] = "1"
        try:
            started = time.perf_counter()  # kgate's Triton kernels compiled once for every worker, timed apart
            warm_line = seed_private_folders(plan.devices)
            warm_s = round(time.perf_counter() - started, 2)
            row, records = timed_pass(pairs, AuditOptions(gates=list(registry.GATE_NAMES), **base), plan,
                                      f"standard test + {len(registry.GATE_NAMES)} gates, Triton emulation")
        finally:
            os.environ.pop("KGATE_TRITON_EMULATION", None)
        row["differences"] = differences(full_records, records)  # none expected: the same trees
        row["warm_s"], row["warm"] = warm_s, warm_line
        more.append(row)
    for row in (standard, full, *more):
        total = row["wall_s"] + compile_wall
        row["with_compile_wall_s"] = round(total, 2)
        row["with_compile_s_per_kernel"] = round(total / max(1, row["kernels"]), 3)
        row["with_compile_kernels_per_hour"] = round(3600 * row["kernels"] / total, 1) if total else None
    ratio = round(full["s_per_kernel"] / standard["s_per_kernel"], 2) if standard["s_per_kernel"] else None
    result = {"device": plan.describe(), "candidates": len(pairs), "compile": compile_row, "modes": [standard, full, *more],
              "gates_over_standard": ratio, "goal": {"gates_over_standard_max": 5, "kernels_per_hour_min": 3000}}
    print("\n| mode | kernels | wall s | s/kernel | worker s/kernel | kernels/h | with compile: s/kernel | "
          "kernels/h |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in (standard, full, *more):
        print(f"| {row['mode']} | {row['kernels']} | {row['wall_s']} | {row['s_per_kernel']} | "
              f"{row['worker_s_per_kernel']} | {row['kernels_per_hour']} | {row['with_compile_s_per_kernel']} | "
              f"{row['with_compile_kernels_per_hour']} |")
    print(f"\ncompile stage: {compile_row['kernels']} built in {compile_row['wall_s']} s wall; "
          f"gates / standard per kernel: {ratio}x")
    for row in (standard, full):
        print(f"{row['mode']}: median seconds from a candidate's start to: "
              + ", ".join(f"{k} {v}" for k, v in row["timeline_median"].items()))
    print("gate seconds, summed over the candidates: "
          + ", ".join(f"{k} {v}" for k, v in full["gate_seconds"].items()))
    print("within the accumulation gate: "
          + ", ".join(f"{k} {v}" for k, v in full["accumulation_phases"].items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
