"""Runs each kernel in its own worker process, under a time and a memory limit, and streams results.

A worker that raises, segfaults, calls os._exit, hangs past the per-gate timeout or grows past the
memory limit costs only its own kernel: the gate it was in gets the verdict `error` with the cause,
and the run goes on. A worker that ended early by itself (a crash, or a GPU fault that destroyed its
CUDA context, which it reports as `context_lost`) is replaced by a fresh one for the gates not yet
judged, at most `max_restarts` times; after a kill by kgate (time, memory) or past that cap the gates
never reached get `error` ("not run"). Every result is appended to `results.jsonl` as it arrives, once,
so an interrupted run loses nothing already judged; with `resume` a later run keeps those results and
judges only the gates they lack (or that judged nothing: "not run", "cancelled").

Several workers at once on one GPU (-j) each take an equal share of its memory (gpu_share, kgate.shares). A
result that ran out of memory in its share (outgrew_share) is held, not recorded: once the shared work is
done, the kernel's affected gates are judged again alone, one worker on the device with all of its memory,
and only that result is recorded; the first try is kept in its details (`outgrew_share`) and in the
kernel's notes (`judged_alone`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgate import forkserver, procmem, sandbox
from kgate import gates as registry
from kgate.errors import InfrastructureError, UsageError
from kgate.gates.base import PASS, GateResult
from kgate.manifest import LoadedManifest, ResolvedKernel
from kgate.report import KernelResult
from kgate.sandbox import kgate_command, python_command  # noqa: F401 (python_command: kgate.audit's)
from kgate.shares import MEMORY_LIMIT, at_memory_limit, memory_share, result_out_of_gpu_memory

POLL_S = 0.05
LOAD_TIMEOUT_S = 120.0  # at least this long to start a worker and import the kernel
# How a worker killed for its resident memory is named (the audit tells it from the kernel's own errors).
# The longest event line kept (a result with its traceback and log tail is far smaller): a worker that
# writes without newlines cannot grow the parent's memory.
MAX_EVENT_BYTES = 16 * 2**20


@dataclass
class RunOptions:
    gates: list[str] | None = None  # None = each kernel's own selection
    device: str | None = None  # None = the manifest's
    seeds: list[int] | None = None
    dtypes: list[str] | None = None
    shapes: list[tuple[int, ...]] | None = None
    timeout: float | None = None  # per gate; None = the manifest's limits.timeout
    memory: int | None = None
    jobs: int = 1
    out_dir: Path = field(default_factory=lambda: Path("kgate-out"))
    max_restarts: int = 3  # fresh workers per kernel after one ended early (CUDA context lost, crash)
    resume: bool = False  # keep results.jsonl and judge only the (kernel, gate) results it lacks
    cache_dir: Path | None = None  # --cache: the kernels' build caches kept here across runs (kernel_caches)


class Events:
    """Callbacks the console uses for progress; all optional."""

    def kernel_started(self, kernel: ResolvedKernel, gates: list[str]) -> None: ...
    def gate_started(self, kernel: ResolvedKernel, gate: str) -> None: ...
    def gate_finished(self, kernel: ResolvedKernel, result: GateResult) -> None: ...
    def kernel_finished(self, result: KernelResult) -> None: ...
    def kernel_held(self, kernel: ResolvedKernel, why: str) -> None:
        """`kernel` outgrew its share of the GPU's memory (`why`: where): those gates are judged again alone,
        with the whole GPU, once the shared work is done; their first results are not recorded."""


def cuda_devices() -> list[int]:
    """Visible CUDA devices, counted without creating a CUDA context in this process."""
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def visible_cuda(requested: str) -> list[int]:
    """The visible CUDA devices that `requested` names (`cuda`: every one; `cuda:N`: that one). None there is
    an infrastructure error (exit 2, nothing judged), not a verdict on every kernel."""
    prefix, colon, number = requested.partition(":")
    if prefix != "cuda" or (colon and not number.isdigit()):
        raise UsageError(f"device {requested}: use cuda or cuda:N (N a visible device's number)")
    found = cuda_devices()
    wanted = [int(number)] if number.isdigit() else found
    if not wanted or any(i not in found for i in wanted):
        raise InfrastructureError(f"device {requested}: no such CUDA device here ({len(found)} visible: check the "
                                  "driver and CUDA_VISIBLE_DEVICES), or use --device cpu")
    return wanted


def resolve_device(requested: str) -> str:
    """The device to judge on: `auto` is a GPU when one is visible; a CUDA device must be visible
    (visible_cuda)."""
    if requested == "auto":
        return "cuda" if cuda_devices() else "cpu"
    if requested.startswith("cuda"):
        visible_cuda(requested)
    return requested


def _exit_cause(returncode: int, peak_memory: int = 0) -> str:
    """Why a worker that kgate did not stop ended. A SIGKILL that kgate did not send comes from the kernel or
    from outside, often the system's out-of-memory killer where the machine has less memory than the workers'
    limits allow together (each worker's limit is its own, not a share of the machine's): said so, with the
    most the worker's processes held and the machine's memory, and what to do."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        meaning = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGBUS": "bus error",
                   "SIGFPE": "arithmetic error", "SIGILL": "illegal instruction", "SIGKILL": "killed"}.get(name)
        cause = f"worker killed by {name}" + (f" ({meaning})" if meaning else "")
        if name == "SIGKILL":
            total = procmem.machine_memory()
            cause += (", not by kgate: by the kernel itself, or by the system's out-of-memory killer when the machine "
                      f"runs out (the worker's processes held up to {_fmt_bytes(peak_memory)}"
                      + (f" of this machine's {_fmt_bytes(total)}" if total else "")
                      + "); for the latter, fewer jobs or a lower memory limit (`limits.memory`, --memory), so that "
                        "kgate stops a worker before the machine runs out")
        return cause
    return f"worker exited with code {returncode} before finishing (os._exit or a hard exit in user code?)"


def _in_gate(cause: str, gate: str | None) -> str:
    return cause if gate is None or f"in gate {gate}" in cause else f"{cause} in gate {gate}"


def _not_run(causes: list[str], killed: bool) -> str:
    """Why the gates no worker reached were not run (`killed`: kgate ended the last worker)."""
    if not causes:
        return "not run: the worker sent no result"
    if len(causes) == 1 or killed:
        return f"not run: {causes[-1]} earlier"
    if len(set(causes)) == 1:
        return f"not run: {causes[0]} {len(causes)} times"
    return f"not run: the worker ended early {len(causes)} times ({'; '.join(dict.fromkeys(causes))})"


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


# Results that judged nothing: a run that resumes judges those gates again.
UNJUDGED = ("not run:", "cancelled")
# A result line kgate run streams where a gate outgrew its worker's share of the GPU's memory and is held for
# the alone phase: not a verdict. A run stopped before that phase leaves it last; --resume then judges the
# gate alone first, before any shared work, so that time-limited slices of a run still get to it.
HELD = "held: outgrew its share of the GPU's memory"


def read_judged(text: str, digests: dict[str, str] | None = None,
                held: dict[str, dict[str, GateResult]] | None = None) -> tuple[dict[str, dict[str, GateResult]], int]:
    """kernel -> gate -> result, from the text of a results.jsonl an earlier run streamed (the last line a
    kill tore, and the results that judged nothing (`UNJUDGED`), left out; a later line wins), and how many
    results were left out because they were judged on something else: with `digests` (kernel -> its
    ResolvedKernel.digest(), for the kernels this run judges), a result recorded under another kernel entry, other
    defaults or other kernel files, or without a digest, is not kept; a result of a kernel not in `digests` is
    neither kept nor counted. `held` collects the gates whose last line is a HELD marker (kernel ->
    gate -> the marker)."""
    judged: dict[str, dict[str, GateResult]] = {}
    stale = 0
    for line in text.splitlines():
        try:
            data = json.loads(line)
            kernel = data.pop("kernel")
            digest = data.pop("digest", None)
            result = GateResult.from_json(data)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if digests is not None and kernel not in digests:
            continue  # a kernel this run does not judge (not selected): neither kept nor judged again
        if digests is not None and digest != digests[kernel]:
            stale += 1
            continue
        if result.verdict == "error" and result.message.startswith(HELD):
            judged.get(kernel, {}).pop(result.gate, None)
            if held is not None:  # (the first try, in a share: its details.outgrew_share)
                held.setdefault(kernel, {})[result.gate] = result
            continue
        if held is not None:
            held.get(kernel, {}).pop(result.gate, None)
        if result.verdict == "error" and result.message.startswith(UNJUDGED):
            judged.get(kernel, {}).pop(result.gate, None)
            continue
        judged.setdefault(kernel, {})[result.gate] = result
    if held is not None:
        for kernel in [k for k, gates in held.items() if not gates]:
            del held[kernel]
    return judged, stale


def threads_per_worker(workers: int) -> int | None:
    """torch's CPU threads for each of `workers` worker processes judging at once: the cores shared out,
    or None (torch's default, one thread per core) for a lone worker. Each worker would otherwise start
    one thread per core, and side by side they slow each other down many times over (seen with two
    workers on two cores: a gate past its 20-minute limit). On a GPU too: their CPU work (KernelBench's
    inputs, a float64 oracle moved to the CPU, CPU references) runs at the same time."""
    if workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


# How a kernel's record says that results of its first try were its share's doing (KernelResult.notes, the
# console): `{OUTGREW} ({share:g}) in: GATES`.
OUTGREW = "outgrew its share of the GPU's memory"


def gpu_of(device: str) -> str:
    """The device a worker on `device` judges on: `cuda` is the worker's current device, the first visible one."""
    return "cuda:0" if device == "cuda" else device


def gpu_share(device: str, workers: int) -> float | None:
    """The share of the GPU's memory each worker on `device` may take when `workers` of them judge on it at
    once (kgate.shares.memory_share, one slot each, as the audit's), or None, all of it: one worker, or not
    a GPU. The one place that decides whether a device is shared."""
    if workers <= 1 or not device.startswith("cuda"):
        return None
    return memory_share(1, workers)


def outgrew_share(result: GateResult) -> bool:
    """Whether `result`, judged in a share of a GPU's memory, may be the share's doing rather than the kernel's:
    a verdict other than pass whose message, traceback or worker log tail says the GPU ran out of memory (the
    kernel's, the reference's or kgate's own allocation; compute-sanitizer's failed allocation; Triton's), or
    whose worker was killed at its host memory limit (a float64 oracle that does not fit in the share moves to
    the CPU). Such a result is judged again alone, with the whole GPU."""
    if result.verdict == PASS:
        return False
    return result_out_of_gpu_memory(result.verdict, result.message, result.details) or at_memory_limit(result.message)


def first_try(result: GateResult, share: float | None) -> dict[str, Any]:
    """A result that outgrew its share, as the details of its second try (and of its HELD line) keep it."""
    return {"share": share, "verdict": result.verdict, "message": result.message[:2000]}


@dataclass
class Judging:
    """One kernel being judged: its results so far, and the gates that outgrew its share of the GPU's memory
    (`held`: their first results, not recorded) until they are judged again alone."""

    kernel: ResolvedKernel
    gates: list[str]
    device: str
    log_path: Path
    results: dict[str, GateResult]
    share: float | None = None
    started: float = field(default_factory=time.perf_counter)
    held: dict[str, GateResult] = field(default_factory=dict)
    again: dict[str, GateResult] = field(default_factory=dict)  # the held results, once judged again alone
    where: list[tuple[str, str | None]] = field(default_factory=list)  # a worker's early end, and its gate
    reference_faults: list[str] = field(default_factory=list)  # the reference lost the CUDA context in: gates
    quiet: bool = False  # results not announced to the events (a resumed run's held gates, judged first)
    workers: int = 0  # worker processes started
    planned: int = 0  # of them, those not started to replace one that ended early
    outcome: KernelResult | None = None

    def outgrew(self) -> str:
        """Where the first try outgrew the share, for the console and the kernel's notes."""
        gates = self.again or self.held
        return f"{OUTGREW} ({self.share:g}) in: {', '.join(g for g in self.gates if g in gates)}"


class Runner:
    def __init__(self, manifest: LoadedManifest, kernels: list[ResolvedKernel], options: RunOptions,
                 events: Events | None = None, results_path: Path | None = None):
        self.manifest = manifest
        self.kernels = kernels
        self.options = options
        self.events = events or Events()
        self.out_dir = options.out_dir
        self.results_path = results_path or self.out_dir / "results.jsonl"
        self._lock = threading.Lock()
        self._cancel = threading.Event()  # set on an interrupt: every worker in flight is killed
        self._judged: dict[str, dict[str, GateResult]] = {}  # kept from an earlier run (`resume`)
        self._held_before: dict[str, dict[str, GateResult]] = {}  # held by an earlier run, never judged alone
        self.stale = 0  # results of an earlier run not kept: judged on another manifest or other kernel files
        self._digests = {k.name: k.digest() for k in kernels}

    def gates_for(self, kernel: ResolvedKernel) -> list[str]:
        """Gate ids for this kernel: its selected gates, then with `backward: true` the same gates on the
        gradients (`oracle[backward]`, ...). --gate NAME selects both phases, --gate NAME[backward] one."""
        backward = kernel.entry.backward
        selected = registry.phase_ids(kernel.selected_gates(registry.GATE_NAMES), backward)
        if self.options.gates:
            selected = [g for g in registry.phase_ids(registry.KNOWN_GATES, backward)
                        if g in self.options.gates or registry.base_name(g) in self.options.gates]
        return selected

    def device_for(self, kernel: ResolvedKernel) -> str:
        return resolve_device(self.options.device or kernel.device)

    def run(self) -> list[KernelResult]:
        try:
            (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
            self.results_path.parent.mkdir(parents=True, exist_ok=True)
            if self.options.resume:
                text = self.results_path.read_text(encoding="utf-8", errors="replace") \
                    if self.results_path.exists() else ""
                self._judged, self.stale = read_judged(text, self._digests, held=self._held_before)
                if text and not text.endswith("\n"):  # a line torn by a kill: new lines start after it
                    with open(self.results_path, "a", encoding="utf-8") as f:
                        f.write("\n")
            else:
                self.results_path.write_text("")
        except OSError as exc:
            raise InfrastructureError(f"cannot write to the output folder {self.out_dir}: {exc}; "
                                      "choose another with --out") from None
        # before any worker, for the kernels the accumulation gate judges (no compile for a run without it)
        seed_private_folders(sorted({self.device_for(k) for k in self.kernels
                                     if any(registry.base_name(g) == "accumulation" for g in self.gates_for(k))}))
        self._judge_held_before()
        if self.options.jobs <= 1:
            return [self.run_kernel(k) for k in self.kernels]
        # Fewer kernels than jobs: each kernel's gates are spread over jobs // kernels workers.
        parts = max(1, self.options.jobs // max(1, len(self.kernels)))
        shares = self.shares(parts)

        def shared(kernel: ResolvedKernel) -> Judging:
            judging = self._judge_kernel(kernel, parts, shares.get(gpu_of(self.device_for(kernel))))
            if judging.held:
                self.events.kernel_held(kernel, judging.outgrew())
            else:
                self._finish(judging)
            return judging

        judged = self._pooled(shared, self.kernels, self.options.jobs)
        # What outgrew its share: judged again once no shared work is left, one worker a device (all of its
        # memory, no neighbour), the devices side by side.
        alone: dict[str, list[Judging]] = {}
        for judging in judged:
            if judging.held:
                alone.setdefault(gpu_of(judging.device), []).append(judging)
        self._pooled(lambda queue: [self._again_alone(j) for j in queue], list(alone.values()), len(alone))
        return [j.outcome for j in judged if j.outcome is not None]

    def _judge_held_before(self) -> None:
        """Resuming: the gates an earlier run held for its alone phase and was stopped before judging (HELD) are
        judged alone, with the whole device, before any shared work, and then stand as resumed results. In a
        run cut into time-limited slices, each slice would otherwise judge them in a share again, hold them
        again and be stopped before the alone phase again."""
        held = [(k, [g for g in self.gates_for(k) if g in self._held_before.get(k.name, {})]) for k in self.kernels]
        for kernel, gates in held:
            if not gates or self._cancel.is_set():
                continue
            markers = self._held_before[kernel.name]
            first = {g: (markers[g].details or {}).get("outgrew_share") or {} for g in gates}
            log_path = self._log_path(kernel)
            judging = Judging(kernel, gates, self.device_for(kernel), log_path, {},
                              share=next((f.get("share") for f in first.values() if f.get("share")), None),
                              quiet=True)
            judging.again = {g: GateResult(g, str(f.get("verdict", "error")), str(f.get("message", "")),
                                           markers[g].tolerance_free) for g, f in first.items()}
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"\n--- kgate: judged alone first, with the whole device: {', '.join(gates)} (an earlier "
                          "run held them for its alone phase and was stopped before it) ---\n")
            self._judge(judging, gates, log_path, alone=True)
            self._judged.setdefault(kernel.name, {}).update(judging.results)

    def shares(self, parts: int) -> dict[str, float | None]:
        """The share of each GPU's memory a worker on it may take (gpu_share): the workers that judge on one
        device at once are at most --jobs, and for each of its kernels as many as its gates to judge, at most
        `parts`."""
        workers: dict[str, int] = {}
        for kernel in self.kernels:
            todo = [g for g in self.gates_for(kernel) if g not in self._judged.get(kernel.name, {})]
            if todo:
                device = gpu_of(self.device_for(kernel))
                workers[device] = workers.get(device, 0) + min(parts, len(todo))
        return {device: gpu_share(device, min(self.options.jobs, n)) for device, n in workers.items()}

    def _pooled(self, work: Callable[[Any], Any], items: list[Any], threads: int) -> list[Any]:
        """`work` on each of `items`, `threads` at a time, in order; an interrupt kills every worker in flight."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=threads) as pool:
            try:
                return list(pool.map(work, items))
            except KeyboardInterrupt:
                self._cancel.set()  # the threads kill their workers and end; then the interrupt goes on
                raise

    def _stream(self, kernel: str, result: GateResult) -> None:
        with self._lock, open(self.results_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kernel": kernel, "digest": self._digests.get(kernel), **result.to_json()}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def run_kernel(self, kernel: ResolvedKernel, parts: int = 1) -> KernelResult:
        """Judge one kernel with the whole device; with `parts` > 1 its gates are dealt round-robin to that
        many workers at once (each a fresh process, each log appended to the kernel's log when it ends)."""
        return self._finish(self._judge_kernel(kernel, parts))

    def _judge_kernel(self, kernel: ResolvedKernel, parts: int = 1, share: float | None = None) -> Judging:
        """Judge one kernel's gates, `parts` workers at once, each with `share` of the GPU's memory (None: all
        of it). What outgrew the share is left in the Judging's `held`, not recorded (_again_alone)."""
        gates = self.gates_for(kernel)
        device = self.device_for(kernel)
        self.events.kernel_started(kernel, gates)
        log_path = self._log_path(kernel)
        # resuming: the results an earlier run recorded stand; only the other gates are judged
        results: dict[str, GateResult] = {g: r for g, r in self._judged.get(kernel.name, {}).items() if g in gates}
        judging = Judging(kernel, gates, device, log_path, results, share)
        for result in results.values():
            self.events.gate_finished(kernel, result)
        todo = [g for g in gates if g not in results]
        groups = [todo[i::parts] for i in range(min(parts, len(todo)))] or [[]]
        if not todo:
            return judging
        judging.planned = len(groups)
        if len(groups) == 1:
            self._judge(judging, groups[0], log_path)
            return judging
        logs = [log_path.with_name(f"{log_path.stem}.part{i}.log") for i in range(len(groups))]
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            list(pool.map(lambda g: self._judge(judging, g[0], g[1]), zip(groups, logs, strict=True)))
        with open(log_path, "a" if self.options.resume else "w", encoding="utf-8") as log:
            for i, (group, part) in enumerate(zip(groups, logs, strict=True)):
                log.write(f"--- kgate: worker {i + 1} of {len(groups)}: {', '.join(group)} ---\n")
                if part.exists():
                    log.write(part.read_text(encoding="utf-8", errors="replace"))
                    part.unlink()
        return judging

    def _log_path(self, kernel: ResolvedKernel) -> Path:
        return self.out_dir / "logs" / f"{_file_name(kernel.name)}.log"

    def _again_alone(self, judging: Judging) -> None:
        """Judge again the gates that outgrew the kernel's share of the GPU's memory, in one worker with the
        whole device (the caller runs no other worker on it), and finish the kernel. Only the second results
        are recorded; each keeps the first one in its details (`outgrew_share`)."""
        if self._cancel.is_set():
            return
        with self._lock:
            judging.again, judging.held = judging.held, {}
            for gate in judging.again:
                judging.results.pop(gate, None)
        # the first try's early ends in those gates were the share's doing: the notes say so instead
        judging.where = [(text, gate) for text, gate in judging.where if gate not in judging.again]
        gates = [g for g in judging.gates if g in judging.again]
        with open(judging.log_path, "a", encoding="utf-8") as log:
            log.write(f"\n--- kgate: judged again alone, with the whole GPU: {', '.join(gates)} (the first try "
                      f"{judging.outgrew()}) ---\n")
        judging.planned += 1
        self._judge(judging, gates, judging.log_path, alone=True)
        self._finish(judging)

    def _finish(self, judging: Judging) -> KernelResult:
        kernel = judging.kernel
        worker_error = None
        if judging.where:
            fresh = judging.workers - judging.planned
            worker_error = "; ".join(text for text, _ in judging.where) + (
                f" ({fresh} fresh worker(s) ran the gates after)" if fresh else "")
        notes = {}
        if judging.reference_faults:
            notes["reference_fault"] = ("the reference lost the CUDA context on a probe of: "
                                        f"{', '.join(judging.reference_faults)} (each skipped from that probe on; "
                                        "a fresh worker ran the gates after it)")
        if judging.again:
            notes["judged_alone"] = (f"the first try {judging.outgrew()}; judged again alone, with the whole "
                                     "GPU (the first try's results: each one's details.outgrew_share)")
        source_file, source_line = kernel.source_location()
        outcome = KernelResult(
            name=kernel.name, kernel=kernel.kernel.text, reference=kernel.reference.text, device=judging.device,
            source_file=source_file, source_line=source_line, manifest_line=kernel.line,
            gates=[judging.results[g] for g in judging.gates], error=worker_error, log=str(judging.log_path),
            duration_s=round(time.perf_counter() - judging.started, 3), files=list(kernel.entry.files),
            notes=notes)
        judging.outcome = outcome
        self.events.kernel_finished(outcome)
        return outcome

    def _threads(self) -> int | None:
        """torch threads per worker: the cores shared out among the workers judging at once."""
        return threads_per_worker(self.options.jobs)

    def _judge(self, judging: Judging, gates: list[str], log_path: Path, *, alone: bool = False) -> None:
        """Run `gates` of the kernel in a worker (and fresh ones after an early end), recording each result
        into `judging.results`, and where a worker ended early into `judging.where`. In a share of the GPU's
        memory (`judging.share`, unless `alone`), a result that outgrew it (outgrew_share) is held instead:
        not streamed, not reported, left for _again_alone."""
        kernel, results = judging.kernel, judging.results
        share = None if alone else judging.share
        timeout = self.options.timeout or kernel.limits.timeout
        memory = self.options.memory or kernel.limits.memory
        job = {"manifest": str(self.manifest.path.resolve()), "repro_manifest": str(self.manifest.path),
               "kernel": kernel.name, "device": judging.device, "memory": memory, "timeout": timeout,
               "seeds": self.options.seeds, "dtypes": self.options.dtypes,
               "shapes": [list(s) for s in self.options.shapes] if self.options.shapes else None,
               "threads": self._threads(), "gpu_memory_fraction": share}

        def record(result: GateResult) -> None:
            first = judging.again.get(result.gate) if alone else None
            if first is not None:
                result.details = {**(result.details or {}), "outgrew_share": first_try(first, judging.share)}
            with self._lock:
                results[result.gate] = result  # (held too: the worker's loop below counts it judged)
                held = share is not None and outgrew_share(result)
                if held:
                    judging.held[result.gate] = result
            if held:  # a marker, so that a run stopped before the alone phase still knows (HELD)
                self._stream(kernel.name, GateResult(
                    result.gate, "error", f"{HELD} ({share:g}); judged again alone once the shared work is done",
                    result.tolerance_free, broken=True, details={"outgrew_share": first_try(result, share)}))
                return
            self._stream(kernel.name, result)
            if not judging.quiet:
                self.events.gate_finished(kernel, result)

        # A worker that ends early (the CUDA context lost, a crash) after starting a gate costs that gate;
        # a fresh worker runs the gates not yet judged, at most max_restarts times. One killed by kgate
        # (time, memory, cancel) or dying before its first gate (while loading) is not restarted.
        causes: list[str] = []
        where: list[tuple[str, str | None]] = []  # the same, with the gate, for the kernel's `error`
        faults: list[str] = []  # the gates whose probe the reference itself faulted on (a note, not an error)
        remaining = list(gates)
        workers, killed = 0, False
        env, caches = kernel_caches(kernel, self.options.cache_dir)  # once for the kernel's workers here
        while remaining:
            workers += 1
            state: dict[str, Any] = {"current": None, "last": None, "started": False, "done": False, "lost": None}

            def on_event(event: dict[str, Any], state: dict[str, Any] = state,
                         remaining: list[str] = remaining) -> str | None:
                kind = event.get("event")
                if kind == "gate_start" and event.get("gate") in remaining:
                    state["current"], state["started"] = event["gate"], True
                    self.events.gate_started(kernel, event["gate"])
                    return f"gate {event['gate']}"
                if kind == "result":
                    result = self._result(event.get("result"), remaining)
                    if result is not None and result.gate not in results:
                        record(result)
                        state["last"] = result.gate
                    state["current"] = None
                    return ""
                if kind == "context_lost":
                    state["lost"] = str(event.get("message") or "CUDA error")
                    state["by_reference"] = event.get("reference") is True
                elif kind == "done":
                    state["done"] = True
                return None

            if causes:
                with open(log_path, "a", encoding="utf-8") as log:
                    log.write(f"\n--- kgate: a fresh worker for the remaining gates ({causes[-1]}) ---\n")
            exit_ = supervise("kgate.worker", {**job, "gates": remaining}, log_path=log_path, cwd=self.manifest.base,
                              timeout=timeout, memory=memory, on_event=on_event,
                              append_log=bool(causes) or self.options.resume or alone,  # earlier logs stay
                              cancel=self._cancel, env=env, writable=caches, pass_env=kernel.cache_env)
            if exit_.detached and "isolation" in remaining:
                with self._lock:
                    earlier = results.get("isolation")
                    held = judging.held.pop("isolation", None) is not None
                result = detached_result(exit_.detached, earlier)
                if earlier is None or held:
                    record(result)
                else:
                    with self._lock:
                        results["isolation"] = result
                    self._stream(kernel.name, result)
            left = [g for g in remaining if g not in results]
            if state["lost"] is not None:  # by the kernel, or by the reference on a gate's probe (that gate skipped)
                cause = "the reference lost the CUDA context" if state.get("by_reference") else "the CUDA context was lost"
            else:
                cause = exit_.cause(state["done"])
            if cause is None:
                remaining = left  # normally empty: a worker that sent no result for a gate gets it below
                break
            causes.append(cause)
            current = state["current"]
            if state["lost"] is not None and state.get("by_reference"):  # that gate skipped: not the kernel's
                faults.append(str(state["last"]))
            elif state["lost"] is not None:
                where.append((_in_gate(cause, state["last"]), state["last"]))
            elif left and (current in left or not state["started"]):
                # The gate it died in (or, dying while loading, the first one) keeps the cause.
                failed = current if current in left else left[0]
                record(GateResult(failed, "error", cause, registry.get(failed).tolerance_free, broken=True,
                                  details={"log_tail": _tail(log_path)}))
                left.remove(failed)
                where.append((_in_gate(cause, failed) if state["started"] else cause, failed))
            else:
                where.append((f"{cause} between gates", None))
            remaining, killed = left, exit_.error is not None
            if killed or not state["started"] or len(causes) > self.options.max_restarts:
                break
        if remaining:
            why = _not_run(causes, killed)
            for name in remaining:
                record(GateResult(name, "error", why, registry.get(name).tolerance_free, broken=True,
                                  details={"log_tail": _tail(log_path)} if causes else {}))
        with self._lock:
            judging.where.extend(where)
            judging.reference_faults.extend(faults)
            judging.workers += workers

    @staticmethod
    def _result(data: Any, gates: list[str]) -> GateResult | None:
        if not isinstance(data, dict) or data.get("gate") not in gates:
            return None
        if data.get("verdict") not in ("pass", "fail", "error", "skip"):
            return None
        try:
            return GateResult.from_json(data)
        except TypeError:
            return None


def detached_result(found: list[str], earlier: GateResult | None) -> GateResult:
    """The isolation gate's verdict on a kernel whose worker kgate saw leave processes running detached from it
    (WorkerExit.detached), whatever the worker itself reported."""
    details: dict[str, Any] = {"detached": found}
    if earlier is not None:
        details["replaced"] = {"verdict": earlier.verdict, "message": earlier.message}
    return GateResult("isolation", "fail", f"the kernel left {len(found)} process(es) running detached from its "
                      f"worker: {', '.join(found[:5])}: work that outlives the call (the sandbox killed them when "
                      "the worker ended)", True, broken=True, details=details)


@dataclass
class WorkerExit:
    """How a supervised worker ended: `error` is set when kgate killed it (time or memory limit)."""

    returncode: int | None
    error: str | None = None
    stage: str | None = None  # the stage it was in when it ended, as named by on_event
    fatal: str | None = None  # why its own start failed, before any user code (kgate.worker.reporting_start)
    detached: list[str] = field(default_factory=list)  # processes it left running detached (procmem.detached)
    peak_memory: int = 0  # the most resident memory seen in its processes (polled every TREE_POLL_S)

    def cause(self, done: bool) -> str | None:
        """Why the worker ended before it was `done` (it sent `done`): kgate killed it, its own start
        failed, or it exited; None when it finished."""
        return self.error or (None if done else self.fatal or _exit_cause(self.returncode, self.peak_memory))


# Files written into every worker's private folder before it starts (kgate's own compiled Triton kernels,
# from seed_private_folders): held in this process, so no worker can change what the next one gets.
PRIVATE_SEED: dict[str, bytes] = {}
_SEED_TRIED: set[str] = set()  # the GPUs seed_private_folders has compiled on (or failed to): once each


def seed_private_folders(devices: list[str]) -> str | None:
    """With the accumulation gate's Triton emulation on (its sequential order by default; not with
    KGATE_TRITON_EMULATION=0: kgate.gates.accumulation.triton_orders) and a GPU among `devices`: compile
    kgate's own Triton kernels once, in a process of their own that runs kgate's code only, before any
    worker starts, and keep the files for `supervise` to write into each worker's private folder
    (else every worker compiles them anew: seconds per kernel judged). Returns a line for the console,
    or None when there is nothing to do; a failure only means each worker compiles its own."""
    from kgate.gates.accumulation import triton_asked

    gpus = [d for d in devices if d.startswith("cuda")]
    if not triton_asked() or not gpus or PRIVATE_SEED or gpus[0] in _SEED_TRIED:
        return None  # (a failed attempt is not repeated: the caller's console has its line already)
    if importlib.util.find_spec("triton") is None:
        return None  # no Triton: the gate's torch code does it all, nothing to compile
    _SEED_TRIED.add(gpus[0])
    folder = Path(tempfile.mkdtemp(prefix="kgate-seed-"))
    try:
        done = subprocess.run(kgate_command("kgate.gates.lp_triton", "warm", str(folder), gpus[0]),
                              capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            return f"kgate's Triton kernels were not precompiled (each worker compiles its own): {done.stderr[-500:]}"
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        PRIVATE_SEED.update(files)
        return f"kgate's Triton kernels precompiled on {gpus[0]}: {len(files)} file(s) for each worker"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"kgate's Triton kernels were not precompiled (each worker compiles its own): {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# Each worker's stdout and stderr are kept up to this many bytes in its log; the rest is counted, and its last
# LOG_TAIL bytes are kept at the end: a kernel that floods its output grows neither the disk nor kgate.
LOG_CAP = 16 * 2**20
LOG_TAIL = 64 * 2**10
# How often the memory of the worker's whole process tree is summed (a walk over /proc).
TREE_POLL_S = 0.2


def _file_name(name: str) -> str:
    """A kernel's name as a file name: letters, digits, '-', '_' and '.' kept, anything else '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def kernel_caches(kernel: ResolvedKernel, base: Path | None = None) -> tuple[dict[str, str], list[Path]]:
    """The environment of a kernel's workers, and the folders they write besides their own: Triton's cache and
    torch's extension builds, one pair per kernel (its name and digest) for the whole run, so that the kernel's
    workers (one per gate or group of gates) compile its Triton kernels, build its extensions and time its
    autotuned configurations once, not once each (an autotuned matrix product compiles hundreds). Never
    shared between kernels: a kernel that could write into another's cache could leave a forged binary under
    that one's key (the audit keeps one pair per candidate the same way, kgate.audit.evaluate.worker_env). What
    a kernel writes into its own cache reaches its own workers only, as what it does in its own process does.
    The variables the manifest's `cache_env` names point into the same folder. `base` (`kgate run --cache`): the
    folders are kept there across runs, so a later run of the same kernel (same name and digest: a changed
    kernel gets a fresh folder) reuses its builds and autotuning; by default they live in a folder of this
    process, removed at exit. What a kernel's earlier runs wrote there, its later runs read: its own
    verdicts only, as within one run."""
    # not inside sandbox.run_root(): a sandboxed job sees a fresh in-memory folder there, holding its own scratch
    # folder only, so a cache in it would be each worker's alone
    root = base if base is not None else sandbox.process_folder("kgate-caches-")
    folder = root / f"{_file_name(kernel.name)[:64]}-{kernel.digest()[:16]}"
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = str(folder / "triton")
    env["TORCH_EXTENSIONS_DIR"] = str(folder / "torch_extensions")
    # Triton's autotuner keeps its timings in that cache too, so the kernel's later workers take the first's
    # choice instead of timing every configuration again (FlagGems' Hopper mm: 216 per key); the choice stays
    # the kernel's own, for this run. A caller's own setting stands.
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    # the libraries' own caches the manifest names (`cache_env`: FlagGems' tuned configurations), beside them
    for name in kernel.cache_env:
        env[name] = str(folder / "env" / name)
    for key in ("TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", *kernel.cache_env):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env, [folder]


def supervise(module: str, job: dict[str, Any], *, log_path: Path, cwd: Path, timeout: float, memory: int,
              on_event: Callable[[dict[str, Any]], str | None], env: dict[str, str] | None = None,
              cancel: threading.Event | None = None, append_log: bool = False, waits: bool = False,
              readable: list[Path] | tuple[Path, ...] = (), writable: list[Path] | tuple[Path, ...] = (),
              pass_fds: tuple[int, ...] = (), pass_env: list[str] | tuple[str, ...] = ()) -> WorkerExit:
    """Run `python -m MODULE JOB.json` in a sandbox (kgate.sandbox: the one chosen for this process) under a
    time and a memory limit, passing each event it sends to `on_event`; or rather fork it from a template
    that has imported torch already and runs MODULE's `run_job(job)` in a sandbox of the job's own
    (kgate.forkserver), where one can be used. The job gets `event_fd`, the pipe the
    worker writes its JSON lines to, and lies in the worker's own scratch folder; stdout and stderr go to
    `log_path` (appended to with `append_log`), capped at LOG_CAP. `env`: the environment to start from
    (default this process's), of which only the allow-list reaches the worker (kgate.sandbox.allowed_env);
    `readable`/`writable`: folders the worker needs to read / may write besides its scratch folder;
    `pass_fds`: further descriptors it inherits (the audit's turn files); `pass_env`: names of `env` that reach
    the worker beside the allow-list (a kernel's `cache_env`, which kgate set).
    `on_event` returns a stage name when a timed stage begins (the clock restarts, once per name), "" when the
    stage ends, None otherwise. The memory limit holds for the worker's whole process tree. A killed worker
    takes everything it started; setting `cancel` (from another thread) kills it too. With `waits`, a
    `waiting` event before the first stage stops the clock until that stage starts (a worker that waits
    for its turn on the device, kgate.audit.turns; its kgate code sends the first stage before any of the
    user's runs, so the user's code cannot stop the clock so)."""
    box = sandbox.choose()
    cell = sandbox.Cell(box)
    read_fd, write_fd = os.pipe()
    out_read, out_write = os.pipe()
    child_env = cell.env(env, extra=pass_env)  # the allow-list only: untrusted code never sees a token
    # The worker's own folder for what kgate's code in it keeps (kgate.gates.lp_triton's compiled kernels)
    private = cell.root / "private"
    for relative, data in PRIVATE_SEED.items():
        target = private / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    private.mkdir(exist_ok=True)
    child_env["KGATE_PRIVATE_DIR"] = str(private)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job = {**job, "event_fd": write_fd}
    job_path = cell.root / "job.json"  # (a forked worker gets the job itself, and this path as its argv too)
    job_path.write_text(json.dumps(job))
    proc: subprocess.Popen | forkserver.Job | None = None
    try:
        # Forked from a template that has imported torch already (kgate.forkserver), else started on its own.
        proc = forkserver.start(module, job, box=box, cell=cell, cwd=cwd, env=child_env, readable=readable,
                                writable=writable, tmpfs_bytes=memory, output=out_write, argv=[str(job_path)],
                                fds={fd: fd for fd in (write_fd, *pass_fds)})
        if proc is None:
            # Fresh pipes: nothing a template may have started for this job can write what this worker sends.
            for fd in (read_fd, write_fd, out_read, out_write):
                os.close(fd)
            read_fd, write_fd = os.pipe()
            out_read, out_write = os.pipe()
            job["event_fd"] = write_fd
            job_path.write_text(json.dumps(job))
            command = cell.command(kgate_command(module, str(job_path)), cwd=cwd, env=child_env,
                                   readable=readable, writable=writable, tmpfs_bytes=memory)
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out_write, stderr=out_write,
                                    pass_fds=(write_fd, *pass_fds), start_new_session=True, env=child_env,
                                    cwd=str(cwd))
    except BaseException:
        for fd in (read_fd, write_fd, out_read, out_write):
            os.close(fd)
        if proc is not None:
            _kill(proc)
        cell.remove()
        raise
    os.close(write_fd)
    os.close(out_write)
    log = CappedLog(open(log_path, "ab" if append_log else "wb"))  # noqa: SIM115 - closed in finally
    stage: str | None = None
    error: str | None = None
    # Starting Python, torch and the user's modules gets its own budget: on a loaded machine it alone
    # can take longer than a tight per-gate limit. A module that hangs at import still times out.
    load_timeout = max(timeout, LOAD_TIMEOUT_S)
    deadline = time.monotonic() + load_timeout
    lines = EventLines()
    started: set[str] = set()
    fatal: str | None = None
    next_tree = 0.0
    peak = 0  # the most resident memory seen in the worker's processes (a SIGKILL kgate did not send: `cause`)
    detached: dict[str, None] = {}
    selector = selectors.DefaultSelector()
    selector.register(read_fd, selectors.EVENT_READ)
    selector.register(out_read, selectors.EVENT_READ)
    events_open = True
    try:
        while True:
            ready = selector.select(timeout=POLL_S)
            for key, _ in ready:
                chunk = os.read(key.fd, 1 << 16)
                if key.fd == out_read:
                    if chunk:
                        log.write(chunk)
                    else:
                        selector.unregister(out_read)
                    continue
                if not chunk:
                    selector.unregister(read_fd)
                    events_open = False  # the worker closed the channel: it exited
                    continue
                if box.active:  # also at each event: `done` comes while what the worker left still runs
                    detached.update(dict.fromkeys(procmem.detached(proc.pid)))
                for line in lines.feed(chunk):
                    event = _parse(line)
                    if event is None:
                        continue
                    if waits and not started and event.get("event") == "waiting":
                        stage, deadline = "waiting for a turn on the device", math.inf
                    if event.get("event") == "fatal" and fatal is None:
                        fatal = str(event.get("message") or "")[:2000] or None
                    named = on_event(event)
                    if named:
                        stage = named
                        # Each stage starts the clock once: the worker's untrusted code can write to this
                        # pipe too, and a forged stage start repeated would otherwise hold off the limit.
                        if named not in started:
                            started.add(named)
                            deadline = time.monotonic() + timeout
                    elif named == "":
                        stage = None
            if not events_open:
                break
            now = time.monotonic()
            if now >= next_tree:
                next_tree = now + TREE_POLL_S
                children = procmem.parents()  # one walk over /proc for both questions
                if box.active:
                    detached.update(dict.fromkeys(procmem.detached(proc.pid, children)))
                own = proc.own(children) if isinstance(proc, forkserver.Job) else ()
                used = procmem.tree_memory(proc.pid, memory, children, skip=own)
                peak = max(peak, used)
                if used > memory:
                    error = (f"{MEMORY_LIMIT} {_fmt_bytes(memory)} (resident {_fmt_bytes(used)}): kgate's memory "
                             f"limit of {_fmt_bytes(memory)} was reached; raise `limits.memory` in the manifest or "
                             "--memory if the kernel needs more")
                    _kill(proc)
                    break
            if now > deadline:
                error = (f"timed out after {timeout:g} s in {stage}" if stage
                         else f"timed out after {load_timeout:g} s while loading")
                _kill(proc)
                break
            if cancel is not None and cancel.is_set():
                error = "cancelled (the run was interrupted)"
                _kill(proc)
                break
            if proc.poll() is not None and not any(key.fd == read_fd for key, _ in ready):
                # It may have written its last events after the select above timed out: read them first.
                if any(key.fd == read_fd for key, _ in selector.select(timeout=0)):
                    continue
                break  # exited, and no event is left to read (a leaked child may still hold the pipes)
    except BaseException:
        _kill(proc)  # interrupted: the worker is in its own process session and would outlive us
        raise
    finally:
        selector.close()
        os.close(read_fd)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
        _kill(proc)  # whatever it started and left behind (without the sandbox; with it, they died with it)
        _drain(out_read, log)
        os.close(out_read)
        log.close()
        cell.remove()
    returncode = proc.returncode
    if box.active and isinstance(proc, subprocess.Popen) and returncode is not None and returncode > 128 \
            and returncode - 128 in _SIGNALS:
        returncode = 128 - returncode  # bubblewrap exits 128 + N when its command was killed by signal N
    return WorkerExit(returncode, error, stage, fatal, list(detached), peak)


_SIGNALS = {int(s) for s in signal.Signals}


def _drain(fd: int, log: CappedLog) -> None:
    """What the worker wrote last to its output, without waiting for a leftover process that holds it."""
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 1 << 16):
            log.write(chunk)
    except (BlockingIOError, OSError):
        pass


class CappedLog:
    """A worker's log file: its first LOG_CAP bytes, then a line saying how many were dropped, then the last
    LOG_TAIL bytes of the rest."""

    def __init__(self, file: Any, cap: int = LOG_CAP, tail: int = LOG_TAIL):
        self.file, self.cap, self.tail_size = file, cap, tail
        self.written = 0
        self.dropped = 0
        self.tail = bytearray()

    def write(self, data: bytes) -> None:
        room = self.cap - self.written
        if room > 0:
            self.file.write(data[:room])
            self.written += min(room, len(data))
            data = data[room:]
        if data:
            self.dropped += len(data)
            self.tail += data
            del self.tail[:-self.tail_size]

    def close(self) -> None:
        if self.dropped:
            kept = len(self.tail)
            self.file.write(f"\n[kgate: the worker wrote {self.dropped} more bytes than the log keeps "
                            f"({_fmt_bytes(self.cap)}); their last {kept} follow]\n".encode())
            self.file.write(bytes(self.tail))
        self.file.close()


class EventLines:
    """The event pipe's bytes as lines. Each chunk is searched once (a worker writing without newlines
    cannot make every read rescan all it wrote), and a line longer than MAX_EVENT_BYTES is dropped as it
    grows: the worker's untrusted code can write to the pipe too, and must not grow kgate's memory."""

    def __init__(self, limit: int | None = None):
        self.limit = MAX_EVENT_BYTES if limit is None else limit
        self._parts: list[bytes] = []
        self._size = 0
        self._dropping = False  # the line being read grew past the limit: all of it is dropped, to its end

    def feed(self, chunk: bytes) -> list[bytes]:
        *complete, rest = chunk.split(b"\n")
        out = []
        if complete:
            if not self._dropping:
                out.append(b"".join([*self._parts, complete[0]]))
            out.extend(complete[1:])
            self._parts, self._size, self._dropping = [], 0, False
        if rest and not self._dropping:
            self._parts.append(rest)
            self._size += len(rest)
            if self._size > self.limit:
                # Its tail is dropped too, not handed on as a line of its own: a tail that starts where a
                # read happened to end would be a well-formed event after the garbage (a result forged, or
                # the flooding worker's own result, which its garbage must cost it).
                self._parts, self._size, self._dropping = [], 0, True
        return out


def _kill(proc: subprocess.Popen | forkserver.Job) -> None:
    """Kill the worker's process group and every other process of its process session: build tools put their
    children in groups of their own (ninja runs each compiler in a new process group), and those would
    otherwise compile on, orphaned, after the worker is gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in {*procmem.session_members(proc.pid), *procmem.descendants(proc.pid)}:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return event if isinstance(event, dict) else None


def _tail(path: Path, limit: int = 2000) -> str:
    """The last `limit` bytes of a log, read from its end."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            data = f.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")
