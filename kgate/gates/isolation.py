"""isolation: the kernel computes its answer now, from its inputs, and touches nothing else.
Tolerance-free. Nine probes:

- plain results: every output is a plain, strided, materialized `torch.Tensor` (no subclass, no
  lazy wrapper, no meta tensor, no pending conjugate/negative bit);
- no work after return: outputs read at once (a device-side copy on the current stream, before any
  synchronization) equal the outputs after joining the threads the call started and synchronizing
  the device. Allocations are NaN-poisoned during this probe so unfinished work shows, and the first
  call's new threads are held before they run (`held_threads`: a busy machine on purpose);
- no memoization: the inputs are overwritten in place with another seed's values (same tensors,
  same addresses), then with their own values permuted, then with their sorted integer arguments' boundaries
  moved (`_boundaries_moved`: offsets with repeated boundaries, the same length and ends), and the kernel
  called again; the result must equal a call on fresh copies of
  the new values (for a `nondeterministic` kernel: it must not be the old result where the oracle
  changed). The first call's outputs must not change under the second call (a reused buffer);
- outputs stay owned: the outputs of OWNED_CALLS calls on other inputs, all kept, are unchanged by the
  later calls (a buffer reused from a ring);
- parameters followed: an nn.Module kernel's parameters and persistent buffers changed in place, alike
  with the reference's equal ones (an optimizer step, load_state_dict, a step written through `.data` that
  leaves the version counters as they were, as an optimizer's own Triton or CUDA kernel does, and one class
  alone, written so too): the kernel must not
  return its previous output where the change shows (a cache of derived weights it does not refresh);
- no patching: the callables of torch (functions, Tensor methods), of kgate, of time, of builtins and
  of the reference's module (and its code objects) are the same objects after the calls as before the
  kernel's module was imported (or, in-process, before this gate's calls);
- random generators left alone: from the same states, a generator the reference's call leaves as it was
  (torch's CPU generator, the kernel's CUDA device's, Python's `random`, numpy's global one) the kernel's call
  must leave as it was too (`RandomStreams`): a kernel that draws from it changes every random number its
  caller draws afterwards;
- state after a rejected call: a call on a variant of the inputs the reference rejects (a floating-point argument's
  last dimension narrowed by one, then the argument in int64, then its last dimension widened by one; the first the
  reference raises on, at most REJECTED_TRIES tried, else the probe is skipped), which the kernel may raise on or
  accept, must leave the kernel's result on the inputs of before as it was: bitwise where two calls before agree
  bitwise, else within the oracle bound. State changed during a call and put back at its end (a weight swapped
  to its transposed view around a matmul, a flag set and reset without try/finally) stays changed when the call
  raises part-way. Parameters are not in the lockstep; buffers are, and a change the variant's call leaves in
  them counts only where the reference's calls write none (`buffers_as_left`). The modules' state is put back
  after;
- process state unchanged: torch's numerics switches, grad/autocast modes, default dtype and device,
  thread count and the floating-point environment's flush-to-zero/denormals-are-zero modes (`_flags`)
  are as they were at the same moment, after this gate's calls and one more on the inputs in float64
  (state set from the inputs' dtype changes only on another dtype's inputs); and after one more call with the
  settings a kernel sets for speed (thread count, cuDNN autotuning: `MOVED_SETTINGS`)
  moved to another value first, each still as moved (a kernel that sets the value the judging process happens
  to have, `torch.set_num_threads(1)` in a worker given one thread, changes a user's process all the same).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import pickle
import random
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten, index_of, overlaps
from kgate.faults import context_lost
from kgate.gates.base import Gate, GateResult
from kgate.gates.initialization import NAN_BYTE, AllocationHook, prefill_allocator
from kgate.inputs import Case
from kgate.oracle import CPU_GENERATOR, LeafError, measure, seeded_draws, torch_generator_states
from kgate.replay import MATMUL_SETTINGS
from kgate.subject import Baseline, ModuleState, Subject, UserCodeError, synchronize, unless_rejected

JOIN_S = 2.0  # how long to wait for threads the kernel started
HOLD_S = 0.5  # how long a thread the kernel starts is held before it runs (first call of each case)
SETTLE_S = 0.2  # how long a held thread an earlier call started gets to run before the outputs are re-read
PROBES = 3  # calls of the work-after-return probe
OTHER_SEED = 7919  # offset of the seed whose values overwrite the inputs in the memoization probe
OWNED_CALLS = 8  # outputs-stay-owned probe: calls whose outputs are kept (a buffer reused every k < 8 calls shows)
PARAMETER_SEED = 104729  # seeds the new values of the parameters probe
STEP_PIECE = 1 << 22  # parameters probe: elements of a class drawn at once (float64, on the values' device)
THROUGH_DATA = ("written through .data (version counters unchanged, as an optimizer's own Triton or CUDA kernel "
                "leaves them)")
SINGLE_CLASS_PROBES = 6  # parameters probe: how many groups of equal parameters are also changed alone
IN_EVAL_MODE = "in eval mode (module.eval()), after an eval-mode call"
FRESH_CALLS = 8  # memoization probe: fresh calls that must all agree, and differ from the in-place call's, to blame it

_WATCHED_PREFIXES = ("torch", "kgate", "triton.testing")
_DUNDERS = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__sub__",
                      "__mul__", "__truediv__", "__matmul__", "__getitem__", "__setitem__", "__torch_function__",
                      "__torch_dispatch__", "__call__"})
_monotonic = time.monotonic  # bound at import, before kernel code runs (the worker imports this module first)
_WATCHED_MODULES = ("time", "builtins", "math", "operator", "functools")


def floating_point_environment() -> dict[str, bool]:
    """The calling thread's floating-point environment as it shows in arithmetic: flush-to-zero (a
    subnormal result becomes 0: the x86 MXCSR FTZ bit, ARM's FPCR FZ) and denormals-are-zero (a subnormal
    operand reads as 0: MXCSR DAZ). Python's float arithmetic runs on the same unit as the CPU's kernels, so
    the results reveal the modes without reading registers (portable; `torch.set_flush_denormal`, a
    `-ffast-math` extension loaded with crtfastmath, or `_mm_setcsr` all show)."""
    smallest_normal = 2.2250738585072014e-308
    subnormal = 5e-324
    return {"flush-to-zero (subnormal results become 0)": smallest_normal / 4.0 == 0.0,
            "denormals-are-zero (subnormal operands read as 0)": subnormal * 2.0 ** 60 == 0.0}


class RandomStreams:
    """The process's global random generators, whose stream a caller's later draws continue: torch's CPU
    generator, torch's generator of the kernel's CUDA device, Python's `random` and, where imported, numpy's
    global generator. `take` reads their states, `put` sets them back."""

    def __init__(self, device: torch.device):
        self.device = device

    def take(self) -> dict[str, Any]:
        states: dict[str, Any] = {**torch_generator_states(self.device if self.device.type == "cuda" else None),
                                  "Python's random module": random.getstate()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            states["numpy's global generator"] = numpy.random.get_state()
        return states

    def put(self, states: dict[str, Any]) -> None:
        for name, state in states.items():
            if name == CPU_GENERATOR:
                torch.set_rng_state(state)
            elif name == "Python's random module":
                random.setstate(state)
            elif name == "numpy's global generator":
                sys.modules["numpy"].random.set_state(state)
            else:
                torch.cuda.set_rng_state(state, self.device)

    @staticmethod
    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return torch.equal(a, b)
        return pickle.dumps(a) == pickle.dumps(b)


def _flag_getters() -> dict[str, Any]:
    """Where each process-wide numerics setting is read (a getter called without arguments)."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    getters: dict[str, Any] = {
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
        "torch.get_default_dtype()": torch.get_default_dtype,
        "torch.get_default_device()": getattr(torch, "get_default_device", None),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled,
        "torch.is_deterministic_algorithms_warn_only_enabled()":
            getattr(torch, "is_deterministic_algorithms_warn_only_enabled", None),
        "torch.is_grad_enabled()": torch.is_grad_enabled,
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled,
        "torch.get_num_threads()": torch.get_num_threads,
        "torch.backends.cudnn.enabled": lambda: cudnn.enabled,
        "torch.backends.cudnn.allow_tf32": lambda: cudnn.allow_tf32,
        "torch.backends.cudnn.deterministic": lambda: cudnn.deterministic,
        "torch.backends.cudnn.benchmark": lambda: cudnn.benchmark,
        "torch.backends.mkldnn.enabled": lambda: torch.backends.mkldnn.enabled,
        "torch.backends.cuda.preferred_linalg_library()": cuda.preferred_linalg_library,
    }
    for name in MATMUL_SETTINGS:
        getters[f"torch.backends.cuda.matmul.{name}"] = lambda name=name: getattr(cuda.matmul, name)
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
                 "fp16_bf16_reduction_math_sdp_allowed"):
        getters[f"torch.backends.cuda.{name}()"] = getattr(cuda, name, None)
    getters["torch.backends.fp32_precision"] = lambda: torch.backends.fp32_precision
    for device in ("cpu", "cuda"):
        getters[f"torch.is_autocast_enabled({device!r})"] = lambda device=device: torch.is_autocast_enabled(device)
        getters[f"torch.get_autocast_dtype({device!r})"] = lambda device=device: torch.get_autocast_dtype(device)
    return getters


def _set_cudnn_benchmark(value: bool) -> None:
    torch.backends.cudnn.benchmark = value


class Setting(NamedTuple):
    """A process-wide setting: how to read it, how to set it, and another legal value than a given one."""

    get: Callable[[], Any]
    set: Callable[[Any], None]
    other: Callable[[Any], Any]


# Process-wide settings a kernel may set to a fixed value for speed: `Isolation.settings_moved` moves them before
# a call. (Not the fp32 matmul precision: its legacy setter cannot put back the newer per-backend settings it
# overwrites.)
MOVED_SETTINGS: dict[str, Setting] = {
    "torch.get_num_threads()": Setting(torch.get_num_threads, torch.set_num_threads, lambda n: n + 1),
    "torch.backends.cudnn.benchmark": Setting(lambda: torch.backends.cudnn.benchmark, _set_cudnn_benchmark,
                                              lambda on: not on),
}


def _flags() -> dict[str, Any]:
    """Process-wide numerics state a kernel could change and leave changed, altering what the reference (and
    every later computation) computes: torch's numerics switches, grad and autocast modes, default dtype and
    device, thread count, and the floating-point environment's flush-to-zero / denormals-are-zero modes.
    A setting this torch does not have is left out."""
    flags: dict[str, Any] = {}
    for name, getter in _flag_getters().items():
        if getter is None:
            continue
        try:
            flags[name] = getter()
        except (AttributeError, RuntimeError, TypeError):
            continue
    for name, on in floating_point_environment().items():
        flags[f"floating-point environment: {name}"] = on
    return flags


def _watched(value: Any) -> bool:
    return callable(value) or isinstance(value, types.ModuleType)


@dataclass
class Snapshot:
    """Identity of every watched callable (and code object), plus the numerics flags."""

    objects: dict[tuple[str, str], Any]
    flags: dict[str, Any]

    @classmethod
    def take(cls, reference_fn: Any = None) -> Snapshot:
        with warnings.catch_warnings():  # touching deprecated aliases warns
            warnings.simplefilter("ignore")
            return cls(cls._objects(reference_fn), _flags())

    @staticmethod
    def _objects(reference_fn: Any) -> dict[tuple[str, str], Any]:
        objects: dict[tuple[str, str], Any] = {}
        modules = [(n, m) for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType) and
                   (n in _WATCHED_MODULES or any(n == p or n.startswith(p + ".") for p in _WATCHED_PREFIXES))]
        ref_module = sys.modules.get(getattr(reference_fn, "__module__", None) or "")
        if ref_module is None and reference_fn is not None:
            ref_module = sys.modules.get(getattr(type(reference_fn), "__module__", "") or "")
        if ref_module is not None:
            modules.append(("reference module " + ref_module.__name__, ref_module))
        for name, module in modules:
            try:
                items = list(vars(module).items())
            except TypeError:
                continue
            for key, value in items:
                if key.startswith("__") or not _watched(value):
                    continue
                objects[(name, key)] = value
                code = getattr(value, "__code__", None)
                if code is not None and name.startswith("reference module"):
                    objects[(name, key + ".__code__")] = code
        for klass in (torch.Tensor, torch.nn.Module, torch.cuda.Event):
            # Resolved through the class hierarchy, so a method set on torch.Tensor that shadows one of
            # torch._C.TensorBase counts as a replacement.
            for key in dir(klass):
                if key.startswith("__") and key not in _DUNDERS:
                    continue
                try:
                    objects[(f"{klass.__module__}.{klass.__qualname__}", key)] = getattr(klass, key)
                except AttributeError:
                    continue
        if reference_fn is not None:
            target = reference_fn.forward if isinstance(reference_fn, torch.nn.Module) else reference_fn
            code = getattr(getattr(target, "__func__", target), "__code__", None)
            if code is not None:
                objects[("reference", "__code__")] = code
        return objects

    def changes(self, later: Snapshot) -> list[str]:
        """What differs in `later`: the numerics settings first (one switch can replace many objects:
        torch.set_default_dtype swaps torch.Storage), then the replaced or deleted objects."""
        found = [f"{name} changed from {value!r} to {later.flags.get(name)!r}"
                 for name, value in self.flags.items() if later.flags.get(name) != value]
        for (where, key), value in self.objects.items():
            now = later.objects.get((where, key), _MISSING)
            if now is _MISSING:
                # A module may disappear from sys.modules (reloaded, deleted): that is not patching.
                if any(w == where for (w, _k) in later.objects):
                    found.append(f"{where}.{key} was deleted")
            elif now is not value and not (isinstance(now, types.MethodType) and now == value) \
                    and not _torch_rewrap(now, value):
                found.append(f"{where}.{key} was replaced (by {_describe(now)})")
        return found


_MISSING = object()
_TORCH_DIR = str(Path(torch.__file__).parent)


def _torch_rewrap(now: Any, before: Any) -> bool:
    """torch itself re-wraps a few functions when torch._dynamo is imported (torch.manual_seed in
    torch._disable_dynamo): same function underneath, wrapper defined inside torch."""
    code = getattr(now, "__code__", None)
    return getattr(now, "__wrapped__", None) is before and code is not None and \
        code.co_filename.startswith(_TORCH_DIR)


def _describe(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{module}.{name}" if module else name


class _ThreadGate:
    """Holds the Python threads started after `install_thread_gate` (the kernel's thread pools, created on any
    of its calls) while a hold is on: each such thread carries a trace hook (`threading.settrace`) that, on
    each Python function call it makes, waits while the hold lasts. kgate's own threads (named `kgate...`)
    and the main thread are never held."""

    def __init__(self) -> None:
        self.installed = False
        self.release = threading.Event()
        self.release.set()
        self.until = 0.0
        self.held: set[str] = set()  # names of the threads held since the hold began

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if not self.release.is_set():
            thread = threading.current_thread()
            if not thread.name.startswith("kgate"):
                self.held.add(thread.name)
                self.release.wait(max(0.0, self.until - _monotonic()))
        return None


_GATE = _ThreadGate()


def install_thread_gate() -> None:
    """Make the threads started from now on holdable (`held_threads` holds them even when they were started
    by an earlier call, a thread pool's idle workers); the workers call it before loading the user's code."""
    if not _GATE.installed:
        threading.settrace(_GATE.hook)
        _GATE.installed = True


@contextlib.contextmanager
def held_threads(hold_s: float) -> Any:
    """Threads started by `threading` inside the block run only once `release` (yielded) is called or
    after `hold_s`, whichever comes first: a busy machine, made on purpose. A kernel that waits for its
    threads (join, a future's result) waits `hold_s` longer and is right; one that gives its thread a
    bounded head start (a sleep, a join with a timeout, shorter than the hold) returns before the thread has
    begun, so its unfinished output shows whatever the size and the machine. Done with `threading.settrace`
    (each new thread calls the hook once, on its first Python call), the previous hook put back after.
    Where `install_thread_gate` ran first, the threads started since are held too (a pool whose workers
    an earlier call started): on their next Python call."""
    if hold_s > 0 and _GATE.installed:
        _GATE.until = _monotonic() + hold_s
        _GATE.held.clear()
        _GATE.release.clear()
    release = threading.Event()
    previous = threading.gettrace()

    def hold(frame: Any, event: str, arg: Any) -> None:
        release.wait(hold_s)
        sys.settrace(previous)
        return None

    def release_all() -> None:
        release.set()
        _GATE.release.set()

    threading.settrace(hold)
    try:
        yield release_all
    finally:
        threading.settrace(previous)
        release_all()


def child_processes() -> set[int]:
    """The process ids of this process's living children (Linux: read from /proc; elsewhere the children
    `multiprocessing` started)."""
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        import multiprocessing

        return {p.pid for p in multiprocessing.active_children() if p.pid is not None}
    found = set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[0] != "Z" and int(fields[1]) == me:
            found.add(int(entry))
    return found


def lazy_problem(t: Any) -> str | None:
    """Why an output is not a plain materialized tensor, or None."""
    if not isinstance(t, torch.Tensor):
        return None
    if type(t) is not torch.Tensor:
        return f"is a {type(t).__module__}.{type(t).__qualname__} (a torch.Tensor subclass), not a plain tensor"
    if t.layout != torch.strided:
        return f"has layout {t.layout}, not torch.strided"
    if t.is_meta:
        return "is a meta tensor (no data)"
    if t.is_conj() or t.is_neg():
        return "carries a lazy conjugate/negative bit (call .resolve_conj()/.resolve_neg())"
    return None


def _leaves(out: Any) -> list[tuple[str, torch.Tensor]]:
    return [(p, t) for p, t in flatten(out) if isinstance(t, torch.Tensor)]


@dataclass
class ParameterClass:
    """Parameters (or persistent buffers) of the kernel's and the reference's modules that hold the same
    values: same kind, shape, dtype, device, bitwise equal. Each side may hold several (tied weights,
    zero-initialized biases); a class is changed as a whole, so which of equal tensors is which never
    matters."""

    kind: str  # "parameter" or "buffer"
    reference: list[tuple[str, torch.Tensor]]
    kernel: list[tuple[str, torch.Tensor]]

    @property
    def numel(self) -> int:
        return self.reference[0][1].numel()

    def names(self) -> str:
        kernel = ", ".join(n for n, _ in self.kernel[:3]) + (" ..." if len(self.kernel) > 3 else "")
        reference = ", ".join(n for n, _ in self.reference[:3]) + (" ..." if len(self.reference) > 3 else "")
        return f"the kernel's {kernel} (the reference's {reference})"

    def shifts_zeros(self, offset_zeros: bool) -> bool:
        """Whether `offset_zeros` makes this class's step an addition of noise: a buffer class all of whose
        values are zero (a running mean as built, which scaling would leave at zero)."""
        return offset_zeros and self.kind == "buffer" and not bool(self.reference[0][1].detach().any())

    def additive(self, offset_zeros: bool = False) -> bool:
        """Whether the class's change is added to its values (a parameter, or a shifted buffer of zeros), not
        multiplied into them."""
        return self.kind == "parameter" or self.shifts_zeros(offset_zeros)

    def change(self, seed: int, offset_zeros: bool = False) -> torch.Tensor:
        """What an optimizer step does to every tensor of the class: a parameter gets `add_(change)`, change
        ~ +-50% of the values plus noise of their mean magnitude; a buffer (running statistics, masks)
        `mul_(change)`, change in [0.5, 1.5): signs and zeros kept, so a variance stays positive and a 0/1 mask
        keeps its pattern. A tensor sorted along its last dimension (`_sorted_rows`: bin edges) gets one factor and
        one noise value per row, so it stays sorted. With `offset_zeros`, a buffer class that is all zeros gets `add_(change)`, change
        uniform in [-0.5, 0.5) (as running statistics move a running mean away from its zeros as built). The
        change depends only on the class's values, the seed and the device's random generator. It is drawn in
        float64 on the values' device (a generator of the device's own, never its
        global one; on the CPU where the device has none), a piece of STEP_PIECE elements at a time, and kept
        in the class's dtype on its device, so a weight of billions of elements costs one more tensor like it,
        not several float64 copies, and no trip through the host."""
        values = self.reference[0][1].detach()
        flat = values.reshape(-1)
        gen, work = _piece_generator(values.device, seed)
        shift = self.shifts_zeros(offset_zeros)
        scale = 0.0
        if self.kind == "parameter" and flat.numel():
            total = sum(float(flat[i:i + STEP_PIECE].to(work, torch.float64).abs().sum())
                        for i in range(0, flat.numel(), STEP_PIECE))
            scale = total / flat.numel()
        out = torch.empty_like(values, memory_format=torch.contiguous_format)
        if not shift and _sorted_rows(values):
            # sorted along its last dimension (bin edges, thresholds, a sorted table): one factor and one noise value
            # per row, so the row stays sorted (a positive factor and a common shift keep the order) and stays in
            # the domain of the searches and bucketizing that read it
            rows = values.shape[:-1] + (1,)
            factor = 0.5 + torch.rand(rows, generator=gen, dtype=torch.float64, device=work)
            if self.kind == "parameter":
                noise = torch.rand(rows, generator=gen, dtype=torch.float64, device=work) - 0.5
                factor = values.to(work, torch.float64) * (factor - 1.0) + (scale or 1.0) * noise
            out.copy_(factor.expand(values.shape).to(out.device, out.dtype))
            return out
        dest = out.view(-1)
        for i in range(0, flat.numel(), STEP_PIECE):
            piece = flat[i:i + STEP_PIECE].to(work, torch.float64)
            factor = 0.5 + torch.rand(piece.shape, generator=gen, dtype=torch.float64, device=work)
            if shift:
                factor = factor - 1.0
            elif self.kind == "parameter":
                noise = torch.rand(piece.shape, generator=gen, dtype=torch.float64, device=work) - 0.5
                factor = piece * (factor - 1.0) + (scale or 1.0) * noise
            dest[i:i + piece.numel()] = factor.to(dest.device, dest.dtype)
        return out

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the class, once each (kernel and reference may share one)."""
        return list({id(t): t for _, t in [*self.reference, *self.kernel]}.values())

    def apply_step(self, seed: int, offset_zeros: bool = False, through_data: bool = False) -> None:
        """The step, in place. `through_data`: written through `.data`, whose writes leave the tensors' version
        counters as they were (as an optimizer's own Triton or CUDA kernel, or `p.data.add_`, leaves them)."""
        add = self.additive(offset_zeros)  # (before the change: it reads the values as they are)
        change = self.change(seed, offset_zeros)
        with torch.no_grad():
            for t in self.tensors():
                target = t.data if through_data else t
                if add:
                    target.add_(change)
                else:
                    target.mul_(change)


def _sorted_rows(values: torch.Tensor) -> bool:
    """Whether every row of `values` along its last dimension (at least 2 elements) is non-decreasing and not
    constant (a constant row, zeros as built, is a state the step is meant to move, not an order)."""
    if values.dim() == 0 or values.shape[-1] < 2 or not values.numel() or not values.is_floating_point() \
            or values.numel() > STEP_PIECE:
        return False
    v = values.detach()
    return bool((v[..., 1:] >= v[..., :-1]).all()) and bool((v[..., -1] > v[..., 0]).all())


def _piece_generator(device: torch.device, seed: int) -> tuple[torch.Generator, torch.device]:
    """A private generator seeded with `seed` on `device`, and the device the pieces are drawn on: `device`
    itself, or the CPU where torch makes no generator for it."""
    if device.type != "cpu":
        try:
            return torch.Generator(device=device).manual_seed(seed), device
        except RuntimeError:
            pass
    return torch.Generator().manual_seed(seed), torch.device("cpu")


def _named_state(module: torch.nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(kind, name, tensor) of a module's floating-point parameters and persistent buffers (what an optimizer
    or load_state_dict changes; a non-persistent buffer is a constant of the module)."""
    persistent = set(module.state_dict(keep_vars=True))
    found = [("parameter", n, p) for n, p in module.named_parameters()]
    found += [("buffer", n, b) for n, b in module.named_buffers() if n in persistent]
    return [(kind, n, t) for kind, n, t in found if t.is_floating_point()]


def parameter_classes(kernel: torch.nn.Module, reference: torch.nn.Module) -> list[ParameterClass]:
    """The classes of equal values that both modules hold (see ParameterClass), largest first. A tensor of
    one module that no tensor of the other equals is left out: the kernel's own derived tensors (a fused
    weight it registered) and the reference's tensors the kernel does not hold cannot be changed alike."""
    classes: list[ParameterClass] = []

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and \
            torch.equal(a.detach(), b.detach())

    with torch.no_grad():
        for kind, name, t in _named_state(reference):
            group = next((c for c in classes if c.kind == kind and same(c.reference[0][1], t)), None)
            if group is None:
                classes.append(ParameterClass(kind, [(name, t)], []))
            else:
                group.reference.append((name, t))
        for kind, name, t in _named_state(kernel):
            group = next((c for c in classes if c.kind == kind and same(c.reference[0][1], t)), None)
            if group is not None:
                group.kernel.append((name, t))
    return sorted((c for c in classes if c.kernel), key=lambda c: -c.numel)


def _load_changed(modules: tuple[torch.nn.Module, ...], classes: list[ParameterClass], seed: int) -> None:
    """load_state_dict of new weights into each module: its state dict with every tensor of `classes`
    stepped (as ParameterClass.change, one new tensor per class for all modules), loaded as load_state_dict
    loads (in place: the same tensors, the same addresses)."""
    new: dict[int, torch.Tensor] = {}
    for c in classes:
        value = c.change(seed)  # made the new value in place (no second tensor of the class's size at once)
        with torch.no_grad():
            (value.add_ if c.additive() else value.mul_)(c.reference[0][1].detach())
        new.update((id(t), value) for t in c.tensors())  # the class's tensors are equal: one new value for all
    for module in modules:
        names = {n: id(t) for _, n, t in _named_state(module)}
        state = module.state_dict()
        module.load_state_dict({k: new.get(names.get(k, -1), v) for k, v in state.items()})


class Isolation(Gate):
    name = "isolation"
    summary = "no memoization, no work after return, no patching of torch/reference/timers, plain results"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        before = getattr(subject, "pristine_state", None) or Snapshot.take(subject.raw_reference_fn)
        since = "before the kernel's module was imported" if getattr(subject, "pristine_state", None) \
            else "before this gate's calls"
        cases = subject.first_seed_cases()
        memo_checked = 0
        parameters = rejected = ""
        try:
            for case in cases:
                result = self.plain_and_settled(subject, case)
                if result is not None:
                    return result
                result, checked = self.memoization(subject, case)
                if result is not None:
                    return result
                memo_checked += checked
            if cases:
                result = self.outputs_owned(subject, cases[0])
                if result is not None:
                    return result
                result, parameters = self.parameters(subject, cases[0])
                if result is not None:
                    return result
                result = self.random_streams(subject, cases[0])
                if result is not None:
                    return result
                result, rejected = self.rejected_call(subject, cases[0])
                if result is not None:
                    return result
                result = self.settings_moved(subject, cases[0])
                if result is not None:
                    return result
                self.call_in_float64(subject, cases[0])  # last: a later call in the case's dtype would undo what it set
        finally:
            patched = before.changes(Snapshot.take(subject.raw_reference_fn))
        if patched:
            return self.failed(subject, f"the kernel changed what it must not touch: {patched[0]}"
                               + (f" (and {len(patched) - 1} more)" if len(patched) > 1 else ""),
                               case=cases[0] if cases else None, expected=f"unchanged since {since}",
                               got=patched[0], where=patched[0].split(" ")[0], details={"patched": patched})
        memo = f"memoization probed in {memo_checked} case(s)" if memo_checked else \
            "memoization not probed (inputs of another seed differ in shape or no tensor input)"
        return self.passed(f"plain results, nothing finished after return ({PROBES} probes), {memo}, outputs of "
                           f"{OWNED_CALLS} calls stay unchanged, "
                           + (f"{parameters}, " if parameters else "") + "no patching, process state unchanged, "
                           "random generators drawn from only where the reference draws"
                           + (f", {rejected}" if rejected else ""))

    def plain_and_settled(self, subject: Subject, case: Case) -> GateResult | None:
        base = subject.baseline(case)
        sizes = [t.numel() * t.element_size() for _, t in _leaves(base.reference)]
        for probe in range(PROBES):
            args = clone_tree(base.args)
            prefill_allocator(subject.device, sizes, NAN_BYTE)  # outputs not written yet then read as NaN
            threads, children = set(threading.enumerate()), child_processes()
            # the first call's threads are held: work it hands to a thread shows unfinished at return
            with held_threads(HOLD_S if probe == 0 else 0.0) as release, AllocationHook(poison=NAN_BYTE):
                out = subject.run_kernel(args, sync=False)
                # Read at once: on a GPU the copies queue on the current stream, ahead of any sync. A fault
                # of the kernel's launches can surface in these copies, kgate's first CUDA calls after it.
                try:
                    early = [(p, t.detach().clone()) if lazy_problem(t) is None else (p, None)
                             for p, t in _leaves(out)]
                except RuntimeError as exc:  # torch.AcceleratorError is one
                    raise UserCodeError("kernel", exc) from exc
                # what the call started that still runs at its return
                running = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
                processes = sorted(child_processes() - children)
                release()
            for path, t in _leaves(out):
                problem = lazy_problem(t)
                if problem:
                    return self.failed(subject, f"{path} {problem}", case=case, expected="a plain torch.Tensor",
                                       got=type(t).__qualname__, where=path)
            started = [t for t in threading.enumerate() if t not in threads]
            deadline = _monotonic() + JOIN_S
            for thread in started:
                thread.join(max(0.0, deadline - _monotonic()))
            # threads that existed before the call (a pool an earlier call started) and were held in it: they
            # cannot be joined; they get SETTLE_S to run what the call handed them before the outputs are re-read
            pooled = sorted(n for n in _GATE.held if n not in {t.name for t in started}) if probe == 0 else []
            if pooled:
                time.sleep(SETTLE_S)
                running += [f"{name} (started by an earlier call, held in this one)" for name in pooled]
            try:
                synchronize(subject.device)
            except Exception as exc:  # noqa: BLE001 - an asynchronous kernel fault surfaces here
                raise UserCodeError("kernel", exc) from exc
            for (path, first), (_, final) in zip(early, _leaves(out)):
                if first is None:
                    continue
                mismatch = bitwise_mismatch(final, first)
                if mismatch:
                    causes = ([f"{len(running)} thread(s) it started, still running at return "
                               f"({', '.join(running)})"] if running else []) + \
                        ([f"{len(processes)} child process(es) it started, alive at return (pids "
                          f"{', '.join(map(str, processes))})"] if processes else [])
                    cause = "; ".join(causes) or "work on another stream or on a thread that existed before the call"
                    return self.failed(
                        subject, f"{path} was still being written after the kernel returned ({cause}): after join/"
                        f"synchronize vs read at once, {mismatch.describe()}" +
                        (f"; the call's threads were held {HOLD_S:g} s before running (a busy machine)"
                         if probe == 0 and running else ""), case=case,
                        expected=repr(mismatch.expected), got=repr(mismatch.got),
                        where=f"{path}{list(mismatch.index)}",
                        details={"threads": running, "processes": processes, "held_s": HOLD_S if probe == 0 else 0})
        return None

    def random_streams(self, subject: Subject, case: Case) -> GateResult | None:
        """The kernel draws from no global random generator the reference leaves alone: from the same states,
        a call of the reference and one of the kernel; a generator the reference's call left as it was and the
        kernel's moved on is one whose every later draw (dropout masks, sampling, data order) the kernel
        changes. The states are put back after."""
        streams = RandomStreams(subject.device)
        args = subject.baseline(case).args
        saved = streams.take()
        try:
            with seeded_draws() as reference_draws:  # a KernelBench pair's calls run seeded, their states put back
                subject.run_reference(clone_tree(args))
            after_reference = streams.take()
            streams.put(saved)
            with seeded_draws() as kernel_draws:
                subject.run_kernel(clone_tree(args))
            after_kernel = streams.take()
        finally:
            streams.put(saved)
        moved = [name for name, state in saved.items()
                 if streams.same(after_reference.get(name), state) and not streams.same(after_kernel.get(name), state)]
        moved += sorted(kernel_draws - reference_draws - set(moved))
        if not moved:
            return None
        return self.failed(subject, f"the kernel draws from {moved[0]}, which the reference's call leaves as it "
                           f"was: every random number the program draws after the kernel (dropout masks, sampling, "
                           f"data order) changes with it in place" + (f"; also {', '.join(moved[1:])}"
                                                                      if len(moved) > 1 else ""),
                           case=case, expected=f"{moved[0]}: unchanged by the call", got="moved on by the call",
                           where=moved[0], details={"generators": moved})

    def rejected_call(self, subject: Subject, case: Case) -> tuple[GateResult | None, str]:
        """State after a rejected call: a call on a variant of the case's inputs that the reference rejects
        (`rejected_variants`, the first the reference raises on, at most REJECTED_TRIES tried), made between
        calls on the case's own inputs, must not change the kernel's result on them. A kernel that changes its
        own state during a call and puts it back at the end (a weight swapped to its transposed view around a
        matmul, a flag set and reset, a cache half-written) keeps it changed when the call raises part-way,
        and every later call is wrong. The kernel may raise on the variant or accept it (a wider domain is
        allowed): only what it does on the case's inputs after it is judged, bitwise against the two calls
        before it where they agree bitwise, else (a kernel not deterministic on them) within the oracle bound
        where the first was (`changed_result`). The modules' parameters and buffers are saved first and put
        back after (`ModuleState`; the reference's rejected calls may change its own). Returns (a failure or
        None, what was probed)."""
        if subject.out_of_time():
            return None, "state after a rejected call not probed (the gate's time is spent)"
        base = subject.baseline(case)
        modules = subject.modules()
        state = ModuleState(subject, modules) if modules is not None else None
        try:
            found, tried = None, []
            # Off the CPU an index out of range is a device-side assert that loses the context, not an exception:
            # an index input in range of an argument's own size can be out of range of it narrowed (class
            # targets of logits one class narrower), and a kernel that gathers with it, as torch's own ops do,
            # would end the run where the reference raises on the shape first. There no argument is narrowed.
            indices = any(isinstance(a, torch.Tensor) and not a.is_floating_point() and not a.is_complex()
                          and a.dtype != torch.bool for a in base.args)
            narrow = subject.device.type == "cpu" or not indices
            for variant, what in itertools.islice(rejected_variants(base.args, narrow=narrow), REJECTED_TRIES):
                tried.append(what)
                if unless_rejected(lambda variant=variant: (subject.run_reference(clone_tree(variant)),)) is None:
                    found = (variant, what)
                    break
            if found is None:
                return None, "state after a rejected call not probed (" + (
                    f"the reference accepts each variant of the inputs tried: {'; '.join(tried)}" if tried
                    else "no floating-point tensor argument to vary") + ")"
            variant, what = found
            with buffers_as_left(subject):
                before = [self.kept_call(subject, base.args) for _ in range(2)]
                layouts = {n: (tuple(t.shape), t.stride()) for n, t in modules[0].named_parameters()} \
                    if modules is not None else {}
                try:
                    subject.run_kernel(clone_tree(variant))
                    outcome = "the kernel accepted it"
                except UserCodeError as exc:
                    if exc.role != "kernel" or context_lost(exc) is not None:
                        raise
                    outcome = f"the kernel raised {_brief(exc.exc)}"
                changed = parameters_changed(modules[0], layouts, state.saved()) \
                    if modules is not None and state is not None else []
                preceded = f"after a call on inputs the reference rejects ({what}; {outcome}" + \
                    (f"; it left the kernel's parameters changed: {', '.join(changed)})" if changed else ")")
                details = {"rejected_variant": what, "kernel_outcome": outcome, "changed": changed}
                try:
                    after = self.kept_call(subject, base.args)
                except UserCodeError as exc:
                    if exc.role != "kernel" or context_lost(exc) is not None:
                        raise
                    return self.failed(
                        subject, f"{preceded}, the kernel raised {_brief(exc.exc)} on the inputs it had returned "
                        f"a result for before: {STATE_KEPT}", case=case, expected="the result of the calls before",
                        got=f"raised {type(exc.exc).__name__}", details={**details, "raised": True}), ""
            deterministic = not subject.nondeterministic and len(before[0]) == len(before[1]) and all(
                bitwise_mismatch(a, b) is None for (_, a), (_, b) in zip(*before))
            finding = changed_result(subject, before[0], after, base, deterministic)
        finally:
            if state is not None:
                state.close()
        if finding is None:
            return None, f"state unchanged after a call on inputs the reference rejects ({what}; {outcome})"
        path, how, expected, got, index = finding
        return self.failed(
            subject, f"{path}: {preceded}, the kernel's result on the inputs it was given before changed ({how}): "
            f"{STATE_KEPT}", case=case, expected=expected, got=got, where=f"{path}{index}",
            details={**details, "raised": False, "deterministic": deterministic}), ""

    def kept_call(self, subject: Subject, args: tuple) -> list[tuple[str, torch.Tensor]]:
        """The outputs of a call on fresh copies of `args` (`call_zeroed`), copied at once (by path)."""
        return [(p, t.detach().clone()) for p, t in _leaves(self.call_zeroed(subject, clone_tree(args)))]

    @staticmethod
    def call_in_float64(subject: Subject, case: Case) -> None:
        """One call on the case's inputs in float64, the oracle's dtype, which the reference accepts by
        construction, whatever the kernel makes of it (it may raise): a kernel that sets process-wide state
        from its inputs (`torch.set_default_dtype(x.dtype)`) leaves it changed only on inputs of another
        dtype, and the process-state comparison after this gate's calls sees it then. float64 alone: its
        buffers are larger than any other dtype's, so a kernel that reads them as float32 stays inside them."""
        if case.dtype == "float64" or subject.out_of_time():
            return
        args = tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in clone_tree(subject.baseline(case).args))
        with contextlib.suppress(UserCodeError):
            subject.run_kernel(args)

    def settings_moved(self, subject: Subject, case: Case) -> GateResult | None:
        """One call with the process-wide settings a kernel sets for speed (`MOVED_SETTINGS`: thread count, cuDNN
        autotuning) moved to another legal value first, as a user's process may have
        them: each must be as moved after the call, the settings put back after. The comparison of the process
        state before and after the gate's calls cannot see a kernel that sets one to the value the judging
        process happens to have (`torch.set_num_threads(1)` in a worker given one thread)."""
        if subject.out_of_time():
            return None
        saved = {name: setting.get() for name, setting in MOVED_SETTINGS.items()}
        moved = {name: setting.other(saved[name]) for name, setting in MOVED_SETTINGS.items()}
        try:
            for name, value in moved.items():
                MOVED_SETTINGS[name].set(value)
            with contextlib.suppress(UserCodeError):  # (whatever the kernel makes of them: only the settings count)
                subject.run_kernel(clone_tree(subject.baseline(case).args))
            after = {name: MOVED_SETTINGS[name].get() for name in moved}
        finally:
            for name, value in saved.items():
                MOVED_SETTINGS[name].set(value)
        changed = [(name, value, after[name]) for name, value in moved.items() if after[name] != value]
        if not changed:
            return None
        name, value, now = changed[0]
        return self.failed(subject, f"the kernel sets {name} to {now!r} and leaves it so: set to {value!r} before "
                           "the call (as a user's process may have it), it was changed by the call", case=case,
                           expected=f"{name} == {value!r} after the call", got=f"{name} == {now!r}", where=name,
                           details={"changed": [f"{n}: {v!r} -> {w!r}" for n, v, w in changed]})

    def outputs_owned(self, subject: Subject, case: Case) -> GateResult | None:
        """OWNED_CALLS calls on other inputs (other seeds), every output kept: after each call, every earlier
        call's outputs must still hold what they held when returned. A kernel that hands out a buffer from a
        ring of k (k < OWNED_CALLS) is caught at call k + 1, one that reuses its last output at call 2."""
        kept: list[tuple[int, str, torch.Tensor, torch.Tensor]] = []
        inputs: list[tuple] = []
        for call in range(1, OWNED_CALLS + 1):
            args = subject.inputs(Case(case.shape, case.dtype, case.seed + OTHER_SEED * call))
            out = subject.run_kernel(args)
            inputs.append(args)
            for number, path, t, copy in kept:
                if any(isinstance(a, torch.Tensor) and overlaps(t, a) for previous in inputs for a in previous):
                    continue  # an output aliasing an input changes with it; the contract gate judges aliasing
                mismatch = bitwise_mismatch(copy, t)
                if mismatch:
                    return self.failed(
                        subject, f"{path} returned by call {number} was overwritten by call {call} (calls on other "
                        f"inputs, every output kept): the kernel hands out a buffer it reuses every "
                        f"{call - number} call(s) ({mismatch.describe()})", case=case, expected=repr(mismatch.expected),
                        got=repr(mismatch.got), where=f"{path}{list(mismatch.index)}",
                        details={"overwritten_call": number, "by_call": call})
            kept += [(call, p, t, t.detach().clone()) for p, t in _leaves(out)]
        return None

    def parameters(self, subject: Subject, case: Case) -> tuple[GateResult | None, str]:
        """The modules' parameters and persistent buffers changed in place between calls, alike in kernel
        and reference (see ParameterClass): an optimizer-style step of all of them, load_state_dict of new
        weights, then a step of each of the largest classes alone (a kernel that caches one derived tensor,
        a transposed weight or a folded normalization, and refreshes the rest); for modules built in training
        mode, a step of all of them once more in eval mode, after an eval-mode call (a weight packed at the first
        eval-mode call and kept, where every training-mode call packs afresh). Where the previous output is
        wrong for the new parameters by more than the oracle bound (the change shows), a kernel that returns
        its previous output bitwise again is stale. Returns (a failure or None, what was probed)."""
        modules = subject.modules()
        if modules is None:
            return None, ""
        try:
            classes = parameter_classes(*modules)
        except Exception as exc:  # noqa: BLE001 - a module's own state_dict hooks may raise
            return None, f"parameters not probed (state_dict raised {type(exc).__name__}: {exc})"
        if not classes:
            return None, "parameters not probed (kernel and reference hold no equal parameters)"
        base = subject.baseline(case)
        probes: list[tuple[str, str, Any]] = [
            ("step", "an optimizer-style in-place step of every parameter and buffer",
             lambda: [c.apply_step(PARAMETER_SEED) for c in classes]),
            ("load_state_dict", "load_state_dict of new weights (loaded in place)",
             lambda: _load_changed(modules, classes, PARAMETER_SEED + 1)),
            ("step", f"an optimizer-style step of every parameter and buffer {THROUGH_DATA}",
             lambda: [c.apply_step(PARAMETER_SEED + 2 + SINGLE_CLASS_PROBES, through_data=True) for c in classes])]
        if len(classes) > 1:
            for i, c in enumerate(classes[:SINGLE_CLASS_PROBES]):
                probes.append(("step", f"an in-place step of {c.names()} alone, {THROUGH_DATA}",
                               lambda c=c, i=i: c.apply_step(PARAMETER_SEED + 2 + i, through_data=True)))
        # modules built in training mode: the step again in eval mode, after an eval-mode call (a weight packed at
        # the first eval-mode call and kept, which training-mode calls rebuild every time)
        if modules[1].training:
            # written through .data: a weight derived at the first eval-mode call and kept under a key of the
            # parameters' version counters (which .data leaves alone) or addresses is stale either way
            probes.append(("step", f"an optimizer-style step of every parameter and buffer {THROUGH_DATA}, "
                           f"{IN_EVAL_MODE}", lambda: [c.apply_step(PARAMETER_SEED + 3 + SINGLE_CLASS_PROBES,
                                                                    through_data=True) for c in classes]))
        modes = [(m, m.training) for module in modules for m in module.modules()]
        state = ModuleState(subject, modules)
        done = 0
        try:
            for kind, what, change in probes:
                if done and subject.out_of_time():
                    break
                truth = None  # in eval mode, the truth before the change is the eval-mode one
                if what.endswith(IN_EVAL_MODE):
                    for module in modules:
                        module.eval()
                    truth = (dict(_leaves(subject.run_reference(clone_tree(base.args)))),
                             dict(_leaves(subject.oracle(base.args))))
                # the output before the change, made on the state as it is now (the restored one after an
                # earlier probe): restoring moved the version counters, so a cache keyed on a version (of one
                # parameter, while another changes alone) is rebuilt here, not by the call after the change
                previous = _leaves(self.call_zeroed(subject, clone_tree(base.args)))
                try:
                    change()
                except Exception:  # noqa: BLE001 - a module's own state-dict hooks may refuse
                    if kind != "load_state_dict":
                        raise
                    state.restore()
                    continue
                subject.changed_state()
                finding = self.stale_after(subject, case, base, previous, what, kind, truth)
                state.restore()
                done += 1
                if finding is not None:
                    return finding, ""
        finally:
            for m, training in modes:
                m.training = training
            state.close()
        return None, f"parameters changed in place {done} way(s) ({len(classes)} class(es) of equal parameters)"

    def stale_after(self, subject: Subject, case: Case, base: Baseline, previous: list[tuple[str, torch.Tensor]],
                    what: str, kind: str, before: tuple[dict, dict] | None = None) -> GateResult | None:
        """After a change of the parameters: the kernel's output returned bitwise again though the truth moved
        past the bound (stale), or moved but missing the bound where its previous output was within it (part of
        the parameters not refreshed, a formula right only for them as they were). `before`: the truth before the
        change, by path (reference's, oracle's); default the case's baseline."""
        args = base.args
        now = _leaves(self.call_zeroed(subject, clone_tree(args)))
        reference = dict(_leaves(subject.run_reference(clone_tree(args))))
        oracle = dict(_leaves(subject.oracle(args)))
        before = before or (dict(_leaves(base.reference)), dict(_leaves(base.oracle)))
        found, _ = first_stale(subject, previous, now, (reference, oracle), before)
        if found is not None:
            path, moved = found
            return self.failed(
                subject, f"{path}: after {what}, alike in kernel and reference, the kernel returned its previous "
                f"output bitwise again, while the reference's changed (the previous output is now off by "
                f"{moved.err:.3g} at {path}{moved.index}, bound {moved.bound:.3g}): it computes from a copy of "
                "its parameters it does not refresh (a cache keyed on data_ptr or a version counter, or built once?)", case=case,
                expected=f"a result for the new parameters (e.g. {moved.expected:.6g} at {path}{moved.index})",
                got=f"the previous output ({moved.got:.6g} there)", where=f"{path}{moved.index}",
                details={"stale": True, "parameters": kind, "change": what})
        tol = subject.tolerance
        earlier = dict(previous)
        for path, got in now:
            want, old = oracle.get(path), earlier.get(path)
            if not (isinstance(want, torch.Tensor) and isinstance(old, torch.Tensor) and want.shape == got.shape
                    and isinstance(before[1].get(path), torch.Tensor) and before[1][path].shape == old.shape):
                continue
            if not measure(old, before[0].get(path), before[1][path], path=path, factor=tol.factor, ulps=tol.ulps,
                           atol=tol.atol).passed:
                continue  # off before the change too: the oracle gate's finding
            after = measure(got, reference.get(path), want, path=path, factor=tol.factor, ulps=tol.ulps,
                            atol=tol.atol)
            if not after.passed:
                return self.failed(
                    subject, f"{path}: after {what}, alike in kernel and reference, the kernel's output misses the "
                    f"oracle bound where it met it before the change: {after.describe()} (a copy of some "
                    "parameters it does not refresh, or a formula right only for the parameters as they were?)",
                    case=case, expected=f"{after.expected!r} (float64 oracle, the new parameters)", got=repr(after.got),
                    where=after.where, details={"stale": False, "parameters": kind, "change": what,
                                                "ratio": after.ratio})
        return None

    @staticmethod
    def call_zeroed(subject: Subject, args: tuple) -> Any:
        """A call whose fresh allocations start as zeros, so a kernel that leaves memory unwritten (the
        initialization gate's business) gives the same result every time here."""
        with AllocationHook(poison=0):
            return subject.run_kernel(args)

    def memoization(self, subject: Subject, case: Case) -> tuple[GateResult | None, int]:
        """The inputs overwritten in place, first with another seed's values, then with their own values
        permuted (each tensor reversed along its last dimension longer than 1: the same values, so the same
        sums, minimum, maximum and span, which a cache keyed on checksums or a range cannot tell apart), then with
        their sorted integer arguments' boundaries moved (`_boundaries_moved`), each where the reference accepts
        it, and the kernel called again on the same tensors (`overwritten`). Returns (a failure or None, whether
        probed)."""
        base = subject.baseline(case)
        other = subject.inputs(Case(case.shape, case.dtype, case.seed + OTHER_SEED))
        probed = 0
        def accepted(values: tuple | None) -> tuple | None:
            if values is None:
                return None
            values = subject.conform(base.args, values)  # (a triangular input stays triangular)
            if unless_rejected(lambda: (subject.run_reference(clone_tree(values)), subject.oracle(values))) is None:
                return None  # outside the reference's domain (offsets that must increase)
            return values

        for values, what in ((other, "other values"), (accepted(_permuted(base.args)), "their own values permuted"),
                             (accepted(_boundaries_moved(base.args, case.seed)),
                              "their sorted integer arguments' boundaries moved (repeated: empty segments; the "
                              "same length, the same ends)")):
            if values is None:
                continue
            result, checked = self.overwritten(subject, case, base, values, what)
            probed = probed or checked
            if result is not None:
                return result, probed
        if not probed:
            return None, 0
        return self.memo_unversioned(subject, case), 1

    def overwritten(self, subject: Subject, case: Case, base: Baseline, other: tuple,
                    what: str) -> tuple[GateResult | None, int]:
        pairs = [(i, a, b) for i, (a, b) in enumerate(zip(base.args, other)) if isinstance(a, torch.Tensor)]
        if len(other) != len(base.args) or not pairs or any(
                not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype for _, a, b in pairs):
            return None, 0
        if all(torch.equal(a, b) for _, a, b in pairs):
            return None, 0
        args = clone_tree(base.args)
        first_out = self.call_zeroed(subject, args)
        first = [(p, t, t.detach().clone()) for p, t in _leaves(first_out)]
        for i, _, new in pairs:
            args[i].copy_(new)  # same tensors, same addresses, new values
        second = [(p, t.detach().clone()) for p, t in _leaves(self.call_zeroed(subject, args))]
        for path, kept, copy in first:
            if any(isinstance(a, torch.Tensor) and overlaps(kept, a) for a in args):
                continue  # an output aliasing an input changes with it; the contract gate judges aliasing
            mismatch = bitwise_mismatch(copy, kept)
            if mismatch:
                return self.failed(
                    subject, f"{path} of the first call changed when the kernel was called again: it returns a "
                    f"buffer it reuses ({mismatch.describe()})", case=case, expected=repr(mismatch.expected),
                    got=repr(mismatch.got), where=f"{path}{list(mismatch.index)}"), 1
        # The previous result for new values: memoized on identity or address, whatever else happens.
        new_oracle = dict(_leaves(subject.oracle(other)))
        new_reference = dict(_leaves(subject.run_reference(clone_tree(other))))
        before = (dict(_leaves(base.reference)), dict(_leaves(base.oracle)))
        found, _ = first_stale(subject, [(p, c) for p, _, c in first], second, (new_reference, new_oracle), before)
        if found is not None:
            path, moved = found
            return self.failed(
                subject, f"{path}: after the inputs were overwritten in place with {what} (same "
                f"addresses), the kernel returned its previous result again, {moved_by(moved)} (memoized on "
                "the tensors' identity, address or a summary of their values?)", case=case,
                expected=f"a result for the new values (e.g. {moved.expected:.6g} at {path}{moved.index})",
                got=f"the previous result ({moved.got:.6g} there)", where=f"{path}{moved.index}",
                details={"stale": True, "overwritten_with": what}), 1
        if subject.nondeterministic:
            return None, 1
        fresh = [(p, t.detach().clone()) for p, t in _leaves(self.call_zeroed(subject, clone_tree(other)))]
        for (path, now), (_, want) in zip(second, fresh):
            mismatch = bitwise_mismatch(want, now)
            if mismatch is None:
                continue
            # Tell memoization from a kernel that is merely not deterministic: more fresh calls (FRESH_CALLS in
            # all). One that differs from the first fresh call, or that gives the in-place call's result, shows
            # results that vary from call to call (the determinism gate's business); a kernel whose partial sums
            # arrive in a random order has few orders, so one more call alone often repeats the first.
            for _ in range(FRESH_CALLS - 1):
                again = [t.detach().clone() for _, t in _leaves(self.call_zeroed(subject, clone_tree(other)))]
                if any(bitwise_mismatch(w, a) for (_, w), a in zip(fresh, again)) or \
                        all(bitwise_mismatch(s, a) is None for (_, s), a in zip(second, again)):
                    return None, 1
            return self.failed(
                subject, f"{path}: after the inputs were overwritten in place with {what} (same addresses), the "
                f"kernel's result differs from a call on fresh copies of the same values: {mismatch.describe()}",
                case=case, expected=repr(mismatch.expected), got=repr(mismatch.got),
                where=f"{path}{list(mismatch.index)}", details={"stale": False, "overwritten_with": what}), 1
        return None, 1


    def memo_unversioned(self, subject: Subject, case: Case) -> GateResult | None:
        """One element of a floating-point input changed through `.data`: the tensor's version counter stays
        as it was, as after a Triton or CUDA kernel's in-place write. A kernel that keys a cache on the
        address, the version and a sample of the values returns its previous result; where the truth changed
        with that element, that is stale. Where the truth does not move with the element chosen (a top-k's
        output ignores most of its input), the next position is tried (`unversioned_positions`: a seeded one,
        then the largest and the smallest magnitudes, which a selection's or a norm's output follows), each on
        fresh copies of the inputs, until one moves it."""
        base = subject.baseline(case)
        floats = [i for i, a in enumerate(base.args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                  and a.numel() > 1 and i not in subject.inplace]
        if not floats:
            return None
        gen = torch.Generator().manual_seed(case.seed + OTHER_SEED)
        i = floats[int(torch.randint(len(floats), (), generator=gen))]
        before = (dict(_leaves(base.reference)), dict(_leaves(base.oracle)))
        for index in unversioned_positions(base.args[i], gen):
            args = clone_tree(base.args)
            first = [(p, t.detach().clone()) for p, t in _leaves(self.call_zeroed(subject, args))]
            old = float(args[i][index])
            new = -2 * old if old != 0 and math.isfinite(old) else 1.0
            version = args[i]._version
            args[i].data[index] = new  # .data: the version counter does not move
            if args[i]._version != version:
                return None
            changed = subject.conform(base.args, clone_tree(args))
            if any(not torch.equal(a, b) for a, b in zip(changed, args) if isinstance(a, torch.Tensor)):
                continue  # the change leaves the inputs' known structure (a triangular matrix's zeros)
            second = [(p, t.detach().clone()) for p, t in _leaves(self.call_zeroed(subject, args))]
            truth = unless_rejected(lambda args=args: dict(_leaves(subject.oracle(clone_tree(args)))))
            reference = unless_rejected(lambda args=args: dict(_leaves(subject.run_reference(clone_tree(args)))))
            if truth is None or reference is None:
                continue  # the changed element leaves the reference's domain: no truth to be stale against
            found, followed = first_stale(subject, first, second, (reference, truth), before)
            if found is not None:
                path, moved = found
                where = ", ".join(map(str, index))
                return self.failed(
                    subject, f"{path}: after argument {i}[{where}] was changed in place without a version "
                    f"bump (through .data, as a kernel's own write leaves it), the kernel returned its previous "
                    f"result again, {moved_by(moved)} (a cache keyed on the address, the version counter or a "
                    "sample of the values?)", case=case,
                    expected=f"a result for the new values (e.g. {moved.expected:.6g} at {path}{moved.index})",
                    got=f"the previous result ({moved.got:.6g} there)", where=f"{path}{moved.index}",
                    details={"stale": True, "unversioned": True})
            if followed:  # the kernel followed the change: not keyed on what was changed
                return None
        return None


UNVERSIONED_TRIES = 3  # positions memo_unversioned changes, one at a time, until the truth moves with one


def unversioned_positions(t: torch.Tensor, gen: torch.Generator) -> list[tuple[int, ...]]:
    """Where memo_unversioned changes one element of `t`, in turn: a seeded position past the first element,
    then the largest and the smallest finite magnitudes (at most UNVERSIONED_TRIES, no position twice)."""
    shape = tuple(t.shape)
    flat = [1 + int(torch.randint(t.numel() - 1, (), generator=gen))]
    magnitudes = t.detach().reshape(-1).abs().double()
    finite = torch.isfinite(magnitudes)
    if bool(finite.any()):
        inf = torch.tensor(math.inf, dtype=torch.float64, device=magnitudes.device)
        flat.append(int(torch.where(finite, magnitudes, -inf).argmax()))
        flat.append(int(torch.where(finite, magnitudes, inf).argmin()))
    return [index_of(f, shape) for f in dict.fromkeys(flat)][:UNVERSIONED_TRIES]


def first_stale(subject: Subject, earlier: list[tuple[str, torch.Tensor]], later: list[tuple[str, torch.Tensor]],
                now: tuple[dict, dict], before: tuple[dict, dict]) -> tuple[tuple[str, LeafError] | None, bool]:
    """The first output the kernel returned bitwise again after a change although it is `stale` now (its path and
    LeafError), or None; and whether any output followed the change (changed bitwise). `earlier`/`later`: the
    kernel's outputs by path before and after the change; `now`/`before`: the truth after and before it."""
    followed = False
    for (path, old), (_, got) in zip(earlier, later):
        if bitwise_mismatch(old, got) is not None:
            followed = True
            continue
        moved = stale(subject, path, old, now, before)
        if moved is not None:  # else the change does not show in this output beyond the bound
            return (path, moved), followed
    return None, followed


def stale(subject: Subject, path: str, old: torch.Tensor, now: tuple[dict, dict],
          before: tuple[dict, dict]) -> LeafError | None:
    """The one criterion of every stale-result probe: `old`, a kernel output from before the inputs or
    parameters changed, judged with the oracle gate's bound against the truth before the change and after it
    (`before`, `now`: the reference's and the oracle's leaves by path). The LeafError against the truth after,
    where `old` was within the bound before and is off by more than it after (the change shows, so returning
    it again is stale); None where it is within the bound after as well (a kernel within the bound need not
    move with a one-ulp move of the rounded truth), was off before (the oracle gate's finding, not a stale
    one) or the leaf is not comparable."""
    tol = subject.tolerance
    judged = []
    for reference, oracle in (before, now):
        want = oracle.get(path)
        if not isinstance(want, torch.Tensor) or want.shape != old.shape:
            return None
        judged.append(measure(old, reference.get(path), want, path=path, factor=tol.factor, ulps=tol.ulps,
                              atol=tol.atol))
    was, moved = judged
    return moved if was.passed and not moved.passed else None


def _boundaries_moved(args: tuple, seed: int) -> tuple | None:
    """`args` with each sorted integer tensor (offsets, cu_seqlens) given repeated boundaries
    (`distributions.repeated_boundaries`: the same shape and ends, empty segments in the middle), the
    others as they are; None where none is sorted or none changes. Another seed's inputs often differ in shape
    there (the indices' count follows the offsets), and a permutation leaves them unsorted: this keeps both."""
    # (imported here: distributions imports the oracle gate, which imports this module)
    from kgate.gates.distributions import repeated_boundaries

    out, changed = list(args), False
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dtype != torch.bool and a.numel():
            moved = repeated_boundaries(a.detach(), torch.Generator(device=a.device).manual_seed(seed))
            if moved is not None and not torch.equal(moved, a):
                out[i], changed = moved, True
    return tuple(out) if changed else None


def _permuted(args: tuple) -> tuple | None:
    """`args` with every tensor of more than one element reversed along its last dimension longer than 1 (the
    memoization probe's second overwrite), or None where that changes none."""
    def flip(t: torch.Tensor) -> torch.Tensor:
        dims = [d for d in range(t.dim()) if t.shape[d] > 1]
        return t.flip(dims[-1]) if dims else t.clone()
    out = tuple(flip(a) if isinstance(a, torch.Tensor) else a for a in clone_tree(args))
    changed = any(isinstance(a, torch.Tensor) and not torch.equal(a, b) for a, b in zip(args, out))
    return out if changed else None


REJECTED_TRIES = 6  # state-after-a-rejected-call probe: variants of the inputs offered to the reference, at most
STATE_KEPT = ("state the kernel changes during a call and puts back at its end (a weight swapped to another view, a "
              "flag, a half-written cache) stays changed when the call raises part-way (put it back in a finally "
              "block, or change nothing in place)")


def rejected_variants(args: tuple, *, narrow: bool = True) -> Iterator[tuple[tuple, str]]:
    """Variants of `args` that references commonly reject, each with one floating-point tensor argument changed,
    and what was changed: every such argument's last dimension narrowed by one (unless `narrow` is false), then
    every one in int64 (its values truncated; the same shape, and a buffer at least as large as any floating
    dtype's, which a kernel that reads it as its own dtype stays inside), then every one's last dimension
    widened by one (its last column repeated). The wider input comes last: it is the one a kernel or a
    reference that does not check its shape reads past the end of (a weight's rows, an embedding table; on a
    GPU, a fault that ends the process). Made one at a time, on fresh copies."""
    floats = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]

    def narrowed(t: torch.Tensor) -> tuple[torch.Tensor, str] | None:
        if t.dim() == 0 or t.shape[-1] < 2:
            return None
        return (t.detach()[..., :-1].clone(), f"last dimension narrowed from {t.shape[-1]} to {t.shape[-1] - 1} (shape "
                f"{tuple(t.shape[:-1]) + (t.shape[-1] - 1,)})")

    def integer(t: torch.Tensor) -> tuple[torch.Tensor, str] | None:
        return t.detach().nan_to_num().to(torch.int64), "dtype int64, its values truncated to integers, shape unchanged"

    def widened(t: torch.Tensor) -> tuple[torch.Tensor, str] | None:
        if t.dim() == 0 or t.shape[-1] < 1:
            return None
        return (torch.cat([t.detach(), t.detach()[..., -1:]], dim=-1),
                f"last dimension widened from {t.shape[-1]} to {t.shape[-1] + 1} (shape "
                f"{tuple(t.shape[:-1]) + (t.shape[-1] + 1,)}, its last column repeated)")

    for change in (narrowed, integer, widened) if narrow else (integer, widened):
        for i in floats:
            made = change(args[i])
            if made is not None:
                variant = list(clone_tree(args))
                variant[i] = made[0]
                yield tuple(variant), f"argument {i}: {made[1]}"


@contextlib.contextmanager
def buffers_as_left(subject: Subject) -> Iterator[None]:
    """The kernel's calls inside the block start from its buffers as its previous call left them, where the
    reference's calls write none (`Lockstep.stateful` false): there the buffers are constants of a call (a
    mask, a table, statistics in eval mode), and one a raised call leaves changed is as wrong as a parameter
    left changed, which the lockstep, setting them before every call, would hide. Where the reference's calls
    write its buffers (running statistics in training, a step counter), they are history every call moves by
    design, judged in lockstep with the reference's: the lockstep sets them as usual, and a raised call's
    change to them is not judged."""
    lockstep = subject.lockstep
    if lockstep is None or lockstep.stateful:
        yield
        return
    with lockstep.kernel_left_alone():
        yield


def parameters_changed(module: torch.nn.Module, layouts: dict[str, tuple], saved: dict[int, torch.Tensor]) -> list[str]:
    """The parameters of `module` whose shape or strides differ from `layouts` (by name) or whose values differ
    from their saved copies (`ModuleState.saved`), each described ('linear.weight (strides (256, 1) -> (1, 256);
    values changed)')."""
    found = []
    for name, t in module.named_parameters():
        what = []
        shape, stride = layouts.get(name, (tuple(t.shape), t.stride()))
        if tuple(t.shape) != shape:
            what.append(f"shape {shape} -> {tuple(t.shape)}")
        elif t.stride() != stride:
            what.append(f"strides {stride} -> {t.stride()}")
        copy = saved.get(id(t))
        if copy is not None and copy.shape == t.shape and bitwise_mismatch(copy, t.detach()) is not None:
            what.append("values changed")
        if what:
            found.append(f"{name} ({'; '.join(what)})")
    return found


def changed_result(subject: Subject, before: list[tuple[str, torch.Tensor]], after: list[tuple[str, torch.Tensor]],
                   base: Baseline, deterministic: bool) -> tuple[str, str, str, str, list] | None:
    """The first output of `after` that is not what it was in `before` (path, how, expected, got, index), or
    None: other outputs, shapes or dtypes; else, where the kernel is `deterministic` on these inputs, any bit;
    else an output within the oracle bound (against `base`'s truth) in `before` and beyond it in `after`."""
    if [p for p, _ in after] != [p for p, _ in before]:
        return "outputs", "other outputs", str([p for p, _ in before]), str([p for p, _ in after]), []
    tol = subject.tolerance
    reference, oracle = dict(_leaves(base.reference)), dict(_leaves(base.oracle))
    for (path, was), (_, now) in zip(before, after):
        if now.shape != was.shape or now.dtype != was.dtype:
            return path, "its shape or dtype", f"{tuple(was.shape)} {was.dtype}", f"{tuple(now.shape)} {now.dtype}", []
        if deterministic:
            mismatch = bitwise_mismatch(was, now)
            if mismatch is not None:
                return path, f"bitwise, the kernel being deterministic on them: {mismatch.describe()}", \
                    repr(mismatch.expected), repr(mismatch.got), list(mismatch.index)
            continue
        want = oracle.get(path)
        if not isinstance(want, torch.Tensor) or want.shape != was.shape:
            continue
        first, moved = (measure(t, reference.get(path), want, path=path, factor=tol.factor, ulps=tol.ulps,
                                atol=tol.atol) for t in (was, now))
        if first.passed and not moved.passed:
            return path, f"within the oracle bound before, now off by {moved.err:.3g} (bound {moved.bound:.3g})", \
                f"{moved.expected:.6g}", f"{moved.got:.6g}", moved.index or []
    return None


def _brief(exc: BaseException, limit: int = 160) -> str:
    """'TypeError: message' for a failure message, its first line cut to `limit` characters."""
    line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {line[:limit]}" + ("..." if len(line) > limit else "")


def moved_by(moved: LeafError) -> str:
    """'which is now off by E at PATH[I], bound B' for a stale-result failure message."""
    return f"which is now off by {moved.err:.3g} at {moved.path}{moved.index} (bound {moved.bound:.3g})"


GATE = Isolation
