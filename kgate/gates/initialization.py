"""initialization: every output element is written by the kernel. Tolerance-free.

The kernel runs twice on equal inputs: once with every allocation it makes poisoned with NaN bytes
(0xFF), once with a sentinel byte (0xA5). An element the kernel never writes keeps the poison, so
the two runs differ there. Outputs must be bitwise identical across the two runs; a kernel declared
`nondeterministic`, or whose difference three more runs of each poison show to be chance
(`follows_filling`), must instead be finite wherever the oracle is finite in the NaN-poisoned run.

How memory gets poisoned, on each device:
- every `empty*` allocation made during the call through the PyTorch dispatcher (`torch.empty`,
  `empty_like`, `new_empty`, `empty_strided`, also from C++ extensions calling `at::empty`) is
  filled by `AllocationHook`, a TorchDispatchMode. This is deterministic on the CPU and on the GPU;
- on CUDA, the caching allocator's free blocks of the outputs' and inputs' sizes are filled too
  before the call (allocate, fill, free), which reaches allocations that bypass the dispatcher
  (raw `c10::cuda::CUDACachingAllocator` calls, Inductor's `empty_strided_cuda`). On the CPU, the
  same is done with malloc's free chunks, which catches such allocations only when malloc happens
  to hand the same chunk back: best effort.
What no device can catch: memory a kernel keeps from an earlier call (a persistent buffer; the
isolation gate sees that one when the first call's result changes under the second call).

`AllocationHook` is also what the bounds gate uses to put guard bands around the kernel's own
allocations.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kgate.compare import bitwise_mismatch, clone_tree, flatten, index_of, tensors
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case
from kgate.subject import Subject, UserCodeError, synchronize

NAN_BYTE = 0xFF  # all-ones: NaN in every floating dtype, -1 in signed integers
SENTINEL_BYTE = 0xA5  # finite and negative in every floating dtype (float32 -2.9e-16, float16 -0.022)

# Factories whose result holds whatever the memory held before.
UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "empty_permuted"})
# In-place metadata changes after which a guarded tensor no longer sits between its guard bands.
_REPOINTING = frozenset({"set_", "resize_", "resize_as_", "as_strided_", "resize_as_sparse_"})
# Factories whose result is fully written by PyTorch (guarded by the bounds gate, not poisoned).
INITIALIZED = frozenset({"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
                         "new_ones", "new_full"})


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of `t` (its own view and anything else in the storage)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def span_elements(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from the first to the last one a strided view touches (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


class Guarded:
    """A tensor placed in the middle of a larger buffer whose other bytes hold a known byte (canaries).

    `view` has the original shape and strides; `check()` names the first byte outside the view's
    elements that changed (in front of it, inside its stride gaps, or past its end)."""

    def __init__(self, like: torch.Tensor, guard_bytes: int, byte: int, label: str):
        self.label = label
        self.byte = byte
        self.item = like.element_size()
        self.guard = max(1, math.ceil(guard_bytes / self.item))
        self.shape, self.stride = tuple(like.shape), tuple(like.stride())
        self.span = span_elements(self.shape, self.stride)
        self.buffer = torch.empty(self.guard + self.span + self.guard, dtype=like.dtype, device=like.device)
        raw_bytes(self.buffer).fill_(byte)
        self.view = self.buffer.as_strided(like.shape, like.stride(), self.guard)
        self.storage_ptr = self.buffer.untyped_storage().data_ptr()
        self.repointed = False  # set by AllocationHook when the kernel calls set_/resize_ on it

    def moved(self) -> bool:
        """Whether the kernel re-pointed or resized the tensor (set_, resize_): then nothing is judged."""
        v = self.view
        return (self.repointed or v.untyped_storage().data_ptr() != self.storage_ptr
                or tuple(v.shape) != self.shape or tuple(v.stride()) != self.stride
                or v.storage_offset() != self.guard)

    def _outside(self) -> list[tuple[int, torch.Tensor]]:
        """(first byte, bytes) of every region of the buffer that is not the view's."""
        raw = raw_bytes(self.buffer)
        total = self.buffer.numel() * self.item
        end = (self.guard + self.span) * self.item
        if self.span == math.prod(self.shape):  # dense: no gaps, only the two guard bands
            return [(0, raw[: self.guard * self.item]), (end, raw[end:total])]
        mask = torch.zeros(self.buffer.numel(), dtype=torch.bool)
        idx = torch.arange(self.buffer.numel()).as_strided(self.shape, self.stride, self.guard)
        mask[idx.reshape(-1)] = True
        outside = ~mask.repeat_interleave(self.item)
        data = raw[:total].cpu()
        return [(0, torch.where(outside, data, torch.full_like(data, self.byte)))]

    def check(self) -> str | None:
        if self.moved():
            return None
        count, first, last = 0, None, None
        for offset, region in self._outside():
            changed = (region != self.byte).nonzero()
            if changed.numel() == 0:
                continue
            count += changed.shape[0]
            lo, hi = offset + int(changed[0, 0]), offset + int(changed[-1, 0])
            first = lo if first is None else min(first, lo)
            last = hi if last is None else max(last, hi)
        if first is None or last is None:
            return None
        first, last = first // self.item - self.guard, last // self.item - self.guard
        if first < 0:
            where = f"{-first} element(s) before its first element"
        elif first >= self.span:
            where = f"{first - self.span + 1} element(s) past its last element"
        else:
            where = f"in a gap between its strided elements (element offset {first})"
        return (f"{count} byte(s) outside {self.label} were written, first {where} "
                f"(changed element offsets {first}..{last} relative to its start, span {self.span})")


class AllocationHook(TorchDispatchMode):
    """While active, fresh tensors made through the dispatcher are poisoned and/or guarded.

    poison: byte written over every `empty*` result (None: leave it as allocated).
    guard_bytes: when set, every factory result is moved into a `Guarded` buffer whose guard bands
    hold `guard_byte`; `empty*` results then start as zeros (or `poison`) so two runs with different
    guard bytes differ only by what the kernel reads or writes out of bounds.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Keeps torch from wrapping __torch_dispatch__ with torch._disable_dynamo, which imports
        # torch._dynamo (slow, and it re-wraps torch.manual_seed).
        return False

    def __init__(self, poison: int | None = None, guard_bytes: int = 0, guard_byte: int = NAN_BYTE):
        super().__init__()
        self.poison = poison
        self.guard_bytes = guard_bytes
        self.guard_byte = guard_byte
        self.guarded: list[Guarded] = []
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _REPOINTING and self.guarded and args and isinstance(args[0], torch.Tensor):
            # The caller holds its own TensorImpl over our storage: see its set_/resize_ here.
            ptr = args[0].untyped_storage().data_ptr()
            for guarded in self.guarded:
                if guarded.storage_ptr == ptr:
                    guarded.repointed = True
        out = func(*args, **(kwargs or {}))
        if name not in UNINITIALIZED and not (self.guard_bytes and name in INITIALIZED):
            return out
        if not isinstance(out, torch.Tensor) or out.layout != torch.strided or out.is_meta \
                or out.is_quantized or out.requires_grad or type(out) is not torch.Tensor or out.numel() == 0:
            return out  # an empty tensor is a placeholder that set_/resize_ will re-point: nothing to fill
        self.count += 1
        if self.guard_bytes:
            guarded = Guarded(out, self.guard_bytes, self.guard_byte,
                              f"the {tuple(out.shape)} {str(out.dtype).removeprefix('torch.')} "
                              f"tensor the kernel allocated with torch.{name} (allocation {self.count})")
            if name in UNINITIALIZED:
                _fill_view(guarded.view, 0 if self.poison is None else self.poison)
            else:
                guarded.view.copy_(out)
            self.guarded.append(guarded)
            return guarded.view
        raw_bytes(out).fill_(self.poison)
        return out


def _fill_view(view: torch.Tensor, byte: int) -> None:
    pattern = torch.full((view.element_size(),), byte, dtype=torch.uint8, device=view.device)
    view.copy_(pattern.view(view.dtype)[0])


def prefill_allocator(device: torch.device, sizes: list[int], byte: int) -> None:
    """Leave free blocks of the given byte sizes filled with `byte` in the allocator's pool.

    CUDA: the caching allocator hands the most recently freed best-fitting block back, so the next
    allocations of these sizes start poisoned. CPU: malloc often returns a freed chunk of the same
    size, but not always (and it overwrites a chunk's first bytes with its own bookkeeping)."""
    blocks = []
    for size in sizes:
        if size <= 0:
            continue
        for _ in range(2):
            block = torch.empty(size, dtype=torch.uint8, device=device)
            block.fill_(byte)
            blocks.append(block)
    synchronize(device)
    del blocks


def _nbytes(obj: Any) -> list[int]:
    return [t.numel() * t.element_size() for t in tensors(obj)]


def _first_mismatch(a: list, b: list) -> tuple[str, Any] | None:
    for (path, x), (_, y) in zip(a, b):
        mismatch = bitwise_mismatch(x, y)
        if mismatch:
            return path, mismatch
    return None


REPEATS = 3  # more runs of each filling before outputs that differ between fillings are blamed on them


def follows_filling(run: Callable[[int], list], nan_run: list, sentinel_run: list, repeats: int = REPEATS) -> bool:
    """Whether outputs that differ between a run over NAN_BYTE-filled memory (`nan_run`) and one over
    SENTINEL_BYTE-filled memory (`sentinel_run`) follow the filling, not chance. `run(byte)` runs the kernel
    over memory filled so and returns its output leaves. Each filling runs `repeats` more times, in turn;
    the difference is chance (a kernel that is not deterministic, judged by the determinism gate) as soon
    as two runs of one filling differ or two runs of different fillings agree. One more run was not
    enough: a kernel whose summation order changes from call to call has only a few distinct results at
    a small shape, and its third run matched its first by chance (examples/softmax.py's
    softmax_atomic_order failed the bounds gate whenever the distributions gate ran before it)."""
    seen = {NAN_BYTE: nan_run, SENTINEL_BYTE: sentinel_run}
    for _ in range(repeats):
        for byte, other in ((NAN_BYTE, SENTINEL_BYTE), (SENTINEL_BYTE, NAN_BYTE)):
            leaves = run(byte)
            if _first_mismatch(seen[byte], leaves) is not None or _first_mismatch(seen[other], leaves) is None:
                return False
    return True


# The shapes gate's edge shapes judged beside the declared ones: sizes 1 and primes are multiples of no block.
EDGE_REASONS = ("every size 1", "every size prime")


def edge_cases(subject: Subject, declared: list[Case]) -> list[Case]:
    """The shapes gate's edge shapes with every size 1 and every size prime (`EDGE_REASONS`), no larger than
    the declared ones, at the first declared case's dtype and seed: a kernel that writes its output in
    whole blocks leaves a tail unwritten only where a size is not a multiple of its block, which a declared
    shape may never be. Unwritten there, the shapes gate would report what that memory held as a small
    numeric error, another one at every call."""
    from kgate.gates.shapes import edge_shapes, numel, takes_shape

    shapes = [c.shape for c in declared if c.shape is not None]
    if not shapes or not takes_shape(subject):
        return []
    cap = min(numel(s) for s in shapes)
    chosen = [s for s, why in edge_shapes(shapes, cap) if numel(s) > 0 and why in EDGE_REASONS]
    return [Case(s, declared[0].dtype, declared[0].seed) for s in chosen]


class Initialization(Gate):
    name = "initialization"
    summary = "every output element written: outputs equal under NaN- and sentinel-poisoned allocations"
    tolerance_free = True

    def run_poisoned(self, subject: Subject, args: tuple, sizes: list[int], byte: int) -> tuple[Any, int]:
        prefill_allocator(subject.device, sizes, byte)
        hook = AllocationHook(poison=byte)
        with hook:
            out = subject.run_kernel(args)
        return out, hook.count

    def poisoned_leaves(self, subject: Subject, args: tuple, sizes: list[int], byte: int, *, count: bool = False) -> Any:
        """The output leaves of a run on a copy of `args` over memory poisoned with `byte` (and the number of
        allocations poisoned, with `count`)."""
        out, allocations = self.run_poisoned(subject, clone_tree(args), sizes, byte)
        leaves = [(p, t.detach().clone()) for p, t in flatten(out) if isinstance(t, torch.Tensor)]
        return (leaves, allocations) if count else leaves

    def check(self, subject: Subject) -> GateResult:
        declared = subject.first_seed_cases()
        edges = edge_cases(subject, declared)
        counted = [0]
        notes: list[str] = []
        for case in declared:
            found = self._judge_case(subject, case, counted, notes)
            if found is not None:
                return found
        for i, case in enumerate(edges):
            if subject.out_of_time():
                notes.append(f"stopped before {len(edges) - i} of {len(edges)} edge shape(s) (the gate's search time)")
                break
            try:  # a shape the reference or the kernel rejects is the shapes gate's to judge
                found = self._judge_case(subject, case, counted, notes)
            except UserCodeError:
                continue
            if found is not None:
                found.message += (" (at an edge shape of the shapes gate; the declared shape(s) are written in "
                                  "full: a tail the kernel never writes there)")
                found.details["edge_shape"] = True
                return found
        extra = "".join(f"; {note}" for note in dict.fromkeys(notes))
        shapes = f" and {len(edges)} edge shape(s) of the shapes gate" if edges else ""
        return self.passed(f"outputs identical under NaN- and sentinel-poisoned memory in {len(declared)} case(s)"
                           f"{shapes} ({counted[0]} kernel allocation(s) poisoned, allocator pool pre-filled){extra}")

    def _judge_case(self, subject: Subject, case: Case, counted: list[int], notes: list[str]) -> GateResult | None:
        base = subject.baseline(case)
        sizes = sorted(set(_nbytes(base.reference) + _nbytes(base.args)), reverse=True)
        runs = []
        for byte in (NAN_BYTE, SENTINEL_BYTE):
            leaves, count = self.poisoned_leaves(subject, base.args, sizes, byte, count=True)
            counted[0] += count
            runs.append(leaves)
        nan_run, sentinel_run = runs
        mismatch_at = _first_mismatch(nan_run, sentinel_run)
        if mismatch_at is not None and not subject.nondeterministic:
            # Tell unwritten memory from a kernel that is merely not deterministic: poison alike again.
            if not follows_filling(functools.partial(self.poisoned_leaves, subject, base.args, sizes),
                                   nan_run, sentinel_run):
                notes.append("the kernel is not deterministic (judged by the determinism gate), so only "
                             "finiteness where the oracle is finite was judged")
                mismatch_at = None
                nondeterministic = True
            else:
                nondeterministic = False
        else:
            nondeterministic = subject.nondeterministic
        if nondeterministic:
            return self._nonfinite(subject, case, base.oracle, nan_run)
        if mismatch_at is None:
            return None
        path, mismatch = mismatch_at
        return self.failed(
            subject, f"{path}: {mismatch.count} of {mismatch.total} element(s) depend on what the "
            f"memory held before the call (never written?): with NaN-poisoned allocations "
            f"{path}{list(mismatch.index)} is {mismatch.expected!r}, with 0x{SENTINEL_BYTE:02X}-"
            f"poisoned ones {mismatch.got!r}", case=case, expected="the same value in both runs",
            got=f"{mismatch.expected!r} vs {mismatch.got!r}", where=f"{path}{list(mismatch.index)}",
            details={"unwritten": mismatch.count, "allocations_poisoned": counted[0]})

    def _nonfinite(self, subject: Subject, case, oracle: Any, run: list) -> GateResult | None:
        oracles = dict(flatten(oracle))
        for path, got in run:
            want = oracles.get(path)
            if not isinstance(want, torch.Tensor) or not got.is_floating_point() or want.shape != got.shape:
                continue
            bad = torch.isfinite(want.to(device=got.device, dtype=got.dtype)) & ~torch.isfinite(got)
            if bad.any():
                flat = int(bad.reshape(-1).nonzero()[0, 0])
                index = list(index_of(flat, tuple(got.shape)))
                return self.failed(
                    subject, f"{path}: {int(bad.sum())} element(s) are non-finite with NaN-poisoned allocations "
                    f"where the oracle is finite (never written?); first at {path}{index}", case=case,
                    expected="finite", got=repr(float(got.reshape(-1)[flat])), where=f"{path}{index}")
        return None


GATE = Initialization
