"""The local backend: compile on the CPU cores, evaluate on the devices, one record per candidate.

Two pools. The compile pool imports candidates that build extensions (`load_inline`) with no GPU
visible, `compile_jobs` at a time; a candidate is handed to the evaluation pool as soon as its build
is done (candidates that build nothing go at once). The evaluation pool has `slots` workers per
device; with more than one slot on a GPU each worker may use only its share of the GPU's memory
(`torch.cuda.set_per_process_memory_fraction`). A candidate that runs out of GPU memory while it
shared the device is judged again with more, so a neighbour's appetite never becomes its verdict; so
is one killed at its host memory limit while sharing (a float64 oracle too large for the worker's
share of the GPU moves to the CPU, where it can outgrow the limit). With 4 or more slots a device
(and no --prestart) the second try takes half the slots at once (half the memory), as soon as they
free up, while the other slots go on judging: on the H200 with 4 judges the corpus's 2 G-element
reductions outgrew a quarter of the memory and fit in half, and judged alone at the end, one of them
held the device for 100 s with three slots idle (the throughput benchmark of 2026-12-04, docs/audit/README.md). What outgrows that too, or
any share with fewer slots, is judged alone, with the whole device, once no shared work is left:
taking the whole device in mid-run would leave every other slot idle while the longest candidate in
flight finishes (on the H200 audit, 7 such drains mid-run idled most of the 6 slots). Once one
candidate of a problem needed more, the problem's other candidates go straight to it, without the
smaller attempt: what outgrows a share is nearly always the problem's own size (the reference, its
float64 oracle, the inputs), the same for every candidate of it (on the H200 audit, every candidate
of the 128 x 4096 x 4095 reductions).
"""

from __future__ import annotations

import enum
import math
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kgate.audit.evaluate import (
    GATES_S_PER_LAYER,
    GATES_S_PER_PARAMETER,
    AuditOptions,
    ProblemSize,
    compile_pair,
    evaluate_pair,
    needs_compile,
    needs_whole_gpu,
    problem_sizes,
    turn_folder,
)
from kgate.errors import UsageError
from kgate.kernelbench import Pair
from kgate.runner import (
    python_command,
    resolve_device,
    seed_private_folders,
    threads_per_worker,
    visible_cuda,
)
from kgate.shares import memory_share


@dataclass
class Plan:
    devices: list[str]
    slots: int  # evaluation workers judging at once per device
    compile_jobs: int
    compile_stage: bool = True
    prestart: bool = False  # twice the workers per device, `slots` of them judging (kgate.audit.turns)

    def threads(self) -> int | None:
        """torch's CPU threads per worker: this machine's cores shared among the workers judging at once
        (kgate.runner.threads_per_worker; a prestarted worker waits idle, so it takes no share)."""
        return threads_per_worker(self.slots * len(self.devices))

    def describe(self) -> str:
        return (f"{len(self.devices)} device(s) ({', '.join(self.devices)}) x {self.slots} worker(s), "
                f"{self.compile_jobs} compile job(s)" + (", each next worker started while they judge"
                                                         if self.prestart else ""))


def arch_list(devices: list[str]) -> str | None:
    """TORCH_CUDA_ARCH_LIST for these devices (asked of a short-lived process: it creates a context)."""
    indices = sorted({int(d.split(":")[1]) for d in devices if d.startswith("cuda:")})
    if not indices:
        return None
    code = ("import torch,sys; print(';'.join(sorted({'%d.%d' % torch.cuda.get_device_capability(i) "
            f"for i in {indices}}})))")
    try:
        out = subprocess.run(python_command(code), capture_output=True, text=True, timeout=120, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None


def make_plan(device: str, jobs: int | None, compile_jobs: int | None) -> Plan:
    cpus = os.cpu_count() or 1
    if device == "auto":
        device = resolve_device(device)
    if device == "cpu":
        devices = ["cpu"]
        default_jobs = max(1, min(4, cpus // 2))
    elif device.startswith("cuda"):
        devices = [f"cuda:{i}" for i in visible_cuda(device)]
        default_jobs = len(devices)
    else:
        raise UsageError(f"--device {device}: use auto, cpu, cuda or cuda:N")
    jobs = jobs or default_jobs
    slots = max(1, math.ceil(jobs / len(devices)))
    return Plan(devices, slots, compile_jobs or max(1, cpus // 2))


class DeviceLease:
    """The judging slots of one device. A candidate takes one (its share of the device's memory), or
    `width` of them (a wider share, for one that outgrew a single one), or all of them (the whole device).
    While a wider request waits, no narrower one starts: the slots free up for it as the candidates in
    flight end, instead of each going to the next single candidate."""

    def __init__(self, slots: int):
        self.slots = slots
        self.used = 0
        self.waiting = 0  # wider requests waiting
        self._cond = threading.Condition()

    def acquire(self, width: int = 1) -> None:
        width = min(max(1, width), self.slots)
        with self._cond:
            if width > 1:
                self.waiting += 1
                try:
                    self._cond.wait_for(lambda: self.used + width <= self.slots)
                finally:
                    self.waiting -= 1
            else:
                self._cond.wait_for(lambda: not self.waiting and self.used < self.slots)
            self.used += width

    def release(self, width: int = 1) -> None:
        with self._cond:
            self.used -= min(max(1, width), self.slots)
            self._cond.notify_all()


class Progress:
    """What the scheduler tells the console; all optional."""

    def started(self, pair: Pair, device: str) -> None: ...
    def compiled(self, pair: Pair, outcome: dict[str, Any]) -> None: ...
    def finished(self, record: dict[str, Any]) -> None: ...
    def held(self, pair: Pair, why: str) -> None:
        """`pair` waits to be judged alone with a whole device (its record, if any, is not kept)."""

    def widened(self, pair: Pair, share: float | None) -> None:
        """`pair` outgrew its share and is judged again now with `share` of the device's memory (its
        record so far is not kept)."""


HELD_OOM = "ran out of memory while sharing the device"
HELD_PROBLEM = "another candidate of its problem ran out of memory while sharing the device"
WIDER_OOM = "ran out of memory in its share of the device"
WIDER_PROBLEM = "another candidate of its problem ran out of memory in a share of the device"


def mark_alone(record: dict[str, Any], why: str) -> None:
    """Say in `record` why it was judged with a whole device (`retried_alone`: a second try)."""
    record["alone"] = why
    if why == HELD_OOM:
        record["retried_alone"] = True


def mark_wider(record: dict[str, Any], why: str, fraction: float | None) -> None:
    """Say in `record` why it was judged with a wider share of the device's memory, and which
    (`retried_wider`: a second try)."""
    record["wider"] = why
    record["share"] = fraction
    if why == WIDER_OOM:
        record["retried_wider"] = True


def wider_width(slots: int, prestart: bool) -> int | None:
    """The slots a candidate that outgrew one share takes for its second try while the others go on: half
    the device's, when that is at least two (with 4 judges on the H200, 0.475 of its memory, where every
    problem of the KernelBench audit fit); None: straight to the whole device at the end. Not with
    --prestart, whose turns count single judges."""
    return slots // 2 if slots >= 4 and not prestart else None


class Need(enum.IntEnum):
    """How much of a device a problem's candidates need, once one of them outgrew a share."""
    WIDER = 1  # outgrew a single share: the wider one (wider_width)
    WHOLE = 2  # outgrew the wider share too, or any share where there is none: a whole device


class Outgrown:
    """What the problems' candidates outgrew: a single share (their other candidates go straight to the
    wider one) or the wider share too (straight to a whole device)."""

    def __init__(self) -> None:
        self._problems: dict[Any, Need] = {}
        self._lock = threading.Lock()

    def needs(self, record: dict[str, Any], pair: Pair, *, whole: bool = True) -> bool:
        """Whether `record` (judged in a share) means `pair` must be judged again with more memory (a whole
        device, or with whole=False a wider share); remembers that its problem needs it."""
        if not needs_whole_gpu(record):
            return False
        need = Need.WHOLE if whole else Need.WIDER
        with self._lock:
            self._problems[pair.problem] = max(self._problems.get(pair.problem, need), need)
        return True

    def _need(self, pair: Pair) -> Need | None:
        with self._lock:
            return self._problems.get(pair.problem) if pair.problem is not None else None

    def known(self, pair: Pair) -> bool:
        """A candidate of the problem needed a whole device."""
        return self._need(pair) is Need.WHOLE

    def wider(self, pair: Pair) -> bool:
        """A candidate of the problem outgrew a single share, and not (yet) the wider one."""
        return self._need(pair) is Need.WIDER


CANCEL_WAIT_S = 30.0


def _await_cancelled(finished: list[threading.Event], compile_pool: ThreadPoolExecutor) -> None:
    """After `cancel` is set (an interrupt): give the threads the moments they need to kill their workers
    (`supervise` sees `cancel` within a poll) before the interrupt ends this process. Without this wait
    the process exited first and a worker stuck in a hang lived on as an orphan, holding its GPU memory.
    Waits on each thread's own `finished` event: a Thread.join() that the interrupt broke off can leave
    is_alive() False for a thread still running (CPython 3.11)."""
    compile_pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    for event in finished:
        event.wait(timeout=max(0.0, deadline - time.monotonic()))
    for t in list(getattr(compile_pool, "_threads", ())):  # builds in flight: their supervise kills them too
        t.join(timeout=max(0.0, deadline - time.monotonic()))


def count_sizes(pairs: list[Pair], options: AuditOptions, *, one: bool = False) -> dict[Path, ProblemSize]:
    """The sizes of the problems of `pairs` (kgate.audit.evaluate.problem_sizes; nothing to count, and no
    worker started, when they share one problem, unless `one`: its size says whether to split it)."""
    problems = [p.problem for p in pairs if p.problem is not None]
    return problem_sizes(problems, options) if len(set(problems)) > 1 or (one and problems) else {}


def longest_first(pairs: list[Pair], options: AuditOptions,
                  sizes: dict[Path, ProblemSize] | None = None) -> list[Pair]:
    """`pairs` with the problems estimated to take longest first (kgate.audit.evaluate.ProblemSize: input
    elements for the standard test, weighted layers and parameter elements too when `options.gates` is not
    empty), so that with several judges the longest candidates do not start last while the others idle: on
    the H200 the corpus's largest problems took 70-130 s against a median of 8-13 s. Problems that cannot be counted, and unpaired
    candidates, keep their order after the rest. `sizes`: counted already (count_sizes), else counted here."""
    sizes = count_sizes(pairs, options) if sizes is None else sizes
    gates = bool(options.gates)

    def key(item: tuple[int, Pair]) -> tuple[int, float, int]:
        index, pair = item
        size = sizes.get(pair.problem) if pair.problem is not None else None
        seconds = size.seconds(gates) if size is not None else None
        return (0, -seconds, index) if seconds is not None else (1, 0.0, index)
    return [pair for _, pair in sorted(enumerate(pairs), key=key)]


# Each gate's share of a candidate's gate-seconds, for splitting a long candidate's gates into balanced parts:
# the gate-seconds summed over the public corpus's 24 spread candidates on one H100 at kgate fa8c16e
# (docs/records/2026-12-07-h100-fa8c16e/); a gate not named weighs as the lightest.
GATE_WEIGHTS = {"distributions": 115.0, "accumulation": 104.0, "special_values": 96.0, "isolation": 68.4,
                "shapes": 65.3, "determinism": 58.8, "oracle": 16.9, "bounds": 15.6, "contract": 8.3,
                "layouts": 8.0, "input_integrity": 6.1, "initialization": 5.5}
SPLIT_SHARE = 1.0  # a candidate whose gates are estimated above this many judges' fair shares is split
SPLIT_MIN_S = 10.0  # ... and above this many seconds (each part loads the candidate again)


def split_parts(pairs: list[Pair], options: AuditOptions, judges: int,
                sizes: dict[Path, ProblemSize]) -> dict[str, list[list[str]]]:
    """The candidates whose gates alone are estimated (ProblemSize: weighted layers and parameters) to take more
    than SPLIT_SHARE of a judge's fair share of the whole audit (every candidate's estimate over the judges)
    and SPLIT_MIN_S,
    each with its gates split into parts judged by separate workers at once (the first part with the standard
    test), balanced by GATE_WEIGHTS: a DenseNet of 103 weighted layers held one judge for 234 s of a 262 s
    wall while the other judges idled. At most `judges` parts, at least two gates' worth each. Nothing to split
    with one judge or one gate."""
    gates = list(options.gates or [])
    if judges < 2 or len(gates) < 2:
        return {}

    def gate_seconds(size: ProblemSize) -> float:
        return GATES_S_PER_LAYER * (size.layers or 0) + GATES_S_PER_PARAMETER * (size.parameters or 0)

    estimates = {p.id: sizes[p.problem].seconds(True) or 0.0 for p in pairs
                 if p.problem is not None and p.problem in sizes}
    share = sum(estimates.values()) / judges
    if share <= 0:
        return {}
    lightest = min(GATE_WEIGHTS.values())
    parts: dict[str, list[list[str]]] = {}
    for pair in pairs:
        size = sizes.get(pair.problem) if pair.problem is not None else None
        heavy = gate_seconds(size) if size is not None else 0.0
        if heavy <= SPLIT_SHARE * share or heavy < SPLIT_MIN_S:
            continue
        count = min(judges, len(gates) // 2, max(2, math.ceil(2 * heavy / share)))
        groups: list[list[str]] = [[] for _ in range(count)]
        loads = [0.0] * count
        for gate in sorted(gates, key=lambda g: -GATE_WEIGHTS.get(g, lightest)):
            k = loads.index(min(loads))
            groups[k].append(gate)
            loads[k] += GATE_WEIGHTS.get(gate, lightest)
        parts[pair.id] = [[g for g in gates if g in group] for group in groups]  # each in the gates' own order
    return parts


def merge_parts(records: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One record of a candidate judged in parts (split_parts), `records` in part order: the first part's
    standard test, load and timeline; every part's gate results, in the order of `names` (the audit's result
    ids); the first error, problem error and tampering any part saw; the worker seconds summed; flags any part
    raised (out of memory, a wider share, judged alone) kept."""
    first = records[0]
    merged = dict(first)
    by_gate = {g["gate"]: g for r in records for g in r.get("gates") or []}
    merged["gates"] = [by_gate[n] for n in names if n in by_gate]
    for key in ("error", "problem_error", "tamper", "environment_error"):
        merged[key] = next((r.get(key) for r in records if r.get(key)), first.get(key))
    merged["notes"] = {k: v for r in reversed(records) for k, v in (r.get("notes") or {}).items()}
    merged["duration_s"] = round(sum(r.get("duration_s") or 0.0 for r in records), 3)
    merged["restarts"] = sum(r.get("restarts") or 0 for r in records)
    merged["oom"] = any(r.get("oom") for r in records)
    merged["host_memory"] = any(r.get("host_memory") for r in records)
    merged["complete"] = all(r.get("complete", True) for r in records)
    for key in ("wider", "share", "retried_wider", "alone", "retried_alone", "earlier_try_s"):
        found = next((r[key] for r in records if r.get(key) is not None), None)
        if found is not None:
            merged[key] = found
    merged["parts"] = [{"gates": [g["gate"] for g in r.get("gates") or []], "duration_s": r.get("duration_s"),
                        "timeline": r.get("timeline"), "ended_at": r.get("ended_at")} for r in records]
    ends = [r["ended_at"] for r in records if r.get("ended_at") is not None]
    if ends:
        merged["ended_at"] = max(ends)
    return merged


def run_local(pairs: list[Pair], options: AuditOptions, plan: Plan, sink: Callable[[dict[str, Any]], None],
              progress: Progress | None = None, stop_at: float | None = None,
              cancel: threading.Event | None = None, parts: dict[str, list[list[str]]] | None = None) -> int:
    """Judge every pair; each record goes to `sink` as it is done. Returns how many were judged
    (fewer than len(pairs) when `stop_at`, a time.monotonic() deadline, passed first). `parts` (split_parts):
    pairs whose gates are judged in parts by several workers at once, their records merged (merge_parts)
    before they go to `sink`; a pair cut short by `stop_at` in any part is left to --resume whole."""
    progress = progress or Progress()
    cancel = cancel or threading.Event()
    if options.threads is None:  # unless the caller chose: the cores shared among this plan's judges
        options = replace(options, threads=plan.threads())
    if "accumulation" in (options.gates or ()):  # kgate's own Triton kernels: before any worker starts
        seed_private_folders(plan.devices)
    parts = {} if plan.prestart else dict(parts or {})  # (--prestart's turns count single judges)
    # built (or needing no build) and waiting for a judge: the earliest in `pairs` first, so that an order
    # chosen by the caller (longest_first) holds while the builds finish in another; a split pair's parts
    # (rank, part number) one after another
    ready: queue.PriorityQueue[tuple[int, int, Pair, dict[str, Any] | None]] = queue.PriorityQueue()
    compile_pool = ThreadPoolExecutor(max_workers=plan.compile_jobs, thread_name_prefix="kgate-compile")
    items = sum(len(parts.get(p.id) or [None]) for p in pairs)  # what the judges take, parts counted

    def queue_pair(rank: int, pair: Pair, outcome: dict[str, Any] | None) -> None:
        for part in range(len(parts.get(pair.id) or [None])):
            ready.put((rank, part, pair, outcome))

    def compiled(rank: int, pair: Pair, future: Future) -> None:
        try:
            outcome = future.result()
        except BaseException as exc:  # noqa: BLE001 - a kgate failure to compile: evaluate anyway
            outcome = {"ok": False, "build_failed": False, "message": f"compile stage failed: {exc}"}
        progress.compiled(pair, outcome)
        queue_pair(rank, pair, outcome)

    for rank, pair in enumerate(pairs):
        if plan.compile_stage and pair.problem is not None and needs_compile(pair):
            future = compile_pool.submit(compile_pair, pair, options, cancel=cancel)
            future.add_done_callback(lambda f, rank=rank, pair=pair: compiled(rank, pair, f))
        else:
            queue_pair(rank, pair, None)

    def options_of(pair: Pair, part: int) -> AuditOptions:
        """A part's options: its gates, the standard test in the first part only."""
        groups = parts.get(pair.id)
        if not groups:
            return options
        return replace(options, gates=groups[part], standard=options.standard and part == 0)

    done_parts: dict[str, dict[int, dict[str, Any]]] = {}  # a split pair's records so far, by part

    starts = 2 if plan.prestart else 1  # workers per judging slot
    leases = {d: DeviceLease(starts * plan.slots) for d in plan.devices}
    lock = threading.Condition()
    taken = [0]
    judged = [0]
    errors: list[BaseException] = []
    # (pair, part, build, why, the record of its try in a share or None): judged alone at the end
    alone_later: list[tuple[Pair, int, dict[str, Any] | None, str, dict[str, Any] | None]] = []
    whole = Outgrown()
    sharing = [len(plan.devices) * plan.slots * starts]  # evaluation threads that may still take shared work

    def timed_out() -> bool:
        return stop_at is not None and time.monotonic() > stop_at

    def record_it(record: dict[str, Any], pair: Pair, part: int = 0) -> None:
        record["ended_at"] = round(time.monotonic(), 3)  # when its judge was free again (a part's, for the schedule)
        groups = parts.get(pair.id)
        if groups:  # a split pair: recorded once every part is in, merged
            with lock:
                got = done_parts.setdefault(pair.id, {})
                got[part] = record
                if len(got) < len(groups):
                    return
                record = merge_parts([got[k] for k in range(len(groups))], options.gate_ids)
                del done_parts[pair.id]
        sink(record)
        with lock:
            judged[0] += 1
        progress.finished(record)

    def shared(device: str) -> None:
        device_slots = leases[device]
        sharing_gpu = device.startswith("cuda") and plan.slots > 1
        wide = wider_width(plan.slots, plan.prestart)
        turns = {"path": str(turn_folder(options.out_dir, device)), "count": plan.slots} if plan.prestart else None
        while not cancel.is_set():
            with lock:
                if taken[0] >= items or timed_out():
                    return
                taken[0] += 1
            while True:
                try:
                    _, part, pair, outcome = ready.get(timeout=0.2)
                    break
                except queue.Empty:
                    if cancel.is_set():
                        return
            if sharing_gpu and whole.known(pair):
                hold(pair, part, outcome, HELD_PROBLEM)
                continue
            width, why = (wide, WIDER_PROBLEM) if sharing_gpu and wide and whole.wider(pair) else (1, None)
            earlier = None  # the record of the try in a smaller share: its standard test may stand
            while True:  # one share, then (wide) a wider one; past that, a whole device at the end
                share = memory_share(width, plan.slots) if sharing_gpu else None
                device_slots.acquire(width)
                try:
                    progress.started(pair, device)
                    record = evaluate_pair(pair, options_of(pair, part), device, gpu_memory_fraction=share,
                                           compiled=outcome, cancel=cancel, turns=turns, earlier=earlier)
                finally:
                    device_slots.release(width)
                if cancel.is_set():
                    return  # an interrupted candidate is not recorded: --resume judges it again
                if why:
                    mark_wider(record, why, share)
                outgrew = sharing_gpu and whole.needs(record, pair, whole=not wide or width > 1)
                if not (outgrew and wide and width == 1):
                    break
                if timed_out():  # a second try is a new start: past the deadline, left to --resume
                    progress.held(pair, HELD_OOM)
                    return
                width, why, earlier = wide, WIDER_OOM, record
                progress.widened(pair, memory_share(width, plan.slots))
            if outgrew:
                hold(pair, part, outcome, HELD_OOM, record)
            else:
                record_it(record, pair, part)

    def hold(pair: Pair, part: int, outcome: dict[str, Any] | None, why: str,
             record: dict[str, Any] | None = None) -> None:
        with lock:
            alone_later.append((pair, part, outcome, why, record))
        progress.held(pair, why)

    def alone(device: str) -> None:
        """The candidates that ran out of memory while sharing, each with a whole device, once no shared
        work is left to take (a deadline passed first leaves them to --resume)."""
        device_slots = leases[device]
        while not cancel.is_set():
            with lock:
                # not before every slot's shared work has ended: a candidate still in a share may yet
                # outgrow it and take a wider share, which must not come after the whole device
                lock.wait_for(lambda: sharing[0] == 0 or cancel.is_set(), timeout=0.2)
                if cancel.is_set() or timed_out() or (not alone_later and sharing[0] == 0):
                    return
                if sharing[0]:
                    continue
                pair, part, outcome, why, earlier = alone_later.pop(0)
            device_slots.acquire(device_slots.slots)
            try:
                progress.started(pair, device)
                record = evaluate_pair(pair, options_of(pair, part), device, compiled=outcome, cancel=cancel,
                                       earlier=earlier)
                mark_alone(record, why)
            finally:
                device_slots.release(device_slots.slots)
            if cancel.is_set():
                return
            record_it(record, pair, part)

    def loop(device: str) -> None:
        try:
            shared(device)
        finally:
            with lock:
                sharing[0] -= 1
                lock.notify_all()
        alone(device)

    def guarded(device: str, finished: threading.Event) -> None:
        try:
            loop(device)
        except BaseException as exc:  # noqa: BLE001 - surfaced in the main thread
            errors.append(exc)
            cancel.set()
        finally:
            finished.set()

    slots = [(d, s, threading.Event()) for d in plan.devices for s in range(starts * plan.slots)]
    finished = [done for _, _, done in slots]
    threads = [threading.Thread(target=guarded, args=(d, done), name=f"kgate-eval-{d}-{s}", daemon=True)
               for d, s, done in slots]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)
    except BaseException:
        cancel.set()
        _await_cancelled(finished, compile_pool)
        raise
    finally:
        compile_pool.shutdown(wait=False, cancel_futures=True)
    if errors:
        raise errors[0]
    return judged[0]
