"""The float64 oracle and the calibrated bound.

The oracle is the reference evaluated in float64 on the same inputs, upcast. The bound a kernel must
meet is calibrated from the reference's own error in the kernel's dtype, measured on the same inputs:

    ref_err = max |reference(x) - oracle(x)|               (reference run in the kernel's dtype)
    floor   = ulps * max(eps(dtype) * max |oracle(x)|, smallest subnormal of dtype) + atol
    bound   = factor * ref_err + floor
    pass   <=> max |kernel(x) - oracle(x)| <= bound

maxima over the elements where the oracle, rounded to the output dtype, is finite (the special_values
gate judges the others; a kernel that is non-finite where the oracle is finite has infinite error, but
for an Inf of the oracle's sign where the bound, taken at that element's magnitude, reaches past the
dtype's largest finite value: its error is then the distance to the overflow threshold).
`factor` (default 8) says how much worse than the reference a kernel may be; `ulps` (default 4) keeps
the bound meaningful where the reference happens to be exact. `kgate calibrate` re-judges a report
over a sweep of factors. Integer and boolean outputs must match exactly.

The rounding error of a computation, and its risk of overflow, are set by the magnitude of the terms it
combines, not by its result. Where a leaf would fail, `measure` asks for them (`TermMagnitudes`, which
follows the float64 oracle's own computation op by op; `Subject.terms`) and applies two rules:

- the terms behind a leaf are larger than every finite element of the oracle there (a cancellation: a
  cosine similarity of nearly orthogonal rows, exactly 0 in a layer norm's gradient over one feature or a
  label-smoothed loss over one class): the floor is taken at the largest magnitude of the terms behind it
  (first order: carried through sums and selections, through a product as each factor's terms times the
  other's values, started afresh at any other op), if within the dtype's range. A reference that rounds its
  few sums luckily (a single cosine of a 4097-wide row within 1e-10 of float64, where another float32
  order of summation errs by 3e-9 and torch's own by 2e-9 on other draws) then sets no bound that only luck
  meets;
- the terms of the sums the computation takes add up past the dtype's largest value (a row sum near
  float32's largest value): non-finite outputs where the oracle is finite are not judged, since some
  order of summation overflows while the exact result is finite. Where they add up to less, no order
  overflows, and a non-finite output still fails.

Both are per leaf (the terms are kept per tensor, not per element) and are named in the LeafError
(`terms`, `partial_sums`, `beyond_range`) and its message. The terms are the reference's: a kernel that
computes through larger intermediates than the reference (fla's decay gradient by a running-sum identity
where the reference multiplies by an underflowed exp(g) = 0) gets no room from them.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import itertools
import math
import os
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from kgate.compare import index_of, map_tensors, on_device_of

BROKEN_FACTOR = 10.0  # an oracle miss of more than this many bounds counts as broken


def upcast(obj: Any, device: torch.device | None = None) -> Any:
    """Fresh float64 (complex128) copies of every floating tensor; other tensors cloned."""

    def one(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if device is not None:
            t = t.to(device)
        if t.is_complex():
            return t.to(torch.complex128).clone()
        if t.is_floating_point():
            return t.to(torch.float64).clone()
        return t.clone()

    return map_tensors(obj, one)


def converted_copy(module: torch.nn.Module, *, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of `module` moved to `device` and `dtype` (the reference for the float64 oracle), whose
    own functions follow it: a function stored on a module that closes over the module or its parts (in
    KernelBench's MiniGPTBlock, `self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))` with `m = self.mlp`)
    is rebuilt with the copies in its closure. copy.deepcopy keeps functions as they are, so the copy's
    lambda would call the original's float32 layers, on another device after the CPU fallback."""
    memo: dict[int, Any] = {}
    dup = copy.deepcopy(module, memo)
    for sub in dup.modules():
        for name, value in list(vars(sub).items()):
            if isinstance(value, types.FunctionType) and value.__closure__:
                vars(sub)[name] = _rebound(value, memo)
    return dup.to(device=device, dtype=dtype)


class _NotPlain(Exception):
    """A module holds state that `plain_state` cannot compare: its copy is made anew, not refreshed."""


# the attributes every nn.Module has (its hooks among them): compared only as empty
_MODULE_KEYS = frozenset(vars(torch.nn.Module()))


def _plain(value: Any) -> Any:
    """`value` as a comparable constant (None, bool, int, float, str, dtype, device, tuples and lists of those)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_plain(v) for v in value))
    raise _NotPlain


def plain_state(module: torch.nn.Module) -> tuple:
    """Everything of `module` but its parameters' and buffers' values, where all of it is plain (`_plain`): per
    submodule its name, class, training flag, the plain values of its own attributes, and the names, shapes and
    autograd flags of its parameters and buffers. Raises _NotPlain where a submodule holds anything else (a
    function, a tensor or a container kept as an attribute, a hook): a state whose changes only a deep copy
    takes along."""
    found = []
    for name, sub in module.named_modules(remove_duplicate=False):
        attributes = []
        for key, value in vars(sub).items():
            if key in ("_parameters", "_buffers", "_modules", "training"):
                continue
            if key == "_non_persistent_buffers_set":
                attributes.append((key, tuple(sorted(value))))
                continue
            if key in _MODULE_KEYS and isinstance(value, dict):
                if value:
                    raise _NotPlain  # a hook
                continue
            attributes.append((key, _plain(value)))
        tensors = tuple((kind, key, None if t is None else (tuple(t.shape), t.requires_grad, t.layout))
                        for kind, held in (("p", sub._parameters), ("b", sub._buffers)) for key, t in held.items())
        found.append((name, type(sub), sub.training, tuple(attributes), tensors))
    return tuple(found)


def refreshed(dup: torch.nn.Module, module: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Set the converted copy `dup` (`converted_copy` to `dtype`) to `module`'s parameters and buffers as they are
    now, in place, and return True, where nothing else of the two differs (`plain_state`): what a new converted
    copy would hold, without a deep copy of every submodule (some 700 in a DenseNet-201, a fifth of a second a
    copy in Python alone). False, `dup` untouched, where a new copy is needed (a module whose own conversion left a
    floating tensor in another dtype than `dtype` too)."""
    try:
        if plain_state(dup) != plain_state(module):
            return False
        pairs = []
        for held in ("named_parameters", "named_buffers"):
            mine = list(getattr(module, held)(remove_duplicate=False))
            theirs = list(getattr(dup, held)(remove_duplicate=False))
            if [n for n, _ in mine] != [n for n, _ in theirs]:
                return False
            for (_, t), (_, d) in zip(mine, theirs):
                if t.is_complex() or t.layout != torch.strided or d.layout != torch.strided or t.shape != d.shape \
                        or d.dtype != (dtype if t.is_floating_point() else t.dtype):
                    return False
                pairs.append((d, t))
    except Exception:  # noqa: BLE001 - a state these cannot read (a lazy module's uninitialized parameter)
        return False
    with torch.no_grad():
        for d, t in pairs:
            d.copy_(t)
    return True


def _rebound(fn: types.FunctionType, memo: dict[int, Any]) -> types.FunctionType:
    """`fn` with every object in its closure that deepcopy copied replaced by the copy."""
    cells = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned after the function was made)
            cells.append(types.CellType())
            continue
        cells.append(types.CellType(memo.get(id(value), value)))
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    new.__kwdefaults__, new.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    new.__dict__.update(fn.__dict__)
    return new


def eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


@dataclass
class LeafError:
    """How far one output tensor is from the oracle, with the bound it was judged against."""

    path: str
    err: float
    ref_err: float | None
    scale: float
    floor: float
    bound: float
    factor: float
    index: list[int] | None = None
    expected: float | None = None
    got: float | None = None
    rel_err: float = 0.0
    exact: bool = False
    sensitivity: float = 0.0
    overflows: int = 0  # Inf outputs counted as within the bound (they round up from within it; see measure)
    terms: float | None = None  # the terms' magnitude the floor was taken at, the oracle being 0 (see measure)
    partial_sums: float | None = None  # the sums' terms' magnitude, where non-finite outputs were weighed against it
    beyond_range: int = 0  # non-finite outputs not judged: the sums' terms pass the dtype's range (see measure)

    @property
    def passed(self) -> bool:
        return self.err <= self.bound

    @property
    def where(self) -> str:
        """The output path, with the worst element's index where there is one."""
        return f"{self.path}{self.index}" if self.index is not None else self.path

    @property
    def ratio(self) -> float:
        if self.bound > 0:
            return self.err / self.bound
        return 0.0 if self.err == 0 else math.inf

    def describe(self) -> str:
        where = f" at {self.path}{self.index}" if self.index is not None else f" in {self.path}"
        if self.exact:
            return f"{self.path}: exact match required; differs{where}: expected {self.expected}, got {self.got}"
        ref = "unknown" if self.ref_err is None else f"{self.ref_err:.3g}"
        if self.sensitivity and self.ref_err is not None and self.ref_err <= self.sensitivity:
            ref += " (the input sensitivity: at least the oracle's change when every input moves by an ulp)"
        overflows = (f"; {self.overflows} Inf output(s) of the oracle's sign counted as overflows from within "
                     "the bound" if self.overflows else "")
        return (f"max abs error {self.err:.3g}{where} (expected {self.expected:.6g}, got {self.got:.6g}); "
                f"bound {self.bound:.3g} = {self.factor:g} x reference error {ref} + floor {self.floor:.3g}"
                f"{self.terms_note()}; max rel error {self.rel_err:.3g}{overflows}")

    def terms_note(self) -> str:
        """What the magnitude of the terms did to the judgement ('' where the bound did not take it)."""
        notes = []
        if self.terms is not None:
            notes.append(f"the floor taken at the magnitude of the terms the oracle's computation combines, "
                         f"{self.terms:.3g}: larger than the oracle anywhere in {self.path}, a cancellation whose "
                         "rounding leaves a residue of its terms")
        if self.beyond_range:
            notes.append(f"{self.beyond_range} non-finite output(s) where the oracle is finite not judged: the "
                         f"terms of the sums the oracle's computation takes add up to {self.partial_sums:.3g}, "
                         "past the dtype's largest value, so a partial sum overflows in some order")
        elif self.partial_sums is not None:
            notes.append(f"the terms of the sums the oracle's computation takes add up to {self.partial_sums:.3g}"
                         ", within the dtype's range: no order of summation overflows")
        return "".join(f" ({note})" for note in notes)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("err", "bound", "rel_err", "terms", "partial_sums"):
            if isinstance(data[key], float) and math.isinf(data[key]):
                data[key] = "inf"
        return data


def rejudge(err: float, ref_err: float | None, floor: float, factor: float) -> bool:
    """The oracle verdict for a recorded case at another tolerance factor (kgate calibrate)."""
    return err <= factor * (ref_err or 0.0) + floor


def _max_abs(diff: torch.Tensor) -> tuple[float, int]:
    flat = diff.reshape(-1)
    pos = int(torch.argmax(flat))
    return float(flat[pos]), pos


def measure(kernel: torch.Tensor, reference: torch.Tensor | None, oracle: torch.Tensor, *, path: str,
            factor: float, ulps: float, atol: float, scale_at_least: float = 0.0,
            sensitivity: float | Callable[[], float] = 0.0,
            terms: Callable[[], Terms | None] | None = None) -> LeafError:
    """Error of one kernel output against the oracle and the bound calibrated from the reference.

    Computed where the oracle lives (the GPU for a GPU kernel): outputs of KernelBench problems reach
    10^9 elements, and float64 temporaries of that size on the host cost minutes and tens of GiB.
    `scale_at_least` raises the magnitude the floor is taken of (a caller's typical output magnitude, for
    inputs whose exact outputs are all zero). `sensitivity` (how far the oracle moves when every input
    moves by an ulp of its dtype: `input_sensitivity`) is the least reference error the bound assumes: a
    reference that computes in a wider dtype inside (torch's reductions of float32 on the CPU) is nearly
    exact even on ill-conditioned inputs, where any computation in the kernel's dtype is not. Given as a
    callable (it costs another oracle call), it is asked only where the kernel misses the bound without it or
    an output is non-finite (the bound then decides an overflow): the verdict is the same as with its value
    given, and a leaf that passes without it records the bound without it (0 sensitivity), a stricter one.

    `terms` (called only where the kernel misses the bound otherwise) gives the magnitudes of the terms the
    oracle's computation combines (`Terms`, from `TermMagnitudes`). Where their largest magnitude is larger
    than every finite element of the oracle, the floor is taken at it (if within the dtype's range): a
    cancellation (to an exact 0 in a layer norm's gradient over one feature, the label-smoothed loss over
    one class; to a small value in a cosine of nearly orthogonal rows) keeps a residue of a few ulps of its
    terms in any computation that rounds them differently than the reference.
    Where the sums it takes have terms whose magnitudes add up past the dtype's largest value, non-finite
    outputs where the oracle is finite are not judged: a partial sum overflows in some order of summation (a
    blocked row sum near float32's largest value) while the exact result is finite. Both are recorded in
    the LeafError (`terms`, `partial_sums`, `beyond_range`) and named by `describe`. An integer output is exact:
    equal to the oracle's, or to the reference's own, or, for the indices of a selection (`Terms.selection`),
    selecting a value the oracle's float64 computation ties with the one it chose."""
    # on the oracle's device: it is on the CPU only where the device refused it, so the comparison
    # must not go back there either
    o = oracle.detach()
    k = on_device_of(kernel.detach(), o)
    if not (k.is_floating_point() or k.is_complex()):
        # an integer output (indices, counts) equals the oracle's, or where they differ the reference's own in the
        # kernel's dtype: a rounding of the inputs' dtype that ties two values the oracle tells apart (a top-k of
        # scores near 2.5e6, whose float32 sums round to one value) selects as the reference does, not as float64
        same = (k == o.to(k.dtype)) if k.shape == o.shape else None
        if same is not None and isinstance(reference, torch.Tensor) and reference.shape == k.shape \
                and not bool(same.all()):
            same = same | (k == on_device_of(reference.detach(), k).to(k.dtype))
        if same is not None and not bool(same.all()) and terms is not None:
            # indices of a selection whose values the oracle's own float64 computation ties (a softmax of logits
            # 1e-20 apart gives equal probabilities): the kernel's choice among the tied is as right as the oracle's
            behind = terms()
            tied = behind.selection.ties(k, o) if behind is not None and behind.selection is not None else None
            if tied is not None:
                same = same | tied
        if same is not None and bool(same.all()):
            return LeafError(path, 0.0, 0.0, 0.0, 0.0, 0.0, factor, exact=True)
        diff = (~same).reshape(-1) if same is not None else torch.ones(1, dtype=torch.bool)
        pos = int(diff.nonzero()[0, 0]) if diff.any() else 0
        index = list(index_of(pos, tuple(k.shape)))
        expected = o.reshape(-1)[pos].item() if o.numel() > pos else None
        got = k.reshape(-1)[pos].item() if k.numel() > pos else None
        return LeafError(path, math.inf, 0.0, 0.0, 0.0, 0.0, factor, index=index, expected=expected, got=got,
                         exact=True)
    dtype = k.dtype
    if k.is_complex():
        k, o = torch.view_as_real(k), torch.view_as_real(o.to(torch.complex128))
        dtype = k.dtype
    o64 = o.to(torch.float64)
    finite = torch.isfinite(o64)
    if dtype != torch.float64:
        finite &= torch.isfinite(o64.to(dtype))
    has_finite = bool(finite.any())
    zero = torch.zeros((), dtype=torch.float64, device=o64.device)
    own_scale = float(torch.where(finite, o64.abs(), zero).max()) if has_finite else 0.0
    scale = max(own_scale, scale_at_least)
    floor = ulps * ulp_at(dtype, scale) + atol
    ref_err: float | None = None
    if reference is not None:
        r = reference.detach()
        if r.is_complex():
            r = torch.view_as_real(r)
        if r.shape == o64.shape:
            rdiff = r.to(device=o64.device, dtype=torch.float64).sub(o64).abs_()  # never in place: r may be o64's own
            rdiff = torch.where(finite, rdiff, zero).nan_to_num_(nan=math.inf)
            ref_err = float(rdiff.max()) if rdiff.numel() else 0.0
            del rdiff
            if math.isinf(ref_err):
                ref_err = None  # the reference itself leaves the finite range: calibrate from the floor only
    own_ref_err = ref_err
    pending = sensitivity if callable(sensitivity) else None  # a callable, asked only where needed: 0 until then
    moved = 0.0 if callable(sensitivity) else float(sensitivity)

    def with_sensitivity() -> tuple[float | None, float]:
        err_ref = max(own_ref_err or 0.0, moved) if moved > 0 and (own_ref_err is not None or reference is None) \
            else own_ref_err
        return err_ref, factor * (err_ref or 0.0) + floor

    def ask() -> None:
        nonlocal pending, moved, ref_err, bound
        if pending is not None:
            moved, pending = float(pending()), None
            ref_err, bound = with_sensitivity()

    ref_err, bound = with_sensitivity()
    if k.shape != o64.shape or not has_finite:
        return LeafError(path, 0.0, ref_err, scale, floor, bound, factor, sensitivity=moved)
    kd = k.to(torch.float64)
    kernel_finite = torch.isfinite(kd)
    diff = kd.sub(o64).abs_()
    diff.masked_fill_(~kernel_finite, math.inf)
    overflows = 0
    if dtype != torch.float64 and not bool(kernel_finite.all()):
        ask()  # (the bound decides which Inf outputs round up from within it)
        # An overflow to Inf of the oracle's sign where the bound, taken at the element's own magnitude,
        # reaches past the dtype's largest finite value: the true value is within the bound of one that
        # rounds to Inf. Its error is the distance to the overflow threshold (within the bound by the
        # condition), never where the truth is moderate.
        threshold = overflow_threshold(dtype)
        reach = o64.abs() * (1 + bound / scale) if scale > 0 else torch.zeros_like(o64)
        rounds_up = torch.isinf(kd) & (torch.sign(kd) == torch.sign(o64)) & finite & (reach >= threshold)
        overflows = int(rounds_up.sum())
        if overflows:
            diff = torch.where(rounds_up, (threshold - o64.abs()).clamp_min_(0.0), diff)
            kernel_finite |= rounds_up
    diff.masked_fill_(~finite, 0.0)
    err, pos = _max_abs(diff)
    if err > bound:
        ask()
    magnitude, partial_sums, beyond_range = None, None, 0
    if terms is not None and err > bound:
        unexplained = ~kernel_finite & finite
        behind = terms()
        if behind is not None:
            threshold = overflow_threshold(dtype)
            if scale < behind.magnitude < threshold:
                magnitude = scale = behind.magnitude
                # a result that cancels to exactly 0 keeps a residue of its terms in its own dtype; one that cancels
                # to a small value is the rounding of sums that torch keeps in float32 for a half-precision output
                # (a float16 row sum): only their precision is owed there, else a float16 running total passes
                unit = dtype if own_scale == 0 or torch.finfo(dtype).bits >= 32 else torch.float32
                floor = ulps * ulp_at(unit, scale) + atol
                bound = factor * (ref_err or 0.0) + floor
            if bool(unexplained.any()):
                partial_sums = behind.partial_sums
                if partial_sums >= threshold:
                    beyond_range = int(unexplained.sum())
                    diff.masked_fill_(unexplained, 0.0)
            err, pos = _max_abs(diff)
    # relative error where the oracle is finite and non-zero (in place: diff is not needed after this)
    rel = diff.div_(o64.abs().clamp_min_(torch.finfo(dtype).tiny))
    rel.masked_fill_(~finite | (o64 == 0), 0.0)
    rel_err = float(rel.max()) if rel.numel() else 0.0
    index = list(index_of(pos, tuple(k.shape)))
    return LeafError(path, err, ref_err, scale, floor, bound, factor, index=index,
                     expected=float(o64.reshape(-1)[pos]), got=float(kd.reshape(-1)[pos]), rel_err=rel_err,
                     sensitivity=moved, overflows=overflows, terms=magnitude, partial_sums=partial_sums,
                     beyond_range=beyond_range)


def ulp_at(dtype: torch.dtype, scale: float) -> float:
    """The unit of the floor: eps(dtype) x scale, but never less than the dtype's smallest subnormal, the
    spacing of its values below the smallest normal. Outputs near the smallest subnormals (a decaying
    recurrence at subnormal magnitudes) move by whole subnormal steps with each rounding, which a relative
    floor alone leaves no room for."""
    if not dtype.is_floating_point:
        return 0.0
    return max(eps(dtype) * scale, float(torch.finfo(dtype).smallest_normal) * eps(dtype))


def overflow_threshold(dtype: torch.dtype) -> float:
    """The least magnitude that rounds to Inf in `dtype` (round to nearest): its largest finite value plus
    half an ulp there."""
    info = torch.finfo(dtype)
    return float(info.max) + 2.0 ** (math.frexp(float(info.max))[1] - 1) * info.eps / 2


# -- the magnitude of the terms a computation combines ----------------------------------------------------

_aten, _prims = torch.ops.aten, torch.ops.prims
# Ops each of whose output elements is a sum of products of their arguments' elements: evaluated on the
# magnitudes of their arguments they give the sum of the magnitudes of the terms, which bounds every partial
# sum, in any order of summation.
_SUMS = frozenset({
    _aten.sum.default, _aten.sum.dim_IntList, _aten.nansum.default, _aten.cumsum.default, _aten.mm.default,
    _aten.bmm.default, _aten.addmm.default, _aten.baddbmm.default, _aten.addbmm.default, _aten.mv.default,
    _aten.addmv.default, _aten.dot.default, _aten.convolution.default, _prims.sum.default})
_MEANS = frozenset({_aten.mean.default, _aten.mean.dim})  # that sum: the mean of the magnitudes x the count
_VARIANCES = frozenset({_aten.var.correction, _prims.var.default})  # the sum of squares: variance x count
_WRITES_FIRST = frozenset({_aten.zero_.default, _aten.fill_.Scalar, _aten.fill_.Tensor, _aten.copy_.default})
# How the magnitude of the terms goes through an op (by the op's name, in place or not): it is carried
# through ops that add, select or move values (the terms of a sum are those of its summands), multiplied
# through products and quotients, and starts again at the result of any other op (exp, log, rsqrt, pow...),
# whose rounding is relative to its own result: exp(-1e6) is 0, not a residue of a term of 1e6.
_CARRIED = frozenset({
    "add", "sub", "rsub", "neg", "sum", "nansum", "mean", "cumsum", "where", "cat", "stack", "clone", "copy",
    "_to_copy", "to", "contiguous", "index", "gather", "index_select", "masked_fill", "index_put", "scatter",
    "scatter_add", "index_add", "constant_pad_nd", "flip", "roll", "repeat", "tril", "triu", "amax", "amin",
    "max", "min", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "abs", "relu", "sort", "topk",
    "lift_fresh", "_unsafe_view", "alias"})
_PRODUCTS = frozenset({"mul", "mm", "bmm", "mv", "dot", "outer", "matmul"})
_ADDED_PRODUCTS = frozenset({"addmm", "baddbmm", "addbmm", "addmv"})  # beta x input + alpha x (a @ b)
# Fused ops that hide their terms inside (a softmax's x and logsumexp, a normalization's sum of squares),
# decomposed into the ops that form them; the rest as torch's core ATen decompositions leave it.
_FUSED = (_aten._softmax.default, _aten._log_softmax.default, _aten.native_layer_norm.default, _aten.native_group_norm.default, _aten.native_batch_norm.default,
          _aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit.no_stats,
          _aten._native_batch_norm_legit_no_training.default, _aten._fused_rms_norm.default,
          _aten.var_mean.correction, _aten.std.correction, _aten.std_mean.correction)


def _selected(func: Any, args: tuple) -> list:
    """The arguments an op reads its values from: for `where(condition, a, b)`, the branch the condition never
    selects left out (a `where(m > 0, m, ones)` whose every m is positive carries m's terms, not the ones' 1);
    else all of them."""
    if func is _aten.where.self and len(args) == 3 and isinstance(args[0], torch.Tensor):
        condition = args[0]
        if condition.numel() and bool(condition.all()):
            return [args[0], args[1]]
        if condition.numel() and not bool(condition.any()):
            return [args[0], args[2]]
    return list(args)


@functools.cache
def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    table.update({op: decomposition_table[op] for op in _FUSED if op in decomposition_table})
    return table


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def _largest(t: torch.Tensor) -> torch.Tensor | None:
    """max |t| as a 0-d float64 tensor on t's device (NaN counted as 0, Inf as Inf); None for an empty t."""
    if t.numel() == 0:
        return None
    return t.detach().abs().amax().double().nan_to_num(nan=0.0, posinf=math.inf)


@dataclass(frozen=True)
class Terms:
    """What `TermMagnitudes` knows of the computation behind one tensor: `magnitude`, the largest magnitude of
    the terms it combines (to first order, see TermMagnitudes); `partial_sums`, the largest sum of the terms' magnitudes among the
    sums it was computed from (0 where it took none): every partial sum of those, in any order, is within it."""

    magnitude: float
    partial_sums: float
    # for an integer tensor of indices a selection made (argmax, topk, sort, max over a dimension): the values it
    # selected among and the dimension (None: over the flattened values), so a kernel's index whose value ties
    # the oracle's own choice in float64 is as right as it (`Selection.ties`)
    selection: Selection | None = None


@dataclass(frozen=True)
class Selection:
    """The values an index-giving op selected among, in the oracle's computation, and along which dimension."""

    values: torch.Tensor
    dim: int | None
    keepdim: bool = True

    def ties(self, kernel: torch.Tensor, oracle: torch.Tensor) -> torch.Tensor | None:
        """Per index of `kernel`, whether it selects a value equal (in float64) to the one `oracle`'s index
        selects; None where the indices cannot be read so (another shape, an index out of range)."""
        values = self.values.reshape(-1) if self.dim is None else self.values
        k, o = kernel.to(torch.int64), oracle.to(device=kernel.device, dtype=torch.int64)
        if k.shape != o.shape:
            return None
        dim = 0 if self.dim is None else self.dim % values.dim()
        if self.dim is None:
            k, o = k.reshape(-1), o.reshape(-1)
        elif not self.keepdim:
            k, o = k.unsqueeze(dim), o.unsqueeze(dim)
        values = values.to(k.device)
        if k.dim() != values.dim() or not bool(((k >= 0) & (k < values.shape[dim])).all()) or \
                any(a != b for i, (a, b) in enumerate(zip(k.shape, values.shape)) if i != dim):
            return None
        same = torch.gather(values, dim, k) == torch.gather(values, dim, o)
        return same.reshape(kernel.shape)


# ops that give indices of a selection: (the index output's position among the results, how the dimension and
# keepdim are read from the arguments)
_SELECTIONS = {"argmax": 0, "argmin": 0, "topk": 1, "sort": 1, "max": 1, "min": 1}
_FIRST_OF_TIES = frozenset({"argmax", "argmin", "max", "min"})
_INDEX_CARRIED = frozenset({"clone", "_to_copy", "alias", "view", "_unsafe_view", "reshape", "contiguous",
                            "lift_fresh", "detach", "to"})


def _selection(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[torch.Tensor, Selection] | None:
    """(the index tensor, its Selection) for an op of `_SELECTIONS` on a floating tensor; None otherwise."""
    name = func.overloadpacket.__name__
    if name not in _SELECTIONS or not args or not _floating(args[0]):
        return None
    results = list(out) if isinstance(out, (tuple, list)) else [out]
    at = _SELECTIONS[name]
    if len(results) <= at or not isinstance(results[at], torch.Tensor) or results[at].is_floating_point():
        return None
    params = _named_args(func, args, kwargs)
    if name in ("argmax", "argmin"):
        dim, keepdim = params.get("dim"), bool(params.get("keepdim", False))
    elif name in ("max", "min"):
        if "dim" not in params:
            return None
        dim, keepdim = params["dim"], bool(params.get("keepdim", False))
    else:  # topk, sort: the indices have the values' rank
        dim, keepdim = params.get("dim", -1), True
    return results[at], Selection(args[0].detach(), dim, keepdim)


def _named_args(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An ATen op's arguments by name (its schema's), defaults left out."""
    names = [a.name for a in func._schema.arguments]
    found = dict(zip(names, args))
    found.update(kwargs)
    return found


class TermMagnitudes(TorchDispatchMode):
    """Follows a float64 computation op by op and gives each floating tensor it forms the magnitudes of the
    terms it was computed from (`Terms`). The magnitude is its own largest value or, where larger, its terms'
    to first order: carried as they are through ops that add, select or move values (`_CARRIED`, views),
    through a product (`_PRODUCTS`, `_ADDED_PRODUCTS`, convolution) as each factor's terms times the other
    factor's values, through a quotient likewise, and started afresh at any other op (exp, log, rsqrt...),
    whose rounding is relative to its own result. The partial sums are the largest sum of the terms'
    magnitudes among the sums it took, carried through every op (`_SUMS`, `_MEANS`, `_VARIANCES`: that sum
    bounds every partial sum, whatever the order). Fused softmax and normalizations and the ops torch's core
    ATen decompositions cover are followed through their decompositions, so that the terms they form inside
    (a logsumexp, a mean, a variance) count.

    The rounding error of a computation in a dtype is set by these magnitudes, not by its result: a result
    that cancels to exactly 0 keeps a residue of a few ulps of its terms, and a partial sum whose terms pass
    the dtype's largest value may overflow in some order of summation while the exact result is finite.
    The computation followed is the reference's, in float64; the kernel's may form other intermediates.
    Magnitudes are kept per tensor, not per element: a tensor formed from several (a `where` of two
    branches) carries the largest of them all."""

    def __init__(self) -> None:
        super().__init__()
        self._tags = WeakTensorKeyDictionary()  # tensor -> float64 [magnitude, partial sums] on its device
        self._selections = WeakTensorKeyDictionary()  # index tensor -> the Selection that made it

    def of(self, t: torch.Tensor) -> Terms | None:
        """The terms behind `t` (its own largest magnitude, no sums, for a tensor not formed here); for an integer
        tensor of a selection's indices, that selection."""
        if isinstance(t, torch.Tensor) and not _floating(t):
            chosen = self._selections.get(t)
            return None if chosen is None else Terms(0.0, 0.0, chosen)
        tag = self._tag(t) if _floating(t) else None
        return None if tag is None else Terms(float(tag[0]), float(tag[1]))

    def _tag(self, t: torch.Tensor) -> torch.Tensor | None:
        tag = self._tags.get(t)
        if tag is not None:
            return tag
        largest = _largest(t)
        return None if largest is None else torch.stack([largest, torch.zeros_like(largest)])

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        decomposition = _decompositions().get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        self._follow_indices(func, args, kwargs, out)
        results = [t for t in tree_flatten(out)[0] if _floating(t)]
        if not results:
            return out
        name = func.overloadpacket.__name__
        read = [] if name.endswith("_like") or name.startswith("new_") else \
            list(args[1:]) if func in _WRITES_FIRST else _selected(func, args)
        inputs = [t for t in tree_flatten((read, kwargs))[0] if _floating(t)]
        tags = [tag for tag in map(self._tag, inputs) if tag is not None]
        total, own_units = self._partial_sums(func, args, kwargs, inputs, results[0])
        sums = [tag[1] for tag in tags] + ([total] if total is not None else [])
        magnitude = self._magnitude(func, name.removesuffix("_"), args, kwargs, tags, own_units)
        for t in results:
            own = _largest(t)
            if own is None:
                continue
            largest = own if magnitude is None else torch.maximum(own, magnitude.to(own.device))
            partial = own.new_zeros(())
            for value in sums:
                partial = torch.maximum(partial, value.to(own.device))
            self._tags[t] = torch.stack([largest, partial])
        return out

    def _follow_indices(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Note the indices a selection gives, and carry them through copies and views of the same shape."""
        made = _selection(func, args, kwargs, out)
        if made is not None:
            # argmax, argmin, max and min document the first of equal values: there a tie of the values as given
            # is the op's own rule, and only values this computation formed (rounded) may tie what exact
            # arithmetic tells apart; topk and sort leave the order of equal values open
            if func.overloadpacket.__name__ in _FIRST_OF_TIES and args[0] not in self._tags:
                return
            self._selections[made[0]] = made[1]
            return
        if func.overloadpacket.__name__ in _INDEX_CARRIED and args and isinstance(args[0], torch.Tensor) and \
                isinstance(out, torch.Tensor) and not _floating(out) and tuple(out.shape) == tuple(args[0].shape):
            chosen = self._selections.get(args[0])
            if chosen is not None:
                self._selections[out] = chosen

    def _magnitude(self, func: Any, name: str, args: tuple, kwargs: dict, tags: list[torch.Tensor],
                   total: torch.Tensor | None) -> torch.Tensor | None:
        """The magnitude of the terms of an op's result beyond its own values (None: its own values only), to
        first order: a product's terms are each factor's terms times the other factor's values."""
        def terms(x: Any) -> Any:
            if _floating(x):
                tag = self._tag(x)
                return 0.0 if tag is None else tag[0]
            return abs(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0

        def value(x: Any) -> Any:
            if _floating(x):
                largest = _largest(x)
                return 0.0 if largest is None else largest
            return abs(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 1.0

        def product(a: Any, b: Any) -> Any:
            return max(terms(a) * value(b), value(a) * terms(b), key=float)

        found: Any = None
        if func.is_view or name in _CARRIED:
            found = max((tag[0] for tag in tags), key=float, default=None)
        elif name in _PRODUCTS and len(args) >= 2:
            found = product(args[0], args[1])
        elif name in _ADDED_PRODUCTS and len(args) >= 3:
            beta, alpha = abs(kwargs.get("beta", 1)), abs(kwargs.get("alpha", 1))
            found = max(beta * terms(args[0]), alpha * product(args[1], args[2]), key=float)
        elif name == "convolution" and len(args) >= 3:
            found = max(product(args[0], args[1]), terms(args[2]) if args[2] is not None else 0.0, key=float)
        elif name == "div" and len(args) >= 2:
            divisor = args[1]
            inverse = _largest(1 / divisor.detach().double()) if _floating(divisor) else \
                1 / abs(divisor) if divisor else math.inf
            if inverse is not None:  # d(a/b) = da / b - (a/b) db / b
                found = max(terms(args[0]) * inverse, value(args[0]) * inverse * inverse * terms(divisor), key=float)
        if total is not None:
            found = total if found is None else max(found, total, key=float)
        if found is None or isinstance(found, torch.Tensor):
            return found
        return torch.tensor(float(found), dtype=torch.float64)

    @staticmethod
    def _partial_sums(func: Any, args: tuple, kwargs: dict, inputs: list[torch.Tensor],
                      first: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The largest sum of the terms' magnitudes of a summing op, and the same in its result's own units (None,
        None for other ops): a sum's terms are its summands; a mean's are its summands over the count (its partial
        sums, the count times larger, are divided before they reach the result); a variance's are its own values
        (the sum of squares behind it is its partial sum alone, None in its units)."""
        count = inputs[0].numel() / max(first.numel(), 1) if inputs else 1.0
        if func in _SUMS or func in _MEANS:
            def magnitude(x: Any) -> Any:
                return x.abs() if _floating(x) else abs(x) if isinstance(x, float) else x

            absolute = [magnitude(a) for a in args]
            extra = {k: abs(v) if k in ("alpha", "beta") and isinstance(v, (int, float)) else magnitude(v)
                     for k, v in kwargs.items()}
            total = _largest(func(*absolute, **extra))
            return (total * count if total is not None and func in _MEANS else total), total
        if func in _VARIANCES:
            largest = _largest(first)
            return (None if largest is None else largest * count), None
        return None, None


# Functions that draw random floating values in torch's default dtype (or, *_like, in their input's), and the
# in-place draws into a tensor: what a reference that makes its own random tensors inside forward calls.
_DRAWS = ("randn", "rand")
_DRAWS_LIKE = ("randn_like", "rand_like")
_DRAWS_INTO = ("normal_", "uniform_")


class _DrawsAt(TorchFunctionMode):
    """Random draws that would be float64 are made in `dtype` and upcast: from one generator state, torch
    draws other values in float64 than in float32 (CPU and CUDA alike), so a float64 oracle that drew its
    own `torch.randn` initial state would compute from another state than the reference and the kernel."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if kwargs.get("out") is None and kwargs.get("dtype") is None:
            if name in _DRAWS and torch.get_default_dtype() == torch.float64:
                return func(*args, **{**kwargs, "dtype": self.dtype}).to(torch.float64)
            if name in _DRAWS_LIKE and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
                return func(*args, **{**kwargs, "dtype": self.dtype}).to(torch.float64)
        if name in _DRAWS_INTO and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            target = args[0]
            drawn = func(torch.empty(target.shape, dtype=self.dtype, device=target.device), *args[1:], **kwargs)
            with torch.no_grad():
                return target.copy_(drawn)
        return func(*args, **kwargs)


@contextlib.contextmanager
def float64_defaults(draws: torch.dtype | None = None) -> Iterator[None]:
    """torch's default dtype set to float64 for the oracle's call, and restored after (whatever the call
    raises): a reference that makes tensors inside forward (KernelBench's LSTM and GRU problems draw their
    initial states with `torch.randn(...)`) makes them in float64, as its converted parameters are, instead
    of raising 'mat1 and mat2 must have the same dtype'. Its random draws are made in `draws` (by default
    the default dtype outside: what the reference at the kernel's dtype draws) and upcast, so the oracle
    computes from the values the reference and the kernel drew from the same generator state."""
    previous = torch.get_default_dtype()
    draws = draws or previous
    torch.set_default_dtype(torch.float64)
    try:
        with _DrawsAt(draws) if draws != torch.float64 else contextlib.nullcontext():
            yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """torch's generators (the CPU's and CUDA's) seeded with `seed` for one call, their state restored after
    (None: left alone). A model called under it draws the same random values on every call: the kernel
    and the reference, each called under the same seed, draw the same initial states. Inside `rng_state`
    the seed is shifted by its `shift` (the determinism gate's calls at other generator states)."""
    if seed is None:
        yield
        return
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
        torch.manual_seed(seed + _SEED_SHIFT.get())
        watch = _SEEDED_DRAWS.get()
        gpu = torch.device("cuda", torch.cuda.current_device()) if cuda else None
        start = torch_generator_states(gpu) if watch is not None else None
        yield
        if watch is not None:
            end = torch_generator_states(gpu)
            watch.update(name for name, state in start.items() if not torch.equal(state, end[name]))


_SEED_SHIFT: contextvars.ContextVar[int] = contextvars.ContextVar("kgate_seed_shift", default=0)
# While set (`seeded_draws`): the torch generators a call under `seeded` drew from, which fork_rng hides after it
_SEEDED_DRAWS: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("kgate_seeded_draws", default=None)


CPU_GENERATOR = "torch's CPU generator"


def torch_generator_states(gpu: torch.device | None) -> dict[str, torch.Tensor]:
    """The states of torch's CPU generator and, with `gpu`, of that CUDA device's generator, by name."""
    states = {CPU_GENERATOR: torch.get_rng_state()}
    if gpu is not None:
        index = gpu.index if gpu.index is not None else torch.cuda.current_device()
        states[f"torch's generator of cuda:{index}"] = torch.cuda.get_rng_state(index)
    return states


@contextlib.contextmanager
def seeded_draws() -> Iterator[set[str]]:
    """The names of torch's generators that calls under `seeded` inside drew from (each such call seeds them and
    puts their state back after, so the draws do not show outside)."""
    found: set[str] = set()
    token = _SEEDED_DRAWS.set(found)
    try:
        yield found
    finally:
        _SEEDED_DRAWS.reset(token)


@contextlib.contextmanager
def rng_state(shift: int) -> Iterator[None]:
    """torch's generators at another state for what runs inside, restored after: seeded with `shift`, and
    every `seeded` call inside shifted by it. A computation whose result depends on the generators'
    state (a random completion order, stochastic rounding) gives another result here."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    token = _SEED_SHIFT.set(shift)
    try:
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
            torch.manual_seed(shift)
            yield
    finally:
        _SEED_SHIFT.reset(token)


def own_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of a module's first floating-point parameter or buffer (None: it holds none)."""
    first = _first_floating(module)
    return first.dtype if first is not None else None


def _first_floating(module: torch.nn.Module) -> torch.Tensor | None:
    """A module's first floating-point parameter, else its first floating-point buffer (None: neither), found
    without listing the rest (a DenseNet holds some 1,200 of them, and this is asked before every call)."""
    return next((t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point()), None)


# While set (`oracle_call`): the device of the float64 oracle's call in progress. A DtypeDispatch takes its
# dtype from its first floating-point argument; a call whose inputs are all integers (embedding indices, class
# labels) has none, and without this the oracle ran the float32 model: a "float64" oracle equal to the
# reference, whose own error then read 0 and left the bound at its floor.
_ORACLE_DEVICE: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("kgate_oracle_device",
                                                                                     default=None)



_WITH_GRADIENTS: contextvars.ContextVar[bool] = contextvars.ContextVar("kgate_reference_gradients", default=False)


@contextlib.contextmanager
def reference_gradients() -> Iterator[None]:
    """Inside, a DtypeDispatch call builds the autograd graph where grad mode is on (elsewhere it runs under
    no_grad): for a probe that reads the reference's gradient (special_values' lines it does not read)."""
    token = _WITH_GRADIENTS.set(True)
    try:
        yield
    finally:
        _WITH_GRADIENTS.reset(token)

# The oracle's calls on a GPU run with cuDNN disabled: torch's own convolutions (an im2col and a float64 GEMM on
# the tensor cores) in place of cuDNN's float64 kernels (implicit_convolve_dgemm, dgrad_engine), which took 2.1x
# the time summed over eight corpus problems on one H100, 3.4x in a DenseNet-201, 0.94x in one convolution with a
# BatchNorm (bench/oracle_cost.py, docs/records/2026-12-07-h100-f6a4638/). "1" keeps cuDNN.
ORACLE_CUDNN_ENV = "KGATE_ORACLE_CUDNN"


@contextlib.contextmanager
def oracle_call(device: torch.device) -> Iterator[None]:
    """Mark what runs inside as the float64 oracle's call on `device` (see DtypeDispatch); on a GPU, with
    cuDNN disabled inside (put back after) unless $KGATE_ORACLE_CUDNN=1."""
    token = _ORACLE_DEVICE.set(device)
    cudnn = torch.backends.cudnn.enabled
    plain = device.type == "cuda" and os.environ.get(ORACLE_CUDNN_ENV, "0") != "1"
    try:
        if plain:
            torch.backends.cudnn.enabled = False
        yield
    finally:
        if plain:
            torch.backends.cudnn.enabled = cudnn
        _ORACLE_DEVICE.reset(token)


class DtypeDispatch:
    """A module called with the dtype/device of its first floating-point tensor argument, or, where it has
    none (integer inputs only), float64 inside `oracle_call` and its own dtype elsewhere: the float64
    oracle gets a float64 deep copy of the reference model (made once per dtype and device), called with
    torch's default dtype float64 (`float64_defaults`). With `seed`, every call draws from torch's
    generators seeded with it (`seeded`)."""

    def __init__(self, model: Any, seed: int | None = None):
        self.model = model
        self.seed = seed
        self._copies: dict[tuple[str, str], Any] = {}
        # copies dropped since (`drop_copies`), refreshed in place when next asked for (`refreshed`), but those a
        # ModuleState keeps to give back (`pinned`: their values must stay those they were made with)
        self._stale: dict[tuple[str, str], Any] = {}
        self.pinned: set[int] = set()
        # called with the module about to run (the model or a copy) before each call: a subject's Lockstep
        self.prepare: Callable[[Any], None] | None = None

    @staticmethod
    def _target(args: tuple) -> tuple[torch.dtype, torch.device] | None:
        """The dtype and device this call runs the model at (None: the model as it is)."""
        first = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        if first is not None:
            return first.dtype, first.device
        device = _ORACLE_DEVICE.get()
        return (torch.float64, device) if device is not None else None

    def _for(self, target: tuple[torch.dtype, torch.device] | None) -> Any:
        first = _first_floating(self.model)
        if target is None or first is None:
            return self.model
        dtype, device = target
        if dtype == first.dtype and device == first.device:
            return self.model
        key = (str(dtype), str(device))
        if key not in self._copies:
            stale = self._stale.pop(key, None)
            if stale is not None and id(stale) not in self.pinned and refreshed(stale, self.model, dtype):
                self._copies[key] = stale
            else:
                del stale  # (not held while the new copy is made: a large model's copy is twice its weights)
                self._copies[key] = converted_copy(self.model, device=device, dtype=dtype)
        return self._copies[key]

    def drop_copies(self) -> None:
        """The model's parameters or buffers changed: each converted copy is brought up to them before its next
        call (refreshed in place, or made anew)."""
        self._stale.update(self._copies)
        self._copies.clear()

    def give_back(self, copies: dict[tuple[str, str], Any]) -> None:
        """Take `copies` (converted from the model's values now, kept by a ModuleState) as the current copies."""
        for key in copies:
            self._stale.pop(key, None)
        self._copies.update(copies)
        self.pinned.difference_update(id(m) for m in copies.values())

    def _own_dtype(self) -> torch.dtype | None:
        return own_dtype(self.model)

    def __call__(self, *args: Any) -> Any:
        target = self._target(args)
        oracle = target is not None and target[0] == torch.float64 and self._own_dtype() != torch.float64
        grad = contextlib.nullcontext() if _WITH_GRADIENTS.get() else torch.no_grad()
        with grad:
            # the copy and its buffers' state are made before the float64 defaults and the draws' mode: that
            # mode sees every torch call inside it (a deep copy of a DenseNet's 600 tensors, a state load
            # before each call), and neither draws nor makes a tensor of the default dtype
            module = self._for(target)
            if self.prepare is not None:
                self.prepare(module)
            with seeded(self.seed), float64_defaults(self._own_dtype()) if oracle else contextlib.nullcontext():
                return module(*args)
