"""What the audit benchmarks share (bench/audit_throughput.py, bench/audit_scaling.py): the fixed set of
candidates, the compile stage timed on its own, and one timed pass of the evaluation pool."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:  # (a benchmark run by a Python without kgate says so in one line, not a traceback)
    import torch  # noqa: F401

    import kgate  # noqa: F401
except ImportError as missing:
    print(f"{Path(sys.argv[0]).name}: {missing.name or missing} is not installed in {sys.executable}: run it with the "
          "Python kgate is installed in (`make venv`, then .venv/bin/python)", file=sys.stderr)
    raise SystemExit(2) from None

from kgate.audit.evaluate import AuditOptions, ProblemSize, compile_pair, needs_compile  # noqa: E402
from kgate.audit.report import timeline_median  # noqa: E402
from kgate.audit.scheduler import Plan, longest_first, run_local  # noqa: E402
from kgate.kernelbench import Pair, discover  # noqa: E402
from kgate.selection import matcher  # noqa: E402


def add_corpus_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--problems", required=True, type=Path)
    parser.add_argument("--candidates", required=True, type=Path)
    parser.add_argument("--index", type=Path)
    parser.add_argument("-k", dest="select", help="only candidates whose id matches (like kgate audit -k)")
    parser.add_argument("--limit", type=int, help="N candidates: the first N in id order, or with --spread N spread "
                        "evenly over it")
    parser.add_argument("--spread", action="store_true",
                        help="with --limit N: every (total/N)-th candidate in id order, so that the set spans the "
                             "corpus's runs and levels instead of its first run's first problems")
    parser.add_argument("--compile-jobs", type=int)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("kgate-bench"))
    parser.add_argument("--keep-cache", action="store_true", help="do not empty the extension cache first")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--pch", action="store_true", help="as kgate audit --pch (its build is timed with the compile "
                        "stage)")
    parser.add_argument("--order", choices=["longest", "given"], default="longest",
                        help="as kgate audit --order: longest (default) judges the problems estimated to take longest "
                             "first, given in id order")


def select(args: argparse.Namespace) -> list[Pair]:
    """The fixed set: every paired candidate in id order, narrowed by -k and --limit (--spread)."""
    pairs = sorted(discover(args.problems, args.candidates, args.index), key=lambda p: p.id)
    if args.select:
        keep = matcher(args.select, [p.id for p in pairs])
        pairs = [p for p in pairs if keep(p.id)]
    if args.limit and args.limit < len(pairs):
        pairs = spread(pairs, args.limit) if args.spread else pairs[: args.limit]
    if not pairs:
        sys.exit("no candidates selected")
    if not args.keep_cache:
        shutil.rmtree(args.out / "torch_extensions", ignore_errors=True)
    return pairs


def ordered(pairs: list[Pair], order: str, options: AuditOptions, sizes: dict[Path, ProblemSize] | None = None
            ) -> list[Pair]:
    """The pairs in the order `kgate audit --order ORDER` judges them with `options.gates` (longest:
    kgate.audit.scheduler.longest_first; `sizes` from count_sizes, counted once for every pass)."""
    return longest_first(pairs, options, sizes) if order == "longest" else sorted(pairs, key=lambda p: p.id)


def spread(items: list[Any], n: int) -> list[Any]:
    """`n` of `items` at even steps from the first (all of them when there are no more than `n`)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def compile_stage(pairs: list[Pair], base: dict[str, Any], jobs: int, pch: bool) -> tuple[dict[str, Any], float]:
    """Build every extension the candidates need (as `kgate audit`'s compile stage does), timed; returns
    (the stage's row, its wall seconds)."""
    to_build = [p for p in pairs if p.problem is not None and needs_compile(p)]
    start = time.perf_counter()
    if pch and to_build:
        from kgate.audit import pch as header

        print(header.build()[1], flush=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        builds = list(pool.map(lambda p: compile_pair(p, AuditOptions(gates=[], **base)), to_build))
    wall = time.perf_counter() - start
    row = {"mode": "compile", "kernels": len(to_build), "built": sum(bool(b.get("ok")) for b in builds),
           "wall_s": round(wall, 2),
           "worker_s_per_kernel": round(sum(b.get("wall_s", 0) for b in builds) / max(1, len(builds)), 3)}
    print(json.dumps(row), flush=True)
    return row, wall


class GpuSampler:
    """Samples every GPU's utilisation and memory with `nvidia-smi` (NVML) while a pass runs.

    NVML's `utilization.gpu` is the share of the last sample period in which at least one kernel ran on the
    GPU, so its mean over a pass is the GPU's busy fraction. Without `nvidia-smi` (a CPU run) `figures()` is
    None."""

    def __init__(self, period_ms: int = 200):
        self.samples: list[tuple[int, float, float]] = []  # (gpu index, utilisation %, memory MiB)
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._period_ms = period_ms

    def __enter__(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe:
            self._proc = subprocess.Popen(
                [exe, "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 f"-lms={self._period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((int(parts[0]), float(parts[1]), float(parts[2])))
            except (ValueError, IndexError):  # "[N/A]" or a partial line
                continue

    def __exit__(self, *_exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def figures(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        gpus = sorted({g for g, _, _ in self.samples})
        return {"samples": len(self.samples), "period_ms": self._period_ms,
                "busy_percent": {str(g): round(sum(u for i, u, _ in self.samples if i == g)
                                               / max(1, sum(1 for i, _, _ in self.samples if i == g)), 1)
                                 for g in gpus},
                "peak_memory_mib": {str(g): max(m for i, _, m in self.samples if i == g) for g in gpus}}


def timed_pass(pairs: list[Pair], options: AuditOptions, plan: Plan, label: str,
               parts: dict[str, list[list[str]]] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Judge every pair once with `plan` (extensions already built; `parts`: the candidates judged in parts, as
    kgate.audit.scheduler.split_parts chose); returns (the figures, the records)."""
    records: list[dict[str, Any]] = []

    def sink(record: dict[str, Any]) -> None:
        record["finished_s"] = round(time.perf_counter() - start, 3)  # since the pass began: the schedule
        records.append(record)

    with GpuSampler() as gpu:
        start = time.perf_counter()
        run_local(pairs, options, plan, sink, parts=parts)
        wall = time.perf_counter() - start
    n = max(1, len(records))
    worker = sum(float(r.get("duration_s") or 0) for r in records) / n
    judges = plan.slots * len(plan.devices)
    judged = [r for r in records if not r.get("problem_error") and not r.get("environment_error")]
    row = {"mode": label, "kernels": len(records), "judged": len(judged), "wall_s": round(wall, 2),
           "s_per_kernel": round(wall / n, 3), "worker_s_per_kernel": round(worker, 3),
           "kernels_per_hour": round(3600 * n / wall, 1) if wall else None,
           # the share of judge-seconds (judges x wall) in which no candidate held a judge: a long tail, start
           # gaps, the scheduler's own time
           "judges": judges,
           "judges_idle_fraction": round(1 - worker * n / (judges * wall), 3) if wall else None,
           # ... and where those idle judge-seconds lie (idle_breakdown)
           "judges_idle": idle_breakdown(records, wall, judges),
           # each GPU's busy percentage over the pass (NVML), and its peak memory; None on the CPU
           "gpu": gpu.figures(),
           # median seconds from a candidate's start to each worker event (kgate.audit.report)
           "timeline_median": timeline_median(records),
           # where the gates' time goes: seconds per gate summed over the candidates, largest first
           "gate_seconds": gate_seconds(records),
           # ... and within the accumulation gate (its details["seconds"]), with the probes it ran
           "accumulation_phases": accumulation_phases(records),
           # ... and by whose calls: kernel, reference, float64 oracle, summed over the gates and per gate
           "call_seconds": call_seconds(records)}
    print(json.dumps(row), flush=True)
    return row, records


def idle_breakdown(records: list[dict[str, Any]], wall: float, judges: int) -> dict[str, Any]:
    """Where a pass's idle judge-seconds (judges x wall less the records' durations) lie, from each record's
    `finished_s` and `duration_s` (a candidate held a judge over [finished - duration, finished]):
    `earlier_tries_s`, judges held by tries in a smaller share of the GPU's memory that no record keeps
    (`earlier_try_s`: they ran, but count as idle); `tail_s` and `tail_idle_s`, the seconds after the last
    candidate started and the judge-seconds idle in them (the longest candidates left running alone);
    `before_tail_idle_s`, the rest (starts, waits for memory or slots, the scheduler), less the earlier
    tries; `last`, the three candidates that finished last, with their start and end."""
    def spans_of(r: dict[str, Any]) -> list[tuple[float, float, Any]]:
        # a candidate judged in parts (kgate.audit.scheduler.merge_parts) held several judges, each part over its
        # own span: its end is the record's, less how much earlier that part ended (`ended_at`)
        end = float(r["finished_s"])
        parts = [p for p in r.get("parts") or [] if p.get("ended_at") is not None]
        if parts and r.get("ended_at") is not None:
            return [(end - (float(r["ended_at"]) - float(p["ended_at"])) - float(p.get("duration_s") or 0),
                     end - (float(r["ended_at"]) - float(p["ended_at"])), r.get("id")) for p in parts]
        if r.get("parts"):  # (records from before parts kept their ends: the longest part, an estimate)
            return [(end - max(float(p.get("duration_s") or 0) for p in r["parts"]), end, r.get("id"))]
        return [(end - float(r.get("duration_s") or 0), end, r.get("id"))]

    spans = [span for r in records if r.get("finished_s") is not None for span in spans_of(r)]
    if not spans or not wall:
        return {}
    last_start = max(s for s, _, _ in spans)
    tail = max(0.0, wall - last_start)
    busy_in_tail = sum(max(0.0, end - max(begin, last_start)) for begin, end, _ in spans)
    idle = judges * wall - sum(end - begin for begin, end, _ in spans)
    tail_idle = judges * tail - busy_in_tail
    earlier = sum(float(r.get("earlier_try_s") or 0) for r in records)
    return {"earlier_tries_s": round(earlier, 2), "tail_s": round(tail, 2), "tail_idle_s": round(tail_idle, 2),
            "before_tail_idle_s": round(idle - tail_idle - earlier, 2),
            "last": [{"id": i, "start_s": round(b, 2), "end_s": round(e, 2)}
                     for b, e, i in sorted(spans, key=lambda x: x[1])[-3:]]}


def verdicts(record: dict[str, Any]) -> dict[str, str]:
    """A record's verdicts: the standard test's and each gate's (what must not depend on the device count)."""
    out = {"standard": str((record.get("standard") or {}).get("verdict"))}
    out.update({g["gate"]: g["verdict"] for g in record.get("gates") or []})
    if record.get("problem_error"):
        out["problem_error"] = "yes"
    return out


def read_records(path: Path, mode: str | None = None) -> list[dict[str, Any]]:
    """The records a benchmark wrote beside its --json (`.records.jsonl`), of one pass when `mode` is given."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if mode is None or record.get("pass") == mode:
                out.append(record)
    return out


def differences(first: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[str]:
    """One line per candidate whose verdicts differ between two runs (or that only one run judged)."""
    a = {r["id"]: verdicts(r) for r in first}
    b = {r["id"]: verdicts(r) for r in other}
    lines = []
    for pair_id in sorted(set(a) | set(b)):
        if pair_id not in a or pair_id not in b:
            lines.append(f"{pair_id}: judged in only one run")
            continue
        changed = [f"{k} {a[pair_id].get(k)} -> {b[pair_id].get(k)}" for k in sorted(set(a[pair_id]) | set(b[pair_id]))
                   if a[pair_id].get(k) != b[pair_id].get(k)]
        if changed:
            lines.append(f"{pair_id}: " + ", ".join(changed))
    return lines


def accumulation_phases(records: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per phase of the accumulation gate (reference and oracle runs, each emulated order) and the
    probes it ran, summed over `records`."""
    total: dict[str, float] = {}
    for r in records:
        for g in r.get("gates") or []:
            if g["gate"] == "accumulation":
                details = g.get("details") or {}
                for phase, t in (details.get("seconds") or {}).items():
                    total[phase] = total.get(phase, 0.0) + float(t)
                total["probes"] = total.get("probes", 0) + int(details.get("probes") or 0)
    return {k: round(v, 2) for k, v in total.items()}


def call_seconds(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls of user code and their seconds by role (each gate result's `calls`), summed over `records`: in all
    ("all": role -> {"calls", "s"}, with "other" the gates' seconds outside those calls) and per gate (gate ->
    role -> seconds)."""
    every: dict[str, dict[str, float]] = {}
    by_gate: dict[str, dict[str, float]] = {}
    outside = 0.0
    for r in records:
        for g in r.get("gates") or []:
            calls = g.get("calls") if isinstance(g.get("calls"), dict) else {}
            inside = 0.0
            mine = by_gate.setdefault(g["gate"], {})
            for role, seen in calls.items():
                held = every.setdefault(role, {"calls": 0, "s": 0.0})
                held["calls"] += int(seen.get("calls") or 0)
                held["s"] += float(seen.get("s") or 0)
                mine[role] = mine.get(role, 0.0) + float(seen.get("s") or 0)
                inside += float(seen.get("s") or 0)
            rest = max(0.0, float(g.get("duration_s") or 0) - inside)
            mine["other"] = mine.get("other", 0.0) + rest
            outside += rest
    out: dict[str, Any] = {"all": {role: {"calls": int(v["calls"]), "s": round(v["s"], 2)} for role, v in
                                   sorted(every.items(), key=lambda kv: -kv[1]["s"])}}
    if every or outside:
        out["all"]["other"] = {"calls": 0, "s": round(outside, 2)}
    out["by_gate"] = {gate: {role: round(s, 2) for role, s in sorted(roles.items(), key=lambda kv: -kv[1])}
                      for gate, roles in by_gate.items()}
    return out


def gate_seconds(records: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds each gate took, summed over `records` (each gate's own `duration_s`), largest first."""
    total: dict[str, float] = {}
    for r in records:
        for g in r.get("gates") or []:
            total[g["gate"]] = total.get(g["gate"], 0.0) + float(g.get("duration_s") or 0)
    return {k: round(v, 2) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}
