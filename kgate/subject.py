"""The subject of the gates: one kernel, its reference, its inputs and its options, inside a worker.

Gates never call user code directly: they go through `Subject`, which tells a kernel's exception
from a reference's or a factory's, synchronizes the device after a call, keeps pristine copies of
the inputs and caches the float64 oracle per case.

A reference declares its input domain by raising on inputs outside it. Gates that make up inputs
(special_values, distributions, accumulation) go through `unless_rejected` and `within_domain`: a
probe the reference (or its float64 oracle) rejects is skipped and listed (`rejected_note`), one
that changes several arguments at once is retried one argument at a time, and a kernel's exception
is never taken for a rejection.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import shlex
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from kgate import procmem
from kgate.compare import (
    bits,
    bitwise_differ,
    bitwise_mismatch,
    clone_tree,
    element_owners,
    flatten,
    map_tensors,
    members_differ,
    tensors,
)
from kgate.faults import ContextLost, context_lost
from kgate.inputs import Case, InputFactory
from kgate.manifest import ResolvedKernel, Tolerance
from kgate.oracle import DtypeDispatch, TermMagnitudes, Terms, oracle_call, own_dtype, upcast

_monotonic = time.monotonic  # bound at import, before any kernel code runs (it may patch time)

T = TypeVar("T")


class UserCodeError(Exception):
    """User code (kernel, reference or inputs factory) raised; `role` says whose code it was."""

    def __init__(self, role: str, exc: BaseException):
        self.role = role
        self.exc = exc
        self.trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        super().__init__(f"{role} raised {type(exc).__name__}: {exc}")


class CallClock:
    """The calls a gate made of user code, by role ("kernel", "reference", "oracle"; "oracle on cpu" for an
    oracle the gate asked of the host), each with its count and seconds (a call's wall time, the device
    synchronized after it, so on a GPU mostly its device time, and its waits for other judges' work): where a
    gate's time goes (`kgate.worker.run_gates` records them with each gate's result)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def timing(self, role: str) -> Iterator[None]:
        start = _monotonic()
        try:
            yield
        finally:
            held = self.counts.setdefault(role, [0, 0.0])
            held[0] += 1
            held[1] += _monotonic() - start

    def take(self) -> dict[str, dict[str, float]]:
        """The calls since the last take, then forgotten."""
        out = {role: {"calls": int(n), "s": round(s, 4)} for role, (n, s) in self.counts.items()}
        self.counts = {}
        return out


class Baseline:
    """Pristine inputs of a case, with the reference (in dtype) and oracle (float64) outputs."""

    def __init__(self, args: tuple, reference: Any, oracle: Any):
        self.args = args
        self.reference = reference
        self.oracle = oracle


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


ORACLE_ROLE = "reference (float64 oracle)"


def _settle(device: torch.device, role: str) -> None:
    """Synchronize before a call to the reference, so that a fault its own launches raise can be told from
    one an earlier launch left pending (kgate.faults.ContextLost's `own`)."""
    try:
        synchronize(device)
    except Exception as exc:  # noqa: BLE001 - an earlier launch's error, first seen here
        _raise_if_lost(exc, role, own=False)
        raise UserCodeError(role, exc) from exc


def _raise_if_lost(exc: BaseException, role: str, own: bool = True) -> None:
    """Raise ContextLost when `exc`, raised in a call to the reference, says the CUDA context is lost."""
    line = context_lost(exc)
    if line is not None:
        raise ContextLost(line, role, own, exc) from exc


def raise_pending_launch_error(device: torch.device) -> None:
    """A launch that fails at once (a grid too large, more shared memory than the device allows: CUDA's
    "invalid argument" or "invalid configuration") leaves its error pending in the runtime until the next
    launch checks for one; an extension that does not check would have it raised in kgate's own next
    operation, blamed on kgate. One tiny launch right after the kernel raises it where it belongs."""
    if device.type == "cuda":
        torch.empty(1, device=device).zero_()


# The host memory a worker may use (bytes; set by kgate.worker.prepare_process from the job's limit).
HOST_MEMORY: int | None = None
# A float64 oracle on the CPU holds its upcast inputs, its outputs and temporaries: this many times the
# float64 size of the inputs is what `host_can_hold` asks for.
ORACLE_HOST_FACTOR = 3


def host_can_hold(args: Any, output_elements: int = 0) -> bool:
    """Whether a float64 oracle on `args` fits in what is left of the worker's host memory limit: its
    inputs and its outputs (`output_elements`, as the reference gave them at these input shapes), both in
    float64 and ORACLE_HOST_FACTOR times over. At KernelBench's own sizes (inputs of 2 x 10^9 elements) a
    float64 oracle moved to the CPU took the worker past its limit: killed, and the candidate recorded
    as an error; counting the inputs alone missed the operators whose output is larger than their
    inputs (a transposed convolution that doubles height and width: 17 GiB of float64 output from 4)."""
    if HOST_MEMORY is None:
        return True
    need = ORACLE_HOST_FACTOR * 8 * (sum(t.numel() for t in tensors(args)) + output_elements)
    return need <= HOST_MEMORY - procmem.resident()


def _unwrapped(fn: Any) -> Any:
    """A kernel or reference seen through kgate's own wrappers (the audit's `kernelbench.NoGrad`, the oracle's
    `DtypeDispatch`): the module they wrap, or `fn` itself."""
    from kgate.kernelbench import NoGrad

    return fn.model if isinstance(fn, (NoGrad, DtypeDispatch)) else fn


def _detach_buffers(module: Any) -> None:
    """A module's buffers that a call under autograd wrote with tensors that carry a graph (`running.mul_(b)
    .add_(g.mean(0))` on inputs that require grad) made leaves again, their values kept: a buffer is state, not a
    node of the call's graph, and one left in a graph cannot be copied (`copy.deepcopy`: the float64 oracle's
    copy of the module) nor written in place by the next call's graph without growing it."""
    if not isinstance(module, torch.nn.Module):
        return
    for b in module.buffers():
        if b.grad_fn is not None and b._base is None:
            b.detach_()


def _shapes_key(args: Any) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in tensors(args))


def with_inplace(fn: Callable, inplace: Iterable[int]) -> Callable:
    """`fn`, but a call that returns None returns instead the arguments it is declared to change in
    place, as the call left them (`{"args[i]": ...}`): a reference written that way (`a.add_(b)`) gives
    its results only there, and every gate that judges outputs (oracle, special values, shapes, layouts,
    determinism, ...) then judges the kernel's writes against it. Before, such a kernel had no output to
    compare and passed them all, whatever it wrote. A call that returns something is left as it is: an
    argument declared in-place may then be the kernel's scratch space."""
    order = sorted(set(inplace))
    if not order:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if result is not None:
            return result
        return {f"args[{i}]": args[i] for i in order if i < len(args)}

    return call


FIRST_CALL_BYTES = 256 * 2**20  # a first call whose inputs and outputs hold more is not kept


CPU_COPY_ELEMENTS = 1 << 24  # reference_on_cpu: the most parameter and buffer elements a module reference's CPU copy holds
PRINT_PIECE = 1 << 24  # parameter_prints: elements converted to float64 at once
FIRST_CALLS = 4  # the first calls kept: an autotuner that times a few configurations calls each once


def parameter_prints(module: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """Per parameter of `module`, by name: the sum and the sum of squares of its values in float64, which a
    change of its values moves (the contract gate tells a parameter the kernel changed in a call: a fold made
    in place at its first call)."""
    prints = {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.is_floating_point():
                flat, total, squares = p.detach().reshape(-1), 0.0, 0.0
                for start in range(0, flat.numel(), PRINT_PIECE):  # a piece at a time: a 32768^2 weight is
                    piece = flat[start:start + PRINT_PIECE].double()  # 8.6 GB in float64 (a GPU worker's share)
                    total += float(piece.sum())
                    squares += float(piece.square().sum())
                prints[name] = (total, squares)
    return prints


class FirstCall:
    """Copies of the inputs and the outputs of the first FIRST_CALLS calls of a kernel or reference in this
    process (those that fit in FIRST_CALL_BYTES together; none where a call raised or some leaf is not a
    plain tensor): the determinism gate calls again on the same inputs and compares bitwise. A kernel that
    autotunes, warms a cache or initialises state on its first calls (and computes otherwise there) shows
    only against those calls, which the gates never see otherwise: the audit's standard test makes them.
    More than the first: an autotuner that tries one configuration a call and keeps the fastest computes the
    first call's way again whenever that configuration wins, so only another of its first calls shows it."""

    def __init__(self) -> None:
        # a module's parameters before its first call, by name (`parameter_prints`): the contract gate compares
        self.parameters: dict[str, tuple[float, float]] | None = None
        self.calls: list[tuple[tuple, list[tuple[str, torch.Tensor]]]] = []  # (inputs, [(path, output)])
        self.seen = False  # the first calls were made (kept or not)
        self._made = 0
        self._bytes = 0
        self._pending: tuple | None = None

    @property
    def kept(self) -> bool:
        return bool(self.calls)

    def before(self, args: tuple) -> None:
        if self.seen or self._pending is not None:
            return
        tensors = [t for _, t in flatten(args) if isinstance(t, torch.Tensor)]
        size = sum(t.numel() * t.element_size() for t in tensors)
        if self._bytes + size <= FIRST_CALL_BYTES:
            self._pending = clone_tree(args)
            self._bytes += size
        else:
            self.seen = True

    def after(self, out: Any) -> None:
        if self.seen:
            return
        pending, self._pending = self._pending, None
        if pending is None:  # no before() for this call (a second observer of one call): nothing to pair
            return
        self._made += 1
        self.seen = self._made >= FIRST_CALLS
        leaves = list(flatten(out))
        size = sum(t.numel() * t.element_size() for _, t in leaves if isinstance(t, torch.Tensor))
        if not leaves or not all(type(t) is torch.Tensor for _, t in leaves) or self._bytes + size > FIRST_CALL_BYTES:
            self.seen = True  # (a later call is no first call of this one's kind: stop there)
            return
        self._bytes += size
        self.calls.append((pending, [(path, t.detach().clone()) for path, t in leaves]))

    def cancel(self) -> None:
        """The call before() saw raised: its inputs are not paired with the next call's outputs."""
        self._pending = None

    def watch(self, module: torch.nn.Module) -> None:
        """Record `module`'s first forward calls (hooks, removed after them: a model called directly, as the
        audit's standard test calls it, before any Subject exists), and its parameters as built."""
        handles: list[Any] = []
        self.parameters = parameter_prints(module)

        def pre(_module: Any, args: tuple) -> None:
            self.before(args)

        def post(_module: Any, _args: tuple, out: Any) -> None:
            self.after(out)
            if self.seen:
                for handle in handles:
                    handle.remove()

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


class Subject:
    def __init__(self, kernel: ResolvedKernel, kernel_fn: Callable, reference_fn: Callable,
                 factory: InputFactory, device: torch.device, cases: list[Case], *,
                 repro_manifest: str, oracle_device: torch.device | None = None, judge_inplace: bool = True):
        self.entry = kernel
        self.name = kernel.name
        # as given (the backward subject differentiates these)
        self.raw_kernel_fn, self.raw_reference_fn = kernel_fn, reference_fn
        # a kernel declared in-place is judged on what it leaves in those arguments as on what it returns
        inplace = kernel.entry.inplace if judge_inplace else []
        self.kernel_fn = with_inplace(kernel_fn, inplace)
        self.reference_fn = with_inplace(reference_fn, inplace)
        # the float64 oracle: a module reference (its parameters float32) as a float64 copy, made once
        self._dispatch = DtypeDispatch(reference_fn) if isinstance(reference_fn, torch.nn.Module) else None
        self.oracle_fn = with_inplace(self._dispatch, inplace) if self._dispatch is not None else self.reference_fn
        self.factory = factory
        self.device = device
        self.oracle_device = oracle_device or device
        self.cases = cases
        self.tolerance: Tolerance = kernel.tolerance
        self.inplace = set(kernel.entry.inplace)
        self.no_grad = set(kernel.entry.no_grad)  # arguments that get no gradient by contract (kgate/backward.py)
        self.nondeterministic = kernel.entry.nondeterministic
        self.backward = kernel.entry.backward
        self.repro_manifest = repro_manifest
        # Set by the worker: a kgate.gates.isolation.Snapshot taken before the kernel's module was
        # imported, which the isolation gate compares against (None in-process: the gate takes its own).
        self.pristine_state: Any = None
        # Set by the worker at each gate's start (`kgate.worker.run_gates`): the monotonic time after
        # which a searching gate starts no new probe and reports what it judged (None: no limit).
        self.deadline: float | None = None
        # the first calls of the kernel and of the reference (set by the audit's worker, where the standard test
        # makes them; else recorded by run_kernel / run_reference)
        self.first_calls: dict[str, FirstCall] = {"kernel": FirstCall(), "reference": FirstCall()}
        self.calls = CallClock()  # user code's calls and their seconds, taken after each gate
        self._baselines: OrderedDict[Case, Baseline] = OrderedDict()
        # elements of the reference's outputs per input shapes: what a float64 oracle on the CPU would hold
        self._output_elements: dict[tuple, int] = {}
        self._cpu_reference: torch.nn.Module | bool | None = None  # `reference_on_cpu`'s copy of a module reference
        # the modules' buffers as built (running statistics, counters): kernel and reference are built alike,
        # so here they agree; the gates call the two unequally often, so a probe that needs them to agree again
        # (the oracle gate's eval mode) puts these back first (`initial_buffers`)
        modules = self.modules()
        # a history-dependent module's buffers set alike before every call of kernel, reference and oracle
        self.lockstep = Lockstep.of(modules)
        for dispatch in (self._dispatch, self.raw_reference_fn):
            if isinstance(dispatch, DtypeDispatch):
                dispatch.prepare = self._prepare_reference
        self._initial_buffers = ModuleState(self, modules, parameters=False) if modules is not None else None
        if modules is not None:  # (the audit's worker records them before its standard test: `FirstCall.watch`)
            for role, module in zip(("kernel", "reference"), modules):
                if self.first_calls[role].parameters is None:
                    self.first_calls[role].parameters = parameter_prints(module)

    def conform(self, original: tuple, probe: tuple) -> tuple:
        """A probing gate's changed copy of `original`, brought back inside the inputs' domain where the
        subject knows more of it than the reference's exceptions tell (a KernelBench problem's
        triangular or symmetric matrices: `kgate.kernelbench.conform`). Here: unchanged."""
        return probe

    def predicted_input_elements(self, case: Case) -> int | None:
        """Elements the inputs of `case` would hold, counted without making them (a KernelBench problem's
        get_inputs() on the meta device), or None where unknown: a generated shape's inputs can be too large
        to make at all. Here: unknown."""
        return None

    def structural_zeros(self, args: tuple) -> bool:
        """Whether some input has zeros its domain declares (a KernelBench problem's triangular or
        diagonal matrices), which a kernel may skip rather than multiply: then 0 * NaN need not be NaN
        (the special_values gate). Here: none known."""
        return False

    def model_sizes(self) -> list[Any]:
        """Other sizes of the weights the kernel and the reference can both be built at (a KernelBench problem's
        module-level integers that size the Model: `kgate.kernelbench.model_size_variants`), each with `label`,
        `overrides` (name -> value) and `open()`, a context manager that builds the two models at that size and yields a subject of them
        (or a string: why it was not built), and puts everything back after. Here: none."""
        return []

    def modules(self) -> tuple[torch.nn.Module, torch.nn.Module] | None:
        """The kernel's and the reference's `nn.Module`, seen through kgate's own wrappers (the audit's
        `kernelbench.NoGrad`, the oracle's `DtypeDispatch`), or None unless both are modules."""
        kernel, reference = _unwrapped(self.raw_kernel_fn), _unwrapped(self.raw_reference_fn)
        if isinstance(kernel, torch.nn.Module) and isinstance(reference, torch.nn.Module):
            return kernel, reference
        return None

    def initial_buffers(self) -> None:
        """Put the kernel's and the reference's module buffers back to their values as built (a caller that
        changes them saves them first: `ModuleState`)."""
        if self._initial_buffers is not None:
            self._initial_buffers.restore()  # (and drops the converted copies)
        else:
            self.drop_converted_references()

    def buffers_as_built(self, built: dict[int, torch.Tensor]) -> None:
        """The modules' buffers as they were built, where the modules were called before this subject was made (an
        audit's standard test moves a BatchNorm's statistics and an optimizer step's momentum): `built` holds a
        copy of each buffer by the buffer's id, and `initial_buffers` puts those back from now on."""
        if self._initial_buffers is not None:
            self._initial_buffers.replace_saved(built)

    def _prepare_reference(self, module: torch.nn.Module) -> None:
        """Before a call of the reference or one of its converted copies: its buffers to the lockstep state."""
        if self.lockstep is not None:
            self.lockstep.load(module)

    def adopt_state(self) -> None:
        """A probe changed the modules' buffers in place on purpose, alike in kernel and reference: the calls
        after it start from them (`Lockstep.adopt`; a `ModuleState` that saved the state before puts it back)."""
        if self.lockstep is not None:
            self.lockstep.adopt()

    def changed_state(self) -> None:
        """A probe changed the modules' parameters or buffers in place on purpose, alike in kernel and reference:
        the calls after it start from them (`adopt_state`), and the reference's converted copies are made again
        from them (`drop_converted_references`)."""
        self.adopt_state()
        self.drop_converted_references()

    def oracle_module(self) -> torch.nn.Module | None:
        """The module the float64 oracle calls (the reference's float64 copy, once made; the reference itself
        where it is float64), or None for a reference that is no module."""
        for dispatch in (self._dispatch, self.raw_reference_fn):
            if isinstance(dispatch, DtypeDispatch):
                if own_dtype(dispatch.model) == torch.float64:
                    return dispatch.model
                return next((m for (dtype, device), m in dispatch._copies.items()
                             if dtype == str(torch.float64) and device == str(self.oracle_device)), None)
        return None

    def sync_buffers(self) -> None:
        """Set the kernel's and the reference's buffers to the lockstep state now (as their next calls would):
        for a probe that reads them before a call."""
        if self.lockstep is not None:
            self.lockstep.load(self.lockstep.reference)
            self.lockstep.before_kernel()

    def drop_converted_references(self) -> None:
        """Forget the reference module's converted copies (float64 for the oracle, other dtypes): the next
        call converts it again, from its parameters as they are now."""
        for dispatch in (self._dispatch, self.raw_reference_fn):
            if isinstance(dispatch, DtypeDispatch):
                dispatch.drop_copies()

    def out_of_time(self) -> bool:
        """Whether the gate's search budget is spent (see `deadline`)."""
        return self.deadline is not None and _monotonic() > self.deadline

    # -- calling user code -------------------------------------------------------------------------

    def inputs(self, case: Case) -> tuple:
        try:
            return self.factory(case, self.device)
        except UserCodeError:
            raise
        except Exception as exc:
            raise UserCodeError("inputs factory", exc) from exc

    def run_kernel(self, args: tuple, *, sync: bool = True) -> Any:
        first = self.first_calls["kernel"]
        if not first.seen:
            first.before(args)
        if self.lockstep is not None:
            self.lockstep.before_kernel()
        try:
            with self.calls.timing("kernel"):
                out = self.kernel_fn(*args)
                if sync:
                    synchronize(self.device)
            if not first.seen:
                first.after(out)
            raise_pending_launch_error(self.device)  # no sync: a launch that failed at once, raised here
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            first.cancel()
            try:  # a launch error the kernel left pending before it raised is part of this failure
                raise_pending_launch_error(self.device)
            except Exception:  # noqa: BLE001 - raising it cleared it; the kernel's own exception is the verdict
                pass
            raise UserCodeError("kernel", exc) from exc
        return out

    def run_reference(self, args: tuple, *, grad: bool = False) -> Any:
        """The reference on `args`, under torch.no_grad() unless `grad` (then under the grad mode the kernel
        runs in: outputs require grad as autograd would make them)."""
        first = self.first_calls["reference"]
        if not first.seen and not grad:
            first.before(args)
        _settle(self.device, "reference")
        if self.lockstep is not None:
            self.lockstep.load(self.lockstep.reference)
        try:
            with self.calls.timing("reference"), torch.set_grad_enabled(torch.is_grad_enabled() if grad else False):
                try:
                    out = self.reference_fn(*args)
                finally:
                    if grad:
                        _detach_buffers(_unwrapped(self.raw_reference_fn))
                synchronize(self.device)
            if self.lockstep is not None:
                self.lockstep.after_reference()
            if not first.seen and not grad:
                first.after(out)
        except (Exception, SystemExit) as exc:
            first.cancel()
            _raise_if_lost(exc, "reference")
            raise UserCodeError("reference", exc) from exc
        self._output_elements[_shapes_key(args)] = sum(t.numel() for t in tensors(out))
        return out

    def oracle(self, args: tuple, device: torch.device | None = None) -> Any:
        """The reference in float64 on upcast copies of `args`, on `device` (by default the oracle's device);
        on the CPU if the device refuses and the worker's host memory can hold it (`host_can_hold`; else the
        device's error stands: for an audit, a GPU out-of-memory error has the candidate judged again alone,
        with the whole GPU)."""
        first = device or self.oracle_device
        devices = [first] + ([torch.device("cpu")] if first.type != "cpu" else [])
        last: BaseException | None = None
        for device in devices:
            # the output's size from the reference at the same input shapes (in the working dtype; a
            # shape the reference has not run counts inputs only)
            if last is not None and not host_can_hold(args, self._host_elements(args)):
                break
            _settle(device, ORACLE_ROLE)
            try:
                with self.calls.timing("oracle" if device == self.oracle_device else f"oracle on {device.type}"), \
                        torch.no_grad(), oracle_call(device):
                    out = self.oracle_fn(*upcast(args, device))
                    synchronize(device)
                return map_tensors(out, lambda t: t.detach())
            except (Exception, SystemExit) as exc:
                _raise_if_lost(exc, ORACLE_ROLE)  # not moved to the CPU: the process can launch nothing more
                last = exc
        assert last is not None
        raise UserCodeError(ORACLE_ROLE, last) from last

    def terms(self, args: tuple) -> dict[str, Terms]:
        """Per floating output leaf of the float64 oracle on `args` (by path), the magnitudes of the terms its
        computation combines (`kgate.oracle.TermMagnitudes`): what the oracle bound takes where the oracle
        is 0 (a cancellation) or a partial sum may leave the dtype's range. Empty where the computation
        cannot be followed (the reference rejects the inputs, or raises under the decompositions)."""
        recorder = TermMagnitudes()
        try:
            with recorder:
                out = self.oracle(args)
        except Exception:  # noqa: BLE001 - the bound then stays as it was without the terms
            return {}
        found = {}
        for path, t in flatten(out):
            magnitude = recorder.of(t) if isinstance(t, torch.Tensor) else None
            if magnitude is not None:
                found[path] = magnitude
        return found

    def _host_elements(self, args: tuple) -> int:
        """What a float64 oracle on the host holds besides its inputs: the reference's outputs at these input
        shapes and, for a module reference that lives elsewhere, its float64 copy made on the host."""
        elements = self._output_elements.get(_shapes_key(args), 0)
        reference = _unwrapped(self.raw_reference_fn)
        if isinstance(reference, torch.nn.Module):
            elements += sum(t.numel() for t in [*reference.parameters(), *reference.buffers()]
                            if t.device.type != "cpu")
        return elements

    def oracle_on_cpu(self, args: tuple) -> Any | None:
        """The float64 oracle evaluated on the CPU too, where it runs on another device: None where it runs on
        the CPU already, the host cannot hold it or the reference rejects the inputs there. A reference's
        special-value semantics may differ by device (torch's CUDA rms_norm computes its statistics with a
        Welford update that spreads one Inf input to a NaN row; its CPU path, and the formula, give 0 at the
        finite elements): the special_values gate accepts a class that either evaluation gives."""
        if self.oracle_device.type == "cpu" or not host_can_hold(args, self._host_elements(args)):
            return None
        return unless_rejected(lambda: self.oracle(args, device=torch.device("cpu")))

    def reference_on_cpu(self, args: tuple) -> Any | None:
        """The reference in the kernel's dtype on CPU copies of `args`, where the kernel runs on another device:
        None on the CPU already, where the host cannot hold it, or where the reference raises there. A module
        reference runs as a CPU copy of itself made once (its parameters and buffers as they are then), where
        they hold at most CPU_COPY_ELEMENTS elements; else None. A reference's subnormal results may differ by
        device (torch's CUDA bfloat16 cumsum gives 0 where its CPU path keeps the subnormal sum of subnormal
        inputs; CUDA's float atomics, behind index_add_, flush the subnormals they add): the special_values gate
        asks it before it calls a kept subnormal a departure from the reference's flush."""
        if self.device.type == "cpu" or not host_can_hold(args, self._output_elements.get(_shapes_key(args), 0)):
            return None
        module = _unwrapped(self.raw_reference_fn)
        if not isinstance(module, torch.nn.Module):
            return self._reference_on(args, lambda t: t.detach().cpu())
        if self._cpu_reference is None:
            held = sum(t.numel() for t in (*module.parameters(), *module.buffers()))
            self._cpu_reference = copy.deepcopy(module).cpu() if held <= CPU_COPY_ELEMENTS else False
        if self._cpu_reference is False:
            return None
        return self._reference_on(args, lambda t: t.detach().cpu(), self._cpu_reference)

    def reference_widened(self, args: tuple) -> Any | None:
        """The reference on `args` with its bfloat16 tensors widened to float32, on the kernel's device: None where
        no argument is bfloat16, for a module reference (its weights keep their dtype) or where the reference
        raises so. The two dtypes share their exponent range (the same smallest normal), so a flush of subnormal
        results gives 0 in both; a 0 that only the bfloat16 evaluation gives is the rounding of its 8-bit
        mantissa in an intermediate (a product below bfloat16's smallest subnormal), not a flush. The
        special_values gate asks it before it calls a kept subnormal a departure from the reference's flush."""
        if not any(t.dtype == torch.bfloat16 for t in tensors(args)):
            return None
        return self._reference_on(args, lambda t: t.detach().float() if t.dtype == torch.bfloat16 else t.detach())

    def _reference_on(self, args: tuple, convert: Callable[[torch.Tensor], torch.Tensor],
                      run: Callable[..., Any] | None = None) -> Any | None:
        """The reference (no grad) on `args` with every tensor converted by `convert`, or `run` (a converted copy
        of a module reference) in its place: None for a module reference without one (its weights keep their
        device and dtype) or where the call raises on the converted arguments."""
        if run is None:
            if isinstance(_unwrapped(self.raw_reference_fn), torch.nn.Module):
                return None
            run = self.reference_fn
        try:
            with torch.no_grad():
                out = run(*map_tensors(args, convert))
        except Exception:  # noqa: BLE001 - a reference that runs on its own device or dtype only: no evaluation
            return None
        return map_tensors(out, lambda t: t.detach())

    def release_caches(self) -> bool:
        """Drop the cached baselines (inputs, reference outputs and float64 oracles of recent cases: they are
        made again when asked); whether any was held."""
        held = bool(self._baselines)
        self._baselines.clear()
        return held

    def baseline(self, case: Case, max_elements: int | None = None) -> Baseline:
        """Pristine inputs, reference and oracle outputs for a case, cached (a few cases at a time). With
        `max_elements`: inputs holding more tensor elements than that raise InputsTooLarge before the
        reference or the oracle runs on them (a generated shape can be far larger than the caller meant)."""
        if case in self._baselines:
            self._baselines.move_to_end(case)
            return self._baselines[case]
        args = self.inputs(case)
        if max_elements is not None and (held := input_elements(args)) > max_elements:
            raise InputsTooLarge(held)
        reference = self.run_reference(clone_tree(args))
        oracle = self.oracle(args)
        baseline = Baseline(args, reference, oracle)
        self._baselines[case] = baseline
        while len(self._baselines) > 4:
            self._baselines.popitem(last=False)
        return baseline

    def first_seed_cases(self) -> list[Case]:
        """One case per (shape, dtype), with the first seed: for gates whose probe is not statistical."""
        seen: set[tuple] = set()
        chosen = []
        for case in self.cases:
            if (case.shape, case.dtype) not in seen:
                seen.add((case.shape, case.dtype))
                chosen.append(case)
        return chosen

    # -- reporting -----------------------------------------------------------------------------------

    def repro(self, gate: str, case: Case | None = None) -> str:
        parts = ["kgate", "run", self.repro_manifest, "-k", self.name, "--gate", gate, "--device", str(self.device)]
        if case is not None:
            parts += ["--seed", str(case.seed), "--dtype", case.dtype]
            if case.shape is not None:
                parts += ["--shape", ",".join(map(str, case.shape)) or "scalar"]
        return shlex.join(parts)


KEEP_CONVERTED_BYTES = 1 << 28  # the most converted reference copies a ModuleState holds on to (256 MiB)


def _module_bytes(obj: Any) -> int:
    """The bytes of a converted reference copy's parameters and buffers (0 for what is not a module)."""
    if not isinstance(obj, torch.nn.Module):
        return 0
    return sum(t.numel() * t.element_size() for t in [*obj.parameters(), *obj.buffers()])


def input_elements(args: tuple) -> int:
    """The elements of the tensors among `args`."""
    return sum(a.numel() for a in args if isinstance(a, torch.Tensor))


class InputsTooLarge(Exception):
    """A case's inputs hold more elements than the caller's cap (Subject.baseline's `max_elements`)."""

    def __init__(self, elements: int):
        super().__init__(f"{elements} input elements")
        self.elements = elements


class ModuleState:
    """The parameters and buffers of a subject's kernel and reference modules, saved (bitwise copies) so a
    probe may change them in place and `restore` puts the saved values back into the same tensors, and the
    lockstep state (`Lockstep`) with them. The reference's converted copies (`DtypeDispatch`) are set aside
    meanwhile: a copy converted from changed parameters is dropped, the ones from before come back."""

    def __init__(self, subject: Subject, modules: tuple[torch.nn.Module, torch.nn.Module], *,
                 parameters: bool = True):
        """`parameters=False`: the buffers alone (for a probe that changes no parameter: no copy of the weights)."""
        self.subject = subject
        seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        copies: dict[tuple, list[torch.Tensor]] = {}  # by shape, dtype, device: the copies made so far
        with torch.no_grad():
            for module in modules:
                for t in [*(module.parameters() if parameters else ()), *module.buffers()]:
                    if id(t) in seen:
                        continue
                    # kernel and reference mostly hold equal weights: one copy serves every tensor equal
                    # to it bitwise (a model's worth of GPU memory less, in an audit's share of the GPU)
                    same = copies.setdefault((tuple(t.shape), t.dtype, t.device), [])
                    try:
                        saved = next((c for c in same if bitwise_mismatch(c, t) is None), None)
                    except (RuntimeError, TypeError, KeyError):  # a layout without a bit view (sparse...)
                        saved = None
                    if saved is None:
                        saved = t.detach().clone()
                        same.append(saved)
                    seen[id(t)] = (t, saved)
        self._saved = list(seen.values())
        self._lockstep = dict(subject.lockstep.state) if subject.lockstep is not None else None
        # the copies from before are kept to be given back only while they are small: a large model's float64
        # copy (twice its float32 weights) held through the probe beside the one made from the changed
        # parameters outgrew a worker's share of the GPU (a 671-million-parameter RNN); dropped, it is made
        # again when next asked for, from the restored parameters, the same values
        self._copies = [(d, dict(d._copies)) for d in (subject._dispatch, subject.raw_reference_fn)
                        if isinstance(d, DtypeDispatch)]
        if sum(_module_bytes(m) for _, copies in self._copies for m in copies.values()) > KEEP_CONVERTED_BYTES:
            self._copies = []
        for dispatch, copies in self._copies:  # (not refreshed in place meanwhile: they are given back as they are)
            dispatch.pinned.update(id(m) for m in copies.values())
        subject.drop_converted_references()

    def saved(self) -> dict[int, torch.Tensor]:
        """The saved copy of each tensor, by the tensor's id (one copy may serve several equal tensors)."""
        return {id(t): saved for t, saved in self._saved}

    def replace_saved(self, values: dict[int, torch.Tensor]) -> None:
        """`restore` puts these values (by the tensor's id) back from now on, where they fit the tensor."""
        self._saved = [(t, values[id(t)] if id(t) in values and values[id(t)].shape == t.shape
                        and values[id(t)].dtype == t.dtype else saved) for t, saved in self._saved]

    def restore(self) -> None:
        with torch.no_grad():
            for t, saved in self._saved:
                if t.shape == saved.shape and t.dtype == saved.dtype:
                    t.copy_(saved)
                else:  # a call replaced the tensor's data (`p.data = p.data.t()`) with another shape or dtype
                    t.data = saved.clone()
        if self._lockstep is not None and self.subject.lockstep is not None:
            self.subject.lockstep.state = dict(self._lockstep)
        self.subject.drop_converted_references()

    def close(self) -> None:
        """Restore, and give the reference its converted copies from before back."""
        self.restore()
        for dispatch, copies in self._copies:
            dispatch.give_back(copies)


LOCKSTEP_BYTES = 1 << 26  # modules whose buffers hold more than this (64 MiB) are not kept in lockstep


def pair_buffers(kernel: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, str]:
    """Which of the kernel's buffers stands for which of the reference's (kernel name -> reference name): the
    same name, shape and dtype; then the reference's others, in their order, each with the kernel's next
    unpaired buffer of its shape and dtype holding the same values (a module rewritten with other attribute
    names, a BatchNorm wrapped in a fused layer of its own, registers its buffers in the reference's order and,
    as built, with its values; after equal calls, with values as close as PAIR_RTOL). The order pairs only
    where every other reference buffer finds a partner so; else those stay unpaired. A kernel's buffer of its
    own (a cache) is skipped."""
    def fits(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and a.dtype == b.dtype

    partner = {n: n for n, t in reference.items() if n in kernel and fits(kernel[n], t)}
    left = [(n, t) for n, t in kernel.items() if n not in partner]
    rest = [(n, t) for n, t in reference.items() if n not in partner]
    ordered: dict[str, str] = {}
    at = 0
    for name, t in rest:
        while at < len(left) and not (fits(left[at][1], t) and _close_values(left[at][1], t)):
            at += 1
        if at == len(left):
            return partner
        ordered[left[at][0]] = name
        at += 1
    return {**partner, **ordered}


_PAIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel module -> (its reference, pairs)


def module_buffer_pairs(kernel: torch.nn.Module, reference: torch.nn.Module) -> dict[str, str]:
    """pair_buffers of two modules as they were the first time asked (the audit's worker asks as soon as both
    are built, before any call): a kernel that never updates a buffer it pairs with would no longer hold the
    reference's values later, and the pairing must not depend on what is judged."""
    known = _PAIRS.get(kernel)
    if known is not None and known[0]() is reference:
        return dict(known[1])
    pairs = pair_buffers(dict(kernel.named_buffers()), dict(reference.named_buffers()))
    _PAIRS[kernel] = (weakref.ref(reference), pairs)
    return dict(pairs)


PAIR_RTOL = 1e-3  # buffers paired by order hold values this close (the standard test's calls moved both alike)


def _close_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal (integers, booleans) or close (floating point: after equal calls on the kernel's and the reference's
    own activations, running statistics differ in their last bits)."""
    try:
        a, b = a.detach(), b.detach().to(a.device)
        if a.is_floating_point():
            return bool(torch.allclose(a.double(), b.double(), rtol=PAIR_RTOL, atol=1e-6, equal_nan=True))
        return bool(torch.equal(a, b))
    except (RuntimeError, TypeError):  # a layout or dtype these do not take
        return False


def _held(module: torch.nn.Module, name: str, parameter: bool = False) -> torch.Tensor | None:
    """`module`'s buffer (or parameter) of the dotted `name`, as `named_buffers()` names it, looked up along its
    path (None where there is none now): before every call, without walking every submodule (some 700 in a
    DenseNet) for each of the names."""
    *path, last = name.split(".")
    sub: Any = module
    for part in path:
        sub = sub._modules.get(part) if isinstance(sub, torch.nn.Module) else None
        if sub is None:
            return None
    if not isinstance(sub, torch.nn.Module):
        return None
    found = (sub._parameters if parameter else sub._buffers).get(last)
    return found if isinstance(found, torch.Tensor) else None


class _LoadPlan:
    """What `Lockstep._load` did for one module and one list of names, kept for its next call while it still holds:
    where each name is held (the chain of submodules down to it, by weak reference), the tensor found there and its
    address, the state tensor and its conversion to that tensor's dtype and device, and the bits of both, so a load
    costs a few identity checks and one comparison of all the bits at once, not a walk, a conversion and a view per
    buffer (some 300 buffers of a DenseNet-201, before every call of kernel, reference and oracle). `valid`
    says whether every one of those still holds: the same submodules along each path, the same tensor at each name,
    at the same address and shape, the same state tensor; names that held nothing of the state's shape still hold
    none."""

    def __init__(self, module: torch.nn.Module, parameters: bool):
        self.module = weakref.ref(module)
        self.store = "_parameters" if parameters else "_buffers"
        self.edges: dict[tuple[int, str], tuple[weakref.ref, str, weakref.ref]] = {}
        self.entries: list[tuple[weakref.ref, str, torch.Tensor, int, torch.Size, str, torch.Tensor]] = []
        self.missing: list[tuple[str, str]] = []  # (name, state name): none of the state's shape held there
        self.todo: list[tuple[torch.Tensor, torch.Tensor]] = []  # (the module's tensor, the state's value for it)
        # by device and bits dtype: the members' indices in todo, their bits views (None: made at each load, where
        # no view shares the tensor's memory), the values' bits concatenated, and each element's member
        self.groups: list[tuple[list[int], list[torch.Tensor | None], torch.Tensor, torch.Tensor]] = []

    def add(self, module: torch.nn.Module, name: str, state_name: str, want: torch.Tensor,
            converted: Callable[[torch.Tensor, torch.device, torch.dtype], torch.Tensor]) -> None:
        *path, last = name.split(".")
        sub: Any = module
        for part in path:
            child = sub._modules.get(part) if isinstance(sub, torch.nn.Module) else None
            if child is None:
                self.missing.append((name, state_name))
                return
            self.edges.setdefault((id(sub), part), (weakref.ref(sub), part, weakref.ref(child)))
            sub = child
        found = getattr(sub, self.store).get(last) if isinstance(sub, torch.nn.Module) else None
        if not isinstance(found, torch.Tensor) or found.shape != want.shape:
            self.missing.append((name, state_name))
            return
        self.entries.append((weakref.ref(sub), last, found, found.data_ptr(), found.shape, state_name, want))
        self.todo.append((found, converted(want, found.device, found.dtype)))

    def seal(self) -> None:
        """Group the tensors for the comparison (after the last `add`)."""
        grouped: dict[tuple[str, torch.dtype], list[int]] = {}
        for i, (t, _) in enumerate(self.todo):
            if t.numel():
                grouped.setdefault((str(t.device), bits(t).dtype), []).append(i)
        for members in grouped.values():
            views: list[torch.Tensor | None] = []
            for i in members:
                t = self.todo[i][0]
                view = bits(t).reshape(-1)
                shares = view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() \
                    and view.data_ptr() == t.data_ptr() and view.numel() * view.element_size() == t.numel() * t.element_size()
                views.append(view if shares else None)
            values = torch.cat([bits(self.todo[i][1]).reshape(-1) for i in members])
            owner = element_owners([self.todo[i][0].numel() for i in members], values.device)
            self.groups.append((members, views, values, owner))

    def valid(self, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
        if self.module() is not module:
            return False
        for parent, part, child in self.edges.values():
            p = parent()
            if p is None or p._modules.get(part) is not child():
                return False
        for sub, last, t, ptr, shape, state_name, want in self.entries:
            s = sub()
            if s is None or getattr(s, self.store).get(last) is not t or t.data_ptr() != ptr or t.shape != shape \
                    or state.get(state_name) is not want:
                return False
        for name, state_name in self.missing:
            found = _held(module, name, self.store == "_parameters")
            if found is not None and state_name in state and found.shape == state[state_name].shape:
                return False
        return True

    def differ(self) -> list[bool]:
        """Whether each tensor of `todo` differs bitwise from its value now: one read of each device."""
        found = [False] * len(self.todo)
        for members, views, values, owner in self.groups:
            now = torch.cat([v if v is not None else bits(self.todo[i][0]).reshape(-1) for i, v in zip(members, views)])
            for i, differs in zip(members, members_differ(now, values, owner, len(members))):
                found[i] = differs
        return found


PLANS_KEPT = 32  # the load plans a Lockstep keeps (per module and list of names: kernel, reference, its copies)


class Lockstep:
    """The buffers of a history-dependent module (a forward that writes them: running statistics, an EMA, a
    step counter) kept in lockstep: before every call of the kernel, of the reference and of the reference's
    converted copies (the float64 oracle's), the buffers they share by name, shape and dtype are set to one
    state, `state`: the reference's as the subject was made, until a probe changes it on purpose (`adopt`).
    The gates call kernel, reference and oracle unequally often; without this, each would standardise with
    statistics of its own history, and a correct kernel differ from an oracle that has seen other calls.
    A kernel's state of its own (a Python attribute, a buffer the reference does not have) follows its calls.
    Parameters the reference's forward writes in place (an optimizer step as a module, an embedding's
    `max_norm` renormalising its table: seen by their version counters moving in a call) join the state from
    that call on, each with the kernel's parameter of its name (else of its shape, dtype and values:
    `pair_buffers`), as long as they fit LOCKSTEP_BYTES: a parameter written through `.data` is not seen.
    `stateful`: whether a call of the reference was seen to write a buffer or a parameter."""

    def __init__(self, kernel: torch.nn.Module, reference: torch.nn.Module):
        own = dict(reference.named_buffers())
        self.state = {n: t.detach().clone() for n, t in own.items()}
        # the kernel's buffer of each name -> the reference's it is kept in lockstep with (pair_buffers)
        self.partner = module_buffer_pairs(kernel, reference)
        self.kernel_names = list(self.partner)
        # the same for parameters, kept in lockstep once the reference's forward is seen to write them
        self.parameter_partner = pair_buffers(dict(kernel.named_parameters()), dict(reference.named_parameters()))
        self.written: list[str] = []  # the reference's parameters its forward writes, in the state from then on
        self._versions: dict[str, int] = {}
        self.kernel, self.reference = kernel, reference
        self.stateful = False
        # each state tensor's copies in other dtypes and devices (`_converted`), gone with the state tensor
        self._conversions: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._plans: dict[tuple[int, bool, tuple[tuple[str, str], ...]], _LoadPlan] = {}

    @staticmethod
    def of(modules: tuple[torch.nn.Module, torch.nn.Module] | None) -> Lockstep | None:
        if modules is None:
            return None
        buffers = list(modules[1].buffers())
        if sum(b.numel() * b.element_size() for b in buffers) > LOCKSTEP_BYTES:
            return None
        return Lockstep(*modules)

    def load(self, module: torch.nn.Module, names: Iterable[str] | None = None) -> None:
        """Set `module`'s buffers of `names` (all of the state's that it has) to the state, where they differ
        bitwise (an equal buffer is left alone: its version counter does not move), and its parameters the
        reference's forward writes; for the reference itself, note its parameters' versions (`after_reference`)."""
        self._load(module, ((n, n) for n in (self.state if names is None else names) if n not in self.written))
        self._load(module, ((n, n) for n in self.written), parameters=True)
        if module is self.reference:
            self._versions = {n: p._version for n, p in self.reference.named_parameters()}

    def _load(self, module: torch.nn.Module, pairs: Iterable[tuple[str, str]], parameters: bool = False) -> None:
        """Each (name in `module`, name in the state) of `pairs`: that buffer (with `parameters`, that parameter) set
        to that state (see `load`)."""
        pairs = tuple(pairs)
        key = (id(module), parameters, pairs)
        plan = self._plans.get(key)
        if plan is None or not plan.valid(module, self.state):
            plan = _LoadPlan(module, parameters)
            for name, state_name in pairs:
                plan.add(module, name, state_name, self.state[state_name], self._converted)
            plan.seal()
            # a plan holds its module's tensors: those of modules gone (a converted copy made anew) go now, not
            # at the cap, which only bounds plans of names no longer asked for
            self._plans = {k: p for k, p in self._plans.items() if p.module() is not None}
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        if not plan.todo:
            return
        with torch.no_grad():  # (compared all at once: one read from the device, not one per buffer)
            for (t, value), differs in zip(plan.todo, plan.differ()):
                if differs:
                    t.copy_(value)

    def _converted(self, want: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """A state tensor on `device` in `dtype`, converted once per state tensor (the float64 oracle's copy takes
        every buffer in float64 before each of its calls)."""
        if want.device == device and want.dtype == dtype:
            return want
        kept = self._conversions.get(want)
        if kept is None:
            kept = self._conversions[want] = {}
        key = (str(device), dtype)
        if key not in kept:
            kept[key] = want.to(device=device, dtype=dtype)
        return kept[key]

    def before_kernel(self) -> None:
        self._load(self.kernel, ((n, self.partner[n]) for n in self.kernel_names))
        if self.written:
            self._load(self.kernel, ((n, r) for n, r in self.parameter_partner.items() if r in self.written),
                       parameters=True)

    def kernel_buffers(self) -> dict[str, torch.Tensor]:
        """Copies of the kernel's buffers kept in lockstep, and of its parameters the reference's forward writes,
        each under the name of its reference partner."""
        own = dict(self.kernel.named_buffers())
        found = {self.partner[n]: own[n].detach().clone() for n in self.kernel_names if n in own}
        params = dict(self.kernel.named_parameters())
        found.update({r: params[k].detach().clone() for k, r in self.parameter_partner.items()
                      if r in self.written and k in params})
        return found

    def reference_names(self) -> list[str]:
        """The reference's buffers that have a partner in the kernel, and its parameters its forward writes that
        have one."""
        return [self.partner[n] for n in self.kernel_names] + \
            [r for r in self.parameter_partner.values() if r in self.written]

    @contextlib.contextmanager
    def kernel_left_alone(self) -> Iterator[None]:
        """Inside the block the kernel's buffers are not set before its calls: each starts from them as its
        previous call left them (the isolation gate's rejected-call probe, where they are constants of a
        call and one left changed is a finding the lockstep would hide)."""
        names, self.kernel_names = self.kernel_names, []
        try:
            yield
        finally:
            self.kernel_names = names

    def after_reference(self) -> None:
        """Note whether the reference's call wrote a buffer (the next call loads the state back), and take the
        parameters it wrote for the first time into the state, as the call left them."""
        if not self.stateful:
            buffers = dict(self.reference.named_buffers())
            self.stateful = any(bitwise_differ([(t, buffers[n].detach()) for n, t in self.state.items()
                                                if n in buffers and n not in self.written]))
        held = sum(self.state[w].numel() * self.state[w].element_size() for w in self.written)
        for n, p in self.reference.named_parameters():
            moved = n not in self.written and p.is_floating_point() and n in self._versions \
                and p._version != self._versions[n]
            if moved and held + p.numel() * p.element_size() <= LOCKSTEP_BYTES:
                self.written.append(n)
                self.state[n] = p.detach().clone()
                held += p.numel() * p.element_size()
                self.stateful = True

    def adopt(self) -> None:
        """Take the reference's buffers, and the parameters its forward writes, as they are now as the state (a
        probe changed them on purpose, alike in kernel and reference, or a sequence of calls moved them)."""
        params = dict(self.reference.named_parameters())
        self.state = {n: t.detach().clone() for n, t in self.reference.named_buffers()}
        self.state.update({n: params[n].detach().clone() for n in self.written if n in params})


def outputs_on(obj: Any) -> list[tuple[str, torch.Tensor]]:
    return [(p, t) for p, t in flatten(obj) if isinstance(t, torch.Tensor)]


# -- the reference's input domain ------------------------------------------------------------------------

def unless_rejected(compute: Callable[[], T]) -> T | None:
    """`compute()`, or None when the reference or its float64 oracle raises in it: the reference rejects
    those inputs (they are outside its domain) and the gate skips the probe. The kernel's and the inputs
    factory's exceptions propagate. `compute` must not return None itself."""
    try:
        return compute()
    except UserCodeError as exc:
        if not exc.role.startswith("reference"):
            raise
        return None


def within_domain(original: tuple, probe: tuple, arguments: list[int],
                  judge: Callable[[tuple, int | None], T | None],
                  conform: Callable[[tuple, tuple], tuple] | None = None
                  ) -> Iterator[tuple[int | None, tuple, T | None]]:
    """Judge `probe`, a copy of `original` whose top-level `arguments` were all changed at once. Where
    the reference rejects it (`judge(probe, None)` returns None, see `unless_rejected`) and it changed
    more than one argument, judge instead each argument i changed alone (`judge(inputs, i)`), taken from
    `probe`, the others as in `original` (a domain is often on one input: normalised keys, a gate <= 0,
    a probability).

    Yields (None for the probe as given, else the index of the one changed argument; the inputs
    judged; judge's result, None where the reference rejects them). A probe as given that the
    reference rejects is yielded only when there is nothing to retry; a caller may stop at any time.
    `conform` (a Subject's) brings each probe back into the inputs' known structure first.
    """
    if conform is not None:
        probe = conform(original, probe)
    outcome = judge(probe, None)
    if outcome is not None or len(arguments) < 2:
        yield None, probe, outcome
        return
    for i in arguments:
        single = list(clone_tree(original))
        single[i] = probe[i]
        single = tuple(single) if conform is None else conform(original, tuple(single))
        yield i, single, judge(single, i)


def rejected_note(rejected: list[str], shown: int = 4) -> str:
    """'; skipped N the reference rejects: a, b, ...' for a pass message ('' when none)."""
    if not rejected:
        return ""
    more = f" and {len(rejected) - shown} more" if len(rejected) > shown else ""
    return f"; skipped {len(rejected)} the reference rejects: {', '.join(rejected[:shown])}{more}"
