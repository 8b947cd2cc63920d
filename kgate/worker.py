"""The worker process: loads one kernel, runs its gates, reports each result as one JSON line.

Started by the runner as `python -m kgate.worker JOB.json`, or forked from a template that runs
`run_job(job)` (kgate.forkserver), with stdout and stderr going to a log
file (so nothing a kernel prints can corrupt the protocol) and results written to a pipe whose file
descriptor the job names. User code runs only here; the parent judges nothing it cannot see
from these events. A crash here, or a GPU fault that destroys this process's CUDA context (then the
worker reports `context_lost` and stops), costs the gate it happened in: the runner starts a fresh
worker for the gates not yet run.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kgate import procmem
from kgate.faults import ContextLost
from kgate.sandbox import SANDBOXED_ENV

EVENT_FD_ENV = "KGATE_EVENT_FD"
# Bound before user code runs: a kernel that patches time.perf_counter must not skew the durations.
_clock = time.perf_counter
_monotonic = time.monotonic
# The share of the per-gate time limit a searching gate may spend starting probes (Subject.deadline);
# the rest is for the probe in flight, the shrinking of a finding and the device synchronization.
SEARCH_SHARE = 0.5
# N: each gate judged under cProfile, its N functions of most own time (and of most time below them) written to the
# worker's stderr, its log: where a gate's seconds go outside the calls of user code (bench/README.md)
PROFILE_ENV = "KGATE_PROFILE_GATES"


class Channel:
    def __init__(self, fd: int):
        self._file = os.fdopen(fd, "w", buffering=1, encoding="utf-8", closefd=True)

    def send(self, event: str, **payload: Any) -> None:
        self._file.write(json.dumps({"event": event, **payload}) + "\n")
        self._file.flush()


@contextlib.contextmanager
def reporting_start(channel: Channel) -> Iterator[None]:
    """Around a worker's own start, before any user code: if it fails (torch cannot be imported, the
    memory limit is too small for kgate itself), the parent gets the cause as a `fatal` event instead of
    a bare exit code that reads like a hard exit in user code."""
    try:
        yield
    except BaseException as exc:
        channel.send("fatal", message=f"the worker could not start, before any kernel code ran: "
                                      f"{type(exc).__name__}: {exc}")
        raise


def die_with_parent() -> None:
    """Without the sandbox (whose --die-with-parent does this and more), the worker at least dies when kgate
    does, even by kill -9 (Linux's parent-death signal); elsewhere nothing happens."""
    if os.environ.get(SANDBOXED_ENV) or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # kgate died before the signal was set
        os._exit(1)


def prepare_process(job: dict[str, Any]) -> None:
    """What a worker (kgate's or the audit's) sets before it imports anything of the user's: death with kgate,
    Triton's interpreter on the CPU, its share of the CPU's threads, and the memory limit."""
    die_with_parent()
    device = job.get("device", "cpu")
    if device == "cpu":
        # Triton kernels can run on the CPU only in Triton's interpreter, which reads this at import.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch  # after the interpreter's switch above; before the limit, which is the user code's

    if job.get("threads"):  # workers side by side on the CPU share its cores instead of oversubscribing them
        torch.set_num_threads(int(job["threads"]))
    from kgate import subject

    _limit_memory(job.get("memory"), device.split(":")[0])
    subject.HOST_MEMORY = job.get("memory")  # the float64 oracle falls back to the CPU only within it


# Address space allowed on the CPU beyond the runtime's, whatever the limit: glibc's per-thread malloc
# arenas reserve address space they never touch.
MIN_ADDRESS_SPACE = 2 * 2**30


def _limit_memory(limit: int | None, device: str) -> None:
    """On the CPU, an allocation past the limit becomes a MemoryError that the gate reports (the parent
    also kills a worker whose resident memory passes it, on every device). The address space mapped
    already is not counted: a CUDA build of torch maps several GiB of libraries at import even when no
    GPU is used, which under a plain limit of a few GiB killed every CPU worker on a GPU machine before it
    started. Address-space limits break CUDA itself (it reserves huge virtual ranges): there the
    parent's resident-memory watch is the limit."""
    if limit and device == "cpu":
        soft = procmem.address_space() + max(limit, MIN_ADDRESS_SPACE)
        resource.setrlimit(resource.RLIMIT_AS, (soft, soft))


def prepare_device(name: str, gpu_memory_fraction: float | None = None):
    """The torch.device a worker runs on; for CUDA, made current (with an index: 'cuda' means the
    current device, which set_device refuses without one) and capped to its share of memory."""
    import torch

    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        if gpu_memory_fraction:
            torch.cuda.set_per_process_memory_fraction(float(gpu_memory_fraction), device)
    return device


def _error_result(gate: str, tolerance_free: bool, message: str, details: dict | None = None) -> dict[str, Any]:
    return {"gate": gate, "verdict": "error", "message": message, "tolerance_free": tolerance_free,
            "broken": True, "details": details or {}}


def _crash_on_declared_inputs(subject: Any, name: str, tolerance_free: bool, result: dict) -> dict:
    """A crash that a searching gate (shapes, layouts, distributions, accumulation) found on inputs it
    made is that gate's violation, unless the kernel raises on the manifest's own inputs as well: then
    the gate's verdict is `error` with that exception, as every other gate's is, instead of a
    failure that blames a probe (an fla kernel that refuses its backward on this GPU failed `shapes` at
    a shape shrunk to (1, 1, 1, 64) while eight gates said `error`). One more kernel call, only after
    such a failure; a crash that ended the CUDA context keeps the failure (the call would prove nothing)."""
    from kgate.faults import context_lost
    from kgate.subject import UserCodeError

    if context_lost(result.get("message")):
        return result
    case = subject.cases[0]
    try:
        subject.run_kernel(subject.inputs(case))  # the inputs alone: no reference or oracle to compute
    except UserCodeError as exc:
        if exc.role != "kernel" or context_lost(exc):
            return result
        return {**_error_result(name, tolerance_free, f"{exc} (on the manifest's own inputs, {case.label()}: "
                                f"nothing this gate's probes found can be told from that)",
                                {"traceback": exc.trace, "role": exc.role, "replaced": _summary(result)}),
                "repro": subject.repro(name, case)}
    except Exception:  # noqa: BLE001 - the check itself failed (e.g. out of memory): the finding stands
        return result
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_job(json.loads(Path(argv[0]).read_text()))


def run_job(job: dict[str, Any]) -> int:
    """The worker's work on `job` (the job file's content; also what kgate.forkserver's workers run)."""
    channel = Channel(int(job["event_fd"]))
    with reporting_start(channel):
        prepare_process(job)
        # Deferred imports: the memory limit applies to them too.
        from kgate import gates as registry
        from kgate.inputs import Case, InputFactory
        from kgate.loading import resolve
        from kgate.manifest import Ref, load
        from kgate.subject import Subject

    manifest = load(job["manifest"], check_files=False)
    kernel = manifest.by_name(job["kernel"])
    names: list[str] = job["gates"]
    device = prepare_device(job["device"], job.get("gpu_memory_fraction"))

    channel.send("loading")
    try:
        # The reference and the inputs come first, so their modules exist before the kernel's code runs.
        reference_fn = resolve(kernel.reference, "reference", manifest.base)
        factory_source = resolve(kernel.inputs, "inputs", manifest.base) if isinstance(kernel.inputs, Ref) \
            else kernel.inputs
        # What torch, kgate and the reference look like before any kernel code runs (isolation gate).
        from kgate.gates.isolation import Snapshot, install_thread_gate

        pristine = Snapshot.take(reference_fn)
        install_thread_gate()  # the kernel's threads, from its first call on, can be held (isolation)
        kernel_fn = resolve(kernel.kernel, "kernel", manifest.base)
    except BaseException as exc:  # noqa: BLE001 - user code at import time may raise anything, SystemExit too
        trace = traceback.format_exc()
        message = f"could not load: {type(exc).__name__}: {exc}"
        for name in names:
            channel.send("result", result=_error_result(name, registry.get(name).tolerance_free, message,
                                                        {"traceback": trace}))
        channel.send("done")
        return 0

    shapes = [tuple(s) for s in job["shapes"]] if job.get("shapes") else kernel.shapes
    dtypes = job.get("dtypes") or kernel.dtypes
    seeds = job.get("seeds") or kernel.seeds
    cases = [Case(shape, dtype, seed) for shape in shapes for dtype in dtypes for seed in seeds]
    subject = Subject(kernel, kernel_fn, reference_fn, InputFactory(factory_source), device, cases,
                      repro_manifest=job.get("repro_manifest", job["manifest"]))
    subject.pristine_state = pristine

    lost = run_gates(channel, subject, names, job.get("memory"), job.get("timeout"))
    if lost is not None:
        # This process can launch nothing more: the runner starts a fresh worker for the gates not run.
        channel.send("context_lost", message=lost.line, reference=lost.own)
    channel.send("done")
    return 0


def run_gates(channel: Channel, subject: Any, names: list[str], memory: int | None,
              timeout: float | None = None) -> ContextLost | None:
    """Run the named gates on `subject`, sending gate_start and result events; a gate that raises
    gets `error`. With the per-gate `timeout`, each gate's subject gets a search deadline of
    `SEARCH_SHARE` x timeout: a gate that searches (accumulation) starts no new probe after it and
    reports what it judged, instead of being killed at the limit with nothing. After each gate the
    device is synchronized (inside the gate's time), so a fault the GPU reports asynchronously is
    charged to the gate whose launches caused it. A fault that destroys the CUDA context (kgate.faults)
    gives that gate `error` (`skip` where the reference's own launches faulted on the gate's probe) and ends
    the loop: returns it as a kgate.faults.ContextLost (the caller then stops, and a fresh worker runs the
    gates not reached), else None."""
    from kgate import gates as registry
    from kgate import subject as subject_module
    from kgate.faults import context_lost, fault_message
    from kgate.shares import result_out_of_gpu_memory

    backward: list[Any] = [None]  # the gradients' subject, made when a backward gate first asks for it
    subject.calls.take()  # (calls before the first gate are not a gate's)
    for name in names:
        gate = registry.get(name)
        channel.send("gate_start", gate=name)
        start = _clock()

        with _profiled(name):
            result, lost, role, reference_fault = _attempt(gate, name, subject, backward, memory, timeout)
        out_of_memory = result_out_of_gpu_memory(result.get("verdict"), result.get("message"), result.get("details"))
        if lost is None and out_of_memory and release_caches(subject, backward[0]):
            # kgate's own caches (the baselines of recent cases: inputs, reference outputs and float64 oracles)
            # may be what left the kernel too little of the worker's share: freed, the gate is judged once more
            first = _summary(result)
            result, lost, role, reference_fault = _attempt(gate, name, subject, backward, memory, timeout)
            result.setdefault("details", {})["after_freeing_caches"] = first
        if lost is None:
            try:  # looked up on the module each time: what the gates' own calls use
                subject_module.synchronize(subject.device)
            except BaseException as exc:  # noqa: BLE001 - the device reports what the gate's launches did
                lost, role = context_lost(exc), ""
                if lost is None:
                    result = _error_result(name, gate.tolerance_free, "the device reported an error after the "
                                           f"gate's launches: {type(exc).__name__}: {exc}",
                                           {"traceback": traceback.format_exc(), "replaced": _summary(result)})
        if lost is not None and not reference_fault:
            details = {"cuda_error": lost, "first_reported_by": role or "the synchronize after the gate",
                       "replaced": _summary(result),
                       **{k: v for k, v in result.get("details", {}).items() if k == "traceback"}}
            result = {**_error_result(name, gate.tolerance_free, fault_message(lost, role), details),
                      "repro": result.get("repro") or subject.repro(name)}
        result["duration_s"] = round(_clock() - start, 4)
        result["calls"] = _calls_taken(subject, backward[0])
        channel.send("result", result=result)
        if lost is not None:
            return ContextLost(lost, role, reference_fault)
    return None


@contextlib.contextmanager
def _profiled(gate: str) -> Iterator[None]:
    """With $KGATE_PROFILE_GATES=N, the gate judged inside under cProfile and its N costliest functions, by own
    time and by time below them, written to stderr (the worker's log); else nothing."""
    try:
        top = int(os.environ.get(PROFILE_ENV) or 0)
    except ValueError:
        top = 0
    if top <= 0:
        yield
        return
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        for key in ("tottime", "cumulative"):
            text.write(f"kgate: gate {gate}, the {top} functions of most {key}\n")
            stats.sort_stats(key).print_stats(top)
        sys.stderr.write(text.getvalue())
        sys.stderr.flush()


def _calls_taken(subject: Any, backward: Any) -> dict[str, dict[str, float]]:
    """The calls of user code a gate made (`kgate.subject.CallClock`), its gradients' subject's added."""
    calls = subject.calls.take()
    for role, seen in (backward.calls.take() if backward is not None else {}).items():
        held = calls.setdefault(role, {"calls": 0, "s": 0.0})
        held["calls"] += seen["calls"]
        held["s"] = round(held["s"] + seen["s"], 4)
    return calls


def _attempt(gate: Any, name: str, subject: Any, backward: list[Any], memory: int | None,
             timeout: float | None) -> tuple[dict[str, Any], str | None, str, bool]:
    """One judgement of gate `name` on `subject` (its gradients' subject, for a backward gate, made into
    backward[0] once): the result, the lost context's line (or None), who reported it, and whether the
    reference's own launches lost it (the gate's verdict then stands)."""
    from kgate import gates as registry
    from kgate.faults import context_lost, reference_fault_message
    from kgate.shrink import CRASH
    from kgate.subject import UserCodeError

    lost: str | None = None
    role = "kernel"
    reference_fault = False
    try:
        target = subject
        if registry.is_backward(name):  # the same gate, judging the gradients (kgate/backward.py)
            if backward[0] is None:
                from kgate.backward import BackwardSubject

                backward[0] = BackwardSubject(subject)
            target = backward[0]
        target.deadline = _monotonic() + SEARCH_SHARE * timeout if timeout else None
        result = gate.check(target).to_json()
        result["gate"] = name
        if result["verdict"] == "fail" and result.get("details", {}).get("kind") == CRASH:
            result = _crash_on_declared_inputs(target, name, gate.tolerance_free, result)
    except UserCodeError as exc:
        lost, role = context_lost(exc), exc.role
        hint = ""
        if isinstance(exc.exc, MemoryError):
            hint = f" (the worker's memory limit is {memory} bytes; raise limits.memory if legitimate)"
        result = _error_result(name, gate.tolerance_free, str(exc) + hint, {"traceback": exc.trace,
                                                                           "role": exc.role})
    except ContextLost as exc:  # in a call to the reference: see kgate.faults.ContextLost
        lost, role, reference_fault = exc.line, exc.role, exc.own
        trace = "".join(traceback.format_exception(exc.exc or exc))
        if exc.own:  # the gate's verdict stands: a skip (else the fault is the kernel's, below)
            result = {"gate": name, "verdict": "skip", "tolerance_free": gate.tolerance_free,
                      "message": reference_fault_message(exc.line, exc.role), "repro": subject.repro(name),
                      "details": {"cuda_error": exc.line, "first_reported_by": exc.role,
                                  "reference_fault": True, "traceback": trace}}
        else:
            result = _error_result(name, gate.tolerance_free, f"{exc.role} raised: {exc.line}",
                                   {"traceback": trace, "role": exc.role})
    except BaseException as exc:  # noqa: BLE001 - a gate bug must not lose the other gates' results
        lost = context_lost(exc)
        result = _error_result(name, gate.tolerance_free, f"kgate internal error in gate {name}: "
                               f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()})
    return result, lost, role, reference_fault


def release_caches(*subjects: Any) -> bool:
    """Free what kgate keeps between gates on `subjects` (their cached baselines) and return the caching
    allocator's unused blocks to the device; whether anything was held."""
    import gc

    held = False
    for subject in subjects:
        if subject is not None:
            held = subject.release_caches() or held
    if held:
        import torch

        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    return held


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The verdict a gate had reached before the device said otherwise (kept in the details)."""
    return {"verdict": result.get("verdict"), "message": result.get("message")}


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Skip interpreter teardown: user extensions and CUDA contexts sometimes crash there.
    os._exit(code)
