"""Throughput of `kgate audit` over a fixed set of candidates: the standard test alone against the full
gates (each mode judges every candidate once, in the same run), excluding compile time and with it.

Stages, in order, on the same candidates and the same worker pool:
1. compile: every candidate that builds an extension is built on the CPU cores (`--compile-jobs` at a
   time) into a fresh cache, timed as a wall-clock stage;
2. standard: the standard test alone (no gates), extensions already built;
3. gates: the standard test and every registered gate, extensions already built.
Reported per mode: wall seconds, seconds per kernel (wall / kernels: what the pool delivers) and
worker seconds per kernel (mean time one candidate holds a worker), kernels per hour, and the same
with the compile stage's wall time added. The goal: gates <= 5x the standard test per
kernel, >= 3,000 kernels/hour on one H200. The full gates judge the candidates `kgate audit` splits (a long
candidate's gates in parts, each by its own worker at once: kgate.audit.scheduler.split_parts) in parts too, as
it does (`--no-split`: one worker each). Then, each when asked, in this order: `--unsplit` (the full gates with
one worker a candidate, and any verdict that changed), `--triton-emulation`
(the full gates with the accumulation gate's Triton emulation, and any verdict that changed), `--other-order`
(the full gates in the other `--order`: id order after the default, the longest problems first),
`--prestart` (the full gates with `--jobs` and `kgate audit --prestart`), `--more-jobs N` (the full gates
with N judges per device), and with both, each N prestarted. The ratio stays between the first two
modes, which share `--jobs`.

With `--json F`, F is rewritten after every pass (`"complete": false` until the last) and every
candidate's record of every pass goes to F's `.records.jsonl` beside it (its `pass` field names the
mode): a run cut short keeps what it finished, and a slow candidate can be found.

    python bench/audit_throughput.py --problems P --candidates C [--index I] --device cuda --jobs 8 \
        --limit 100 --spread --out kgate-bench --json bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit_common import (  # noqa: E402
    add_corpus_args,
    compile_stage,
    differences,
    ordered,
    read_records,
    select,
    timed_pass,
)

from kgate import gates as registry  # noqa: E402
from kgate.audit.evaluate import AuditOptions  # noqa: E402
from kgate.audit.scheduler import arch_list, count_sizes, make_plan, split_parts  # noqa: E402
from kgate.runner import seed_private_folders  # noqa: E402

STANDARD = "standard test alone"
FULL = "standard test + "  # and the gates' count: the first such pass is the one the ratio takes


def summary(plan: Any, pairs: list[Any], compile_row: dict[str, Any], rows: list[dict[str, Any]], *,
            complete: bool, order: str, standard_pairs: list[Any]) -> dict[str, Any]:
    """The benchmark's JSON: the figures of every pass done (`complete` once all asked for are); `ids`: the
    order of the passes with gates, `standard_ids`: the standard-test pass's."""
    standard = next((r["s_per_kernel"] for r in rows if r["mode"] == STANDARD), None)
    full = next((r["s_per_kernel"] for r in rows if r["mode"].startswith(FULL)), None)
    return {"device": plan.describe(), "candidates": len(pairs), "order": order, "ids": [p.id for p in pairs],
            "standard_ids": [p.id for p in standard_pairs],
            "compile": compile_row, "modes": rows, "complete": complete,
            "gates_over_standard": round(full / standard, 2) if standard and full else None,
            "goal": {"gates_over_standard_max": 5, "kernels_per_hour_min": 3000}}


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
    parser.add_argument("--gates-only", action="store_true",
                        help="no standard-test pass (no ratio): the full gates and the passes asked for after them, "
                             "e.g. with --keep-cache on a machine that ran the first two passes, where one call of a "
                             "lent GPU cannot hold every pass")
    parser.add_argument("--no-split", dest="split", action="store_false",
                        help="the full gates with every candidate in one worker (kgate audit --no-split); by "
                             "default the candidates kgate audit splits are judged in parts, as it judges them")
    parser.add_argument("--unsplit", action="store_true",
                        help="then the full gates again with every candidate in one worker, and any verdict that "
                             "changed: what splitting the longest candidates' gates gains, side by side")
    parser.add_argument("--other-order", action="store_true",
                        help="then the full gates again with --jobs in the other --order (given after longest, longest "
                             "after given): what judging the longest problems first changes")
    parser.add_argument("--triton-emulation", action="store_true",
                        help="then the full gates again with --jobs and KGATE_TRITON_EMULATION=1 (the accumulation "
                             "gate's emulated products of both orders in Triton on a GPU; by default the sequential "
                             "order's only, =0 none), and whether any verdict changed")
    parser.add_argument("--compare", type=Path, metavar="RECORDS",
                        help="another run's records (the .records.jsonl beside its --json): print every candidate "
                             "whose verdicts differ from this run's in the standard-test pass and the full-gates "
                             "pass (same mode names), e.g. a run at an older kgate commit")
    args = parser.parse_args(argv)
    if args.compare and not args.compare.is_file():
        parser.error(f"--compare {args.compare}: no such file (give the .records.jsonl another run wrote)")

    pairs = select(args)
    plan = make_plan(args.device, args.jobs, args.compile_jobs)
    # the corpus's two folders, as `kgate audit` gives them: every worker then has one view (each candidate's and
    # problem's folder lies inside them), so all are forked from one template; without them each run and level
    # folder made a view of its own, and a template for it, four kept at once (half the workers waited ~5 s for
    # a template's start on an H100)
    base = dict(out_dir=args.out, timeout=args.timeout, arch_list=arch_list(plan.devices), pch=args.pch,
                corpus=[str(Path(p).resolve()) for p in (args.problems, args.candidates)])
    # (torch threads: run_local shares the cores among each pass's judges)
    gates = list(registry.GATE_NAMES)
    # each pass in the order kgate audit would judge it: the standard test's by input elements, the gates'
    # with the weighted layers too (sizes counted once, outside every timed pass)
    sizes = count_sizes(pairs, AuditOptions(gates=[], **base)) if args.order == "longest" or args.other_order else {}
    standard_pairs = ordered(pairs, args.order, AuditOptions(gates=[], **base), sizes)
    pairs = ordered(pairs, args.order, AuditOptions(gates=gates, **base), sizes)
    print(f"{len(pairs)} candidate(s), order {args.order}; {plan.describe()}", flush=True)
    compile_row, compile_wall = compile_stage(pairs, base, plan.compile_jobs, args.pch)
    if args.keep_cache:  # builds an earlier run left: this compile pass timed a cache, not a build
        compile_row["cache_kept"] = True

    plan.compile_stage = False  # built above: the modes below time evaluation only
    rows: list[dict[str, Any]] = []
    records_file = args.json.with_suffix(".records.jsonl") if args.json else None
    if records_file:
        records_file.parent.mkdir(parents=True, exist_ok=True)
        records_file.write_text("")

    def keep(row: dict[str, Any], records: list[dict[str, Any]]) -> None:
        """One pass done: its row, and (with --json) the figures so far and its records, written at once, so
        that a benchmark cut short (a machine taken away, a time limit) still leaves every pass it finished."""
        if args.keep_cache:  # no compile time was measured: nothing to add
            row.update(with_compile_wall_s=None, with_compile_s_per_kernel=None, with_compile_kernels_per_hour=None)
        else:
            row["with_compile_wall_s"] = round(row["wall_s"] + compile_wall, 2)
            row["with_compile_s_per_kernel"] = round(row["with_compile_wall_s"] / max(1, row["kernels"]), 3)
            row["with_compile_kernels_per_hour"] = (round(3600 * row["kernels"] / row["with_compile_wall_s"], 1)
                                                    if row["with_compile_wall_s"] else None)
        rows.append(row)
        if args.json:
            args.json.write_text(json.dumps(summary(plan, pairs, compile_row, rows, complete=False, order=args.order,
                                                    standard_pairs=standard_pairs), indent=1) + "\n")
            with records_file.open("a") as out:  # each candidate's record, named by its pass
                for record in records:
                    out.write(json.dumps({"pass": row["mode"], **record}) + "\n")

    if not args.gates_only:
        keep(*timed_pass(standard_pairs, AuditOptions(gates=[], **base), plan, STANDARD))
    judges = plan.slots * len(plan.devices)
    parts = split_parts(pairs, AuditOptions(gates=gates, **base), judges, sizes) if args.split and sizes else {}
    if parts:
        print(f"judged in parts (kgate audit's split): {', '.join(f'{k} ({len(v)})' for k, v in parts.items())}",
              flush=True)
    full_row, full_records = timed_pass(pairs, AuditOptions(gates=gates, **base), plan, f"{FULL}{len(gates)} gates",
                                        parts)
    full_row["split"] = {k: v for k, v in parts.items()}
    keep(full_row, full_records)
    if args.unsplit and parts:
        row, records = timed_pass(pairs, AuditOptions(gates=gates, **base), plan,
                                  f"standard test + {len(gates)} gates, every candidate in one worker")
        row["differences"] = differences(full_records, records)
        keep(row, records)
    if args.triton_emulation:  # the workers inherit this process's environment (kgate.audit.evaluate.worker_env)
        os.environ["KGATE_TRITON_EMULATION"] = "1"
        try:
            started = time.perf_counter()  # kgate's Triton kernels compiled once for every worker, timed apart
            warm_line = seed_private_folders(plan.devices)
            warm_s = round(time.perf_counter() - started, 2)
            row, records = timed_pass(pairs, AuditOptions(gates=gates, **base), plan,
                                      f"standard test + {len(gates)} gates, Triton emulation")
        finally:
            os.environ.pop("KGATE_TRITON_EMULATION", None)
        row["differences"] = differences(full_records, records)  # none expected: the same trees
        row["warm_s"], row["warm"] = warm_s, warm_line
        keep(row, records)
    if args.other_order:
        other = "given" if args.order == "longest" else "longest"
        keep(*timed_pass(ordered(pairs, other, AuditOptions(gates=gates, **base), sizes),
                         AuditOptions(gates=gates, **base), plan, f"standard test + {len(gates)} gates, order {other}"))
    # then the judge counts: each asked count, and with --prestart every count (--jobs first) again prestarted
    variants = [(plan.slots * len(plan.devices), True)] if args.prestart else []
    variants += [(jobs, False) for jobs in args.more_jobs]
    variants += [(jobs, True) for jobs in args.more_jobs] if args.prestart else []
    for jobs, prestart in variants:
        wider = make_plan(args.device, jobs, args.compile_jobs)
        wider.compile_stage, wider.prestart = False, prestart
        keep(*timed_pass(pairs, AuditOptions(gates=gates, **base), wider,
                         f"standard test + {len(gates)} gates, {wider.describe()}"))
    result = summary(plan, pairs, compile_row, rows, complete=True, order=args.order, standard_pairs=standard_pairs)
    if args.compare:
        mine = read_records(records_file) if records_file else []
        result["compare"] = {"against": str(args.compare), "passes": {}}
        for mode in [r["mode"] for r in rows[: 1 if args.gates_only else 2]]:
            theirs = read_records(args.compare, mode)
            ours = [r for r in mine if r.get("pass") == mode] if records_file else (
                full_records if mode == full_row["mode"] else [])
            lines = differences(theirs, ours) if theirs else [f"no pass named {mode!r} in {args.compare}"]
            result["compare"]["passes"][mode] = lines
            print(f"\n{mode}: {len(lines)} candidate(s) whose verdicts differ from {args.compare}"
                  + "".join(f"\n  {line}" for line in lines))
    ratio = result["gates_over_standard"]
    print("\n| mode | kernels | wall s | s/kernel | worker s/kernel | kernels/h | with compile: s/kernel | "
          "kernels/h |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['mode']} | {row['kernels']} | {row['wall_s']} | {row['s_per_kernel']} | "
              f"{row['worker_s_per_kernel']} | {row['kernels_per_hour']} | {row['with_compile_s_per_kernel']} | "
              f"{row['with_compile_kernels_per_hour']} |")
    print(f"\ncompile stage: {compile_row['kernels']} built in {compile_row['wall_s']} s wall; "
          f"gates / standard per kernel: {ratio}x")
    for row in rows[: 1 if args.gates_only else 2]:
        print(f"{row['mode']}: median seconds from a candidate's start to: "
              + ", ".join(f"{k} {v}" for k, v in row["timeline_median"].items()))
        gpu, idle = row.get("gpu"), row.get("judges_idle_fraction")
        print(f"{row['mode']}: judges idle "
              + (f"{100 * idle:.1f} % of {row.get('judges')} x {row['wall_s']} judge-seconds; " if idle is not None
                 else "(not measured); ")
              + ("GPU busy " + ", ".join(f"cuda:{g} {u} %" for g, u in gpu["busy_percent"].items())
                 + " (NVML), peak memory " + ", ".join(f"{m:.0f} MiB" for m in gpu["peak_memory_mib"].values())
                 if gpu else "no GPU sampled"))
        where = row.get("judges_idle") or {}
        if where:
            print(f"{row['mode']}: idle judge-seconds: {where['earlier_tries_s']} in tries that outgrew a share, "
                  f"{where['before_tail_idle_s']} otherwise before the last start, {where['tail_idle_s']} in the "
                  f"{where['tail_s']} s after it; last to finish: "
                  + ", ".join(f"{x['id']} ({x['start_s']}-{x['end_s']} s)" for x in where["last"]))
    print("gate seconds, summed over the candidates: "
          + ", ".join(f"{k} {v}" for k, v in full_row["gate_seconds"].items()))
    print("within the accumulation gate: "
          + ", ".join(f"{k} {v}" for k, v in full_row["accumulation_phases"].items()))
    calls = full_row.get("call_seconds") or {}
    if calls.get("all"):
        print("the gates' seconds by whose calls (count, seconds): "
              + ", ".join(f"{role} {v['calls']} {v['s']}" for role, v in calls["all"].items()))
        for gate in full_row["gate_seconds"]:
            roles = calls["by_gate"].get(gate) or {}
            print(f"  {gate}: " + ", ".join(f"{role} {s}" for role, s in roles.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
