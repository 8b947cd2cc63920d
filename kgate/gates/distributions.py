"""distributions: correct (within the oracle bound, finite where the oracle is) on value distributions
that random normal inputs never produce.

Each distribution in turn replaces every floating-point input at once: zeros; a constant;
all-negative values; huge magnitudes (peak min(1e6, max/16) of the dtype); tiny magnitudes (peak
sqrt of the smallest normal); subnormals (every magnitude below the smallest normal); heavy tails
(Cauchy, lognormal with sigma 2, clipped to the huge magnitude); all positive; a common offset of
`OFFSET` spreads above zero (where a one-pass variance cancels) and below it (rows that lie entirely far
below zero: a running maximum started at 0 underflows there); constant rows; mixed signs over 8
decades; near-overflow (a sixteenth of the dtype's largest value) and near-underflow (8 x its smallest
normal) magnitudes; signed zeros (half the values +0.0 or -0.0); rounding ties (half-integers, each row's first
value +-127: the int8 grid at scale 1, where rounding half to even and half away from zero differ; judged
without the input sensitivity below, as its values are exact). After them, a short seeded search over
affine transforms of the factory's inputs
(scale and offset, per argument and jointly: `kgate.search`), time-boxed (`SEARCH_SECONDS`, at most
`SEARCH_SHARE` of the gate's time limit, and the worker's search deadline). Before them, the factory's inputs at
fresh seeds that the manifest does not list (the factory's own inputs are judged first: a kernel that
fails there is not failing because of a distribution). Where the oracle and the reference both give NaN, the
kernel must not be finite (`kgate.shrink.nan_lost`, tolerance-free). Judged like the
oracle gate (bound calibrated from the reference's own error on the same inputs); a kernel that
raises where the reference accepts the inputs fails.

Between the distributions and the search, families of one argument at a time, the others as the factory
made them (the distributions leave integer and boolean inputs alone). They run on the kernel instance that
the factory's inputs ran on, at the same shapes: a value cached per shape on the first call (a mean's
divisor) meets values it does not fit.
- Integer inputs (`INTEGER_FAMILIES`): their own values drawn with replacement (repeated values: a scatter
  that stores where it must add), set to one value, and consecutive from their smallest, in order (a contiguous
  run of ids that a kernel serves as a slice, a view of its table: judged like any output, and an output that
  shares memory with the module's parameters or buffers where the reference's shares none fails on any probe,
  as in the contract gate); and values past their own range, each only where the
  argument's dtype holds them: x + 2049 (odd integers above 2048, which float16 rounds), x + 2^24 + 1 (above
  float32's exact integers), x + 2^31 + 1 (past int32: ids narrowed to int32 wrap), x + 2^53 + 1 (above
  float64's exact integers: int64 only), -x - 1 (negative ids: a floored remainder and a truncated fmod differ;
  an index that goes negative), and about a quarter of the values set to -1 or to -100 (padding ids;
  cross_entropy's ignore_index). A kernel that converts its ids or positions to a narrower type, or computes a
  bucket or a hash in floating point (float64 too), is exact on small ids only.
- Sorted integer inputs (non-decreasing along the last dimension, at least 3 elements there: offsets,
  cu_seqlens, segment boundaries; `SORTED_FAMILIES`), each row kept sorted with its first and last value (the
  segments cover the same data): repeated boundaries (about a quarter of the interior values, and a run of two
  consecutive ones, set equal to their predecessor: empty segments in the middle) and one long segment, last or
  first (the interior values packed against the first or the last value a step of 1 apart, 0 where the row's
  range is too short: every other segment as short as the values allow). A kernel that marks segment starts
  with a scatter that stores where it must add, or pads segments to a static multiple of the mean length, is
  right on evenly spread boundaries only.
- Boolean inputs (masks, `BOOLEAN_FAMILIES`): nothing selected (an empty selection's 0/0), everything
  selected, their own values drawn with replacement, and along the last dimension left padding (leading
  False), right padding (trailing False) and holes (False runs inside rows, the ends True): a kernel that
  infers the padding side from the mask (skips it where every row's last key is valid) is right on one.
- Floating-point inputs of at least 2 dimensions and 2 entries along the first (`FLOATING_FAMILIES`):
  permuted copies, every entry along dimension 0 entry 0 with its elements permuted (seeded, never the
  identity) along the next dimension of more than one element (RGB and BGR), on a grid of 1/16 so that
  their sums come out exactly equal in any order. They are equal under every
  permutation-invariant checksum (sum, sum of squares, a sorted hash): a cache that dedupes entries by one
  shares one entry's result among them.
- Floating-point inputs whose values are all 0 or 1, some of them 1 (a float mask, weights; `WEIGHT_FAMILIES`):
  fractional weights (uniform in (0, 1] where the factory had 1, its zeros kept) and uniform weights (uniform in
  [0, 1] throughout). A kernel that binarizes its weights (`.bool()`) is right on 0/1 values only. The drawn
  distributions catch it where the reference accepts weights outside [0, 1] (all-negative weights); where the
  reference declares that domain, those it accepts (tiny, subnormal) scale the 0/1 values alike, which a mean
  normalized by its weights does not see.
These are not shrunk: a failure names the family and the argument.

Every probe starts before the worker's search deadline (half the gate's time limit: `Subject.out_of_time`), in
the order above: the factory's inputs and fresh seeds, the drawn distributions, those from a module's buffers as
built, the per-argument families, the parameters' magnitudes, the affine search. A kernel slow enough to reach
the deadline first passes on the probes it had (the pass message names what was not judged) instead of ending
in a timeout that loses the verdict: a DenseNet-201 whose float64 oracle takes seconds a probe.

A history-dependent module (its forward writes its buffers) meets the drawn distributions once more from its
buffers as built (`_drawn_as_built`; `Subject.buffers_as_built`: in an audit, before the standard test's calls), where
those differ from the state the other probes start from: a first step's zero momentum.

An nn.Module kernel's parameters at other magnitudes (`parameter_scales`): each of the `PARAMETER_CLASSES` largest
classes of parameters kernel and reference hold equal, alone, multiplied in place by 1e-6, 1e-3, 0.1, 10,
1000 and 0 alike in both, the kernel judged on the first case's inputs against the oracle of the reference so changed,
and, where two or more floating-point inputs share a shape and dtype, on those inputs made equal too (`aligned`:
each a copy of the first of its shape: matching pairs, a query equal to its key), the values put back after each.
A module is built at one magnitude of its parameters and trained to others: a gate `1 - sigmoid(a)` for
`sigmoid(-a)` is exactly 0 once a learned decay passes 17, an epsilon added under a square root dominates the norm
of small weights, a learned temperature at CLIP's clamp of 100 overflows an unshifted `exp` only where a pair's
cosine passes 0.887 (aligned embeddings; drawn ones sit near 0).

A reference declares its domain by raising on inputs outside it. Where it rejects a distribution on
all inputs at once, the distribution is applied to one floating-point argument at a time (the others
keep the factory's values, `kgate.subject.within_domain`), and each such probe the reference accepts
is judged; the probes it rejects are skipped and listed in the pass message. Ordinary kernels pay
nothing for this: the all-at-once probe comes first. Off the CPU a reference does not raise on an index out
of range: a device-side assert loses the CUDA context. There an integer probe whose values leave the
argument's own range is given first to the float64 oracle on the host, and is skipped where that rejects it
or the host cannot hold it.

On the two degenerate distributions (zeros, a constant) the exact output is often exactly zero and the
reference exact by structure (Welford's mean of equal values), so the bound would be 0 and an ulp of
rounding in the kernel, amplified by a normalization's 1/sqrt(eps), a failure. There the bound's floor
(ulps x eps x magnitude) takes the larger of the output's magnitude here and at the factory's inputs
(`FLOOR_FROM_FACTORY`): an error below a few ulps of the output's usual size is not a finding; a
non-finite output, or a wrong one, still is. On the other distributions and the per-argument families the
same floor holds for an output whose oracle is 0 throughout on the probe (`AtZero`: a gradient every underflowed decay makes exactly 0,
which a kernel may form by an identity whose terms are not 0).

On the drawn distributions, the per-argument families and the search's transforms the bound takes the
input sensitivity
(`input_sensitivity`: how far the oracle moves when every input moves by an ulp of its dtype) as the
least reference error: a reference that computes wider inside (torch's CPU reductions) stays nearly exact
on values that share a large offset, where any computation in the kernel's dtype rounds at the offset's
magnitude; so the bound scales with the transform as the problem's conditioning does. Outputs the
reference itself gives as NaN/Inf where the oracle is finite (it overflows in its dtype) are not judged
on these probes (`where_reference_finite`).

A failure is shrunk to the fewest values drawn from the failing distribution (the others keep the
factory's values; within the one argument, for a per-argument probe) that still fail, and reported
with their positions and, for a per-argument probe, the argument; a smaller set counts only while it
misses the bound by at least half as much (up to `BROKEN_FACTOR`), so that the shrink does not drift to a
marginal miss of its own. A failure names the family or the transform.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten, index_of
from kgate.gates.base import Gate, GateResult
from kgate.gates.isolation import parameter_classes
from kgate.inputs import Case
from kgate.oracle import BROKEN_FACTOR
from kgate.search import Searched, search, spread
from kgate.shrink import SHRINK_SECONDS, Finding, judge_probe, shrink_subset
from kgate.subject import ModuleState, Subject, outputs_on, rejected_note, unless_rejected, within_domain

FRESH_SEEDS = (104729, 1299709)
FLOOR_FROM_FACTORY = ("zeros", "constant", "constant rows")
# distributions whose values are exact by construction: judged without the input sensitivity (on ties a move of
# an ulp moves a rounding by a whole step, which would excuse any tie rule)
EXACT_INPUTS = ("rounding ties",)
OFFSET = 1000.0  # a common offset this many spreads from zero is large against the spread
SHRINK_MAX_ELEMENTS = 1 << 18
SEARCH_SECONDS = 10.0  # the affine search's time box per case (at most SEARCH_SHARE of the gate's time limit)
SEARCH_SHARE = 0.1
# The magnitudes a module's parameters are judged at besides their own (each class of equal parameters alone, as
# `Distributions.parameter_scales` says), and how many classes, the largest first.
PARAMETER_SCALES = (1e-6, 1e-3, 0.1, 10.0, 1e3, 0.0)  # 0: a zero-initialised gate or scale, beta = 0
PARAMETER_CLASSES = 4


def huge(dtype: torch.dtype) -> float:
    return min(1e6, torch.finfo(dtype).max / 16)


def tiny(dtype: torch.dtype) -> float:
    return math.sqrt(torch.finfo(dtype).tiny)


def _peak(t: torch.Tensor, to: float) -> torch.Tensor:
    peak = t.abs().max()
    return t / peak * to if peak > 0 else torch.full_like(t, to)


def _uniform(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(t.shape, generator=gen, dtype=torch.float64, device=t.device)


def _normal(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=gen, dtype=torch.float64, device=t.device)


def _clip(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return values.clamp(-huge(dtype), huge(dtype))


def _offset(t: torch.Tensor, sign: float, dtype: torch.dtype) -> torch.Tensor:
    """`t` shifted by OFFSET spreads (its standard deviation; 1 where it has none), within the dtype."""
    shift = min(OFFSET * spread(t), torch.finfo(dtype).max / 16)
    return t + sign * shift


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Every row (along the last dimension) constant, equal to its first element."""
    return t[..., :1].expand(t.shape).clone() if t.dim() else t.clone()


def _decades(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Mixed signs and magnitudes spread over 8 decades in one tensor."""
    sign = torch.where(_uniform(t, g) < 0.5, -1.0, 1.0)
    return sign * 10.0 ** (8 * _uniform(t, g) - 4)


# name -> (description, values in float64 from the original tensor (float64) and a generator)
DISTRIBUTIONS: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator, torch.dtype], torch.Tensor]]] = {
    "zeros": ("all zeros", lambda t, g, d: torch.zeros_like(t)),
    "constant": ("every value 1.5", lambda t, g, d: torch.full_like(t, 1.5)),
    "all-negative": ("-(|x| + 0.5)", lambda t, g, d: -(t.abs() + 0.5)),
    "huge": ("magnitudes up to min(1e6, max/16)", lambda t, g, d: _peak(t, huge(d))),
    "tiny": ("magnitudes up to sqrt(smallest normal)", lambda t, g, d: _peak(t, tiny(d))),
    "subnormal": ("every magnitude below the smallest normal",
                  lambda t, g, d: _peak(t, torch.finfo(d).tiny / 2)),
    "cauchy": ("Cauchy (heavy tails), clipped to the huge magnitude",
               lambda t, g, d: _clip(torch.tan(math.pi * (_uniform(t, g) - 0.5)), d)),
    "lognormal": ("lognormal, sigma 2 (heavy right tail)",
                  lambda t, g, d: _clip(torch.exp(2 * _normal(t, g)), d)),
    "all-positive": ("|x| + 0.5", lambda t, g, d: t.abs() + 0.5),
    "offset above zero": (f"x + {OFFSET:g} x its spread (a common offset large against the spread)",
                          lambda t, g, d: _offset(t, 1.0, d)),
    "offset below zero": (f"x - {OFFSET:g} x its spread (rows that lie entirely far below zero)",
                          lambda t, g, d: _offset(t, -1.0, d)),
    "constant rows": ("every row (last dimension) equal to its first value", lambda t, g, d: _rows(t)),
    "decades": ("mixed signs, magnitudes spread over 8 decades", lambda t, g, d: _clip(_decades(t, g), d)),
    "near-overflow": ("magnitudes up to a sixteenth of the dtype's largest value",
                      lambda t, g, d: _peak(t, torch.finfo(d).max / 16)),
    "near-underflow": ("magnitudes up to 8 x the smallest normal", lambda t, g, d: _peak(t, 8 * torch.finfo(d).tiny)),
    "signed zeros": ("half the values +0.0 or -0.0, the sign drawn (atan2, copysign, 1/x and sorts tell them "
                     "apart)", lambda t, g, d: _signed_zeros(t, g)),
    "rounding ties": ("half-integers in [-127.5, 126.5] with every row's first value +-127 (an int8 grid whose "
                      "absmax scale is 1: round-half-to-even and round-half-away-from-zero differ on every value)",
                      lambda t, g, d: _ties(t, g)),
}


def _ties(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Values k + 0.5 (k uniform in [-128, 126]), the first of every row (last dimension) +-127: exact in every
    floating dtype, and exactly halfway between two integers wherever a kernel rounds them at scale 1 (a row's
    absmax over 127, the int8 quantization grid, is 1 here)."""
    values = torch.floor(_uniform(t, g) * 255) - 128 + 0.5
    if t.dim():
        sign = torch.where(_uniform(t[..., :1], g) < 0.5, -1.0, 1.0)
        values[..., :1] = 127 * sign
    return values


def _signed_zeros(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """`t` with about half its values replaced by zeros, each +0.0 or -0.0 at random."""
    keep = _uniform(t, g) < 0.5
    zero = torch.where(_uniform(t, g) < 0.5, torch.full_like(t, -0.0), torch.zeros_like(t))
    return torch.where(keep, t, zero)


def _resampled(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """`t`'s own values drawn with replacement: the same value set, values repeated."""
    flat = t.reshape(-1)
    picks = torch.randint(flat.numel(), (flat.numel(),), generator=g, device=g.device)
    return flat[picks.to(flat.device)].reshape(t.shape)


def _consecutive(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    """Consecutive values in order from `t`'s smallest, wrapping past its largest (a contiguous run of ids,
    positions or rows: a gather that a kernel may serve as a slice); None for fewer than 2 values or one value."""
    if t.numel() < 2 or t.dtype == torch.bool:
        return None
    lo, hi = int(t.min()), int(t.max())
    if hi <= lo:
        return None
    run = torch.arange(t.numel(), device=t.device, dtype=torch.int64) % (hi - lo + 1) + lo
    return run.to(t.dtype).reshape(t.shape)


def _fits(dtype: torch.dtype, *values: int) -> bool:
    info = torch.iinfo(dtype)
    return all(info.min <= v <= info.max for v in values)


def _shifted(by: int) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]:
    """x + by, where every value fits the argument's dtype."""
    return lambda t, g: t + by if _fits(t.dtype, int(t.min()) + by, int(t.max()) + by) else None


def _negated(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    return -t - 1 if _fits(t.dtype, -int(t.max()) - 1, -int(t.min()) - 1) else None


def _sentinel(value: int) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]:
    """About a quarter of the values (seeded) set to `value`, where the dtype holds it."""
    def make(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
        if not _fits(t.dtype, value):
            return None
        return t.masked_fill((torch.rand(t.shape, generator=g, device=g.device) < 0.25).to(t.device), value)
    return make


# Integer inputs (indices, labels, positions, ids), one argument at a time: from its own value set (repeated
# values, one value), in patterns random draws rarely make; and past it, each only where the dtype holds the
# values: magnitudes past the integers that float16 (2048), float32 (2^24) and float64 (2^53) hold exactly and
# past int32 (a kernel that converts them, or narrows them, rounds or wraps there), their negations (floored
# and truncated remainders differ there), and the sentinels -1 and -100 (padding, cross_entropy's
# ignore_index). A family that makes None is not applied.
INTEGER_FAMILIES: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]]] = {
    "integer repeats": ("its own values drawn with replacement (repeated values: duplicate indices)", _resampled),
    "integer one value": ("every value equal to its first", lambda t, g: t.reshape(-1)[:1].expand(t.shape).clone()),
    "integer consecutive": ("consecutive values in order from its smallest (a contiguous run: a gather served as a "
                            "slice)", _consecutive),
    "past float16's integers": ("x + 2049 (odd integers above 2048, which float16 rounds)", _shifted(2049)),
    "past float32's integers": ("x + 2^24 + 1 (odd integers above 2^24, which float32 rounds)", _shifted(2**24 + 1)),
    "past int32": ("x + 2^31 + 1 (past int32's largest value)", _shifted(2**31 + 1)),
    "past float64's integers": ("x + 2^53 + 1 (odd integers above 2^53, which float64 rounds)", _shifted(2**53 + 1)),
    "negated": ("-x - 1 (negative values: floored and truncated remainders differ)", _negated),
    "sentinel -1": ("about a quarter of the values set to -1 (padding)", _sentinel(-1)),
    "sentinel -100": ("about a quarter of the values set to -100 (cross_entropy's ignore_index)", _sentinel(-100)),
}


def _sorted(t: torch.Tensor) -> bool:
    """Whether `t` is non-decreasing along its last dimension, of at least 3 elements there (offsets, cu_seqlens,
    segment boundaries: a first and a last value with at least one boundary between them)."""
    return t.dim() > 0 and t.shape[-1] >= 3 and bool((t[..., 1:] >= t[..., :-1]).all())


def repeated_boundaries(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    """Every row (last dimension) with about a quarter of its interior values, and a seeded run of two consecutive
    ones (one where the row has a single interior value), set equal to their predecessor: empty segments in the
    middle, two of them in a row. Sorted still, its first and last value kept."""
    if not _sorted(t):
        return None
    n = t.shape[-1]
    rows = t.reshape(-1, n)
    run = min(2, n - 2)
    position = torch.arange(n, device=g.device)
    start = torch.randint(1, n - run, (rows.shape[0], 1), generator=g, device=g.device)
    chosen = (torch.rand(rows.shape, generator=g, device=g.device) < 0.25) | ((position >= start)
                                                                            & (position < start + run))
    chosen[:, 0] = chosen[:, -1] = False
    source = torch.where(chosen, 0, position).cummax(-1).values  # the last position not chosen, at or before
    return rows.gather(-1, source.to(t.device)).reshape(t.shape)


def _one_long_segment(long_last: bool) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]:
    """Every row (last dimension) with its interior values packed against its first value (`long_last`) or its
    last one, a step of 1 apart (0 where the row's range is shorter than its segments): every segment but the
    last (or the first) as short as the values allow, that one holding nearly all the range. Sorted still, its
    first and last value kept."""
    def make(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
        if not _sorted(t):
            return None
        n = t.shape[-1]
        first, last = t[..., :1].long(), t[..., -1:].long()
        step = (last - first >= n - 1).long()
        k = torch.arange(n, device=t.device)
        values = first + k * step if long_last else last - (n - 1 - k) * step
        values[..., :1], values[..., -1:] = first, last
        return values.to(t.dtype)
    return make


# Sorted integer inputs (non-decreasing along the last dimension, at least 3 elements there: offsets, cu_seqlens,
# segment boundaries), one argument at a time: boundaries that random cuts rarely make, each sorted still with
# the first and last value kept (the segments cover the same data): repeated boundaries (empty segments in the
# middle, consecutive ones too: a scatter that marks segment starts by a store counts a repeated boundary once)
# and one long segment, last or first (every other as short as the values allow: a kernel that pads segments to a
# static multiple of the mean length drops the long one's tail). A family that makes None is not applied.
SORTED_FAMILIES: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]]] = {
    "repeated boundaries": ("about a quarter of every row's interior values, two consecutive ones among them, set "
                            "equal to their predecessor (empty segments in the middle)", repeated_boundaries),
    "one long segment last": ("every row's interior values packed against its first value, a step of 1 apart (0 "
                              "where the range is too short): the last segment holds nearly all the range",
                              _one_long_segment(True)),
    "one long segment first": ("every row's interior values packed against its last value, a step of 1 apart (0 "
                               "where the range is too short): the first segment holds nearly all the range",
                               _one_long_segment(False)),
}


def _padded(left: bool) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor]:
    """Every row (last dimension) a seeded number (at least 1) of True, after the False (`left`) or before."""
    def make(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        n = t.shape[-1]
        valid = torch.randint(1, n + 1, (t.numel() // n, 1), generator=g, device=g.device)
        position = torch.arange(n, device=g.device)
        return (position >= n - valid if left else position < valid).reshape(t.shape).to(t.device)
    return make


def _holes(t: torch.Tensor, g: torch.Generator, runs: int = 2) -> torch.Tensor | None:
    """Every row (last dimension) True but for `runs` seeded runs of False inside it (its ends stay True)."""
    n = t.shape[-1]
    if n < 3:
        return None
    start = torch.randint(1, n - 1, (t.numel() // n, runs, 1), generator=g, device=g.device)
    stop = (start + torch.randint(1, n // 4 + 2, start.shape, generator=g, device=g.device)).clamp(max=n - 1)
    position = torch.arange(n, device=g.device)
    return ~((position >= start) & (position < stop)).any(1).reshape(t.shape).to(t.device)


# Boolean inputs (masks), one argument at a time: nothing selected, everything selected, its own values drawn
# with replacement, and the structures of real masks along the last dimension: left padding (leading False),
# right padding (trailing False), holes (False runs inside rows). A mask that selects nothing makes an empty
# selection's 0/0, which random masks rarely do; a kernel that infers the padding side (skips the mask where
# every row's last key is valid) is right on one structure only.
BOOLEAN_FAMILIES: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]]] = {
    "mask all false": ("every value False", lambda t, g: torch.zeros_like(t)),
    "mask all true": ("every value True", lambda t, g: torch.ones_like(t)),
    "mask repeats": ("its own values drawn with replacement", _resampled),
    "left padding": ("every row (last dimension) a seeded number of False, then True (at least one)", _padded(True)),
    "right padding": ("every row (last dimension) True (at least one), then a seeded number of False",
                      _padded(False)),
    "holes": ("every row (last dimension) True but for two seeded runs of False inside it", _holes),
}


def _permuted_copies(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    """Entry 0 along dimension 0, then every other entry as entry 0 with its elements permuted along the first
    other dimension of more than one element (a seeded permutation each, never the identity). The values are
    rounded to multiples of 1/16 first, so that the entries' sums and sums of squares come out exactly equal in
    any order of summation, as a checksum a dedupe compares."""
    dims = [d for d in range(1, t.dim()) if t.shape[d] > 1]
    if t.dim() < 2 or t.shape[0] < 2 or not dims:
        return None
    d, n, copies = dims[0], t.shape[dims[0]], t.shape[0] - 1
    if t.is_floating_point():  # on a grid of 1/16: sums and sums of squares exact in any order, so equal
        t = torch.round(t * 16) / 16
    perms = torch.rand((copies, n), generator=g, device=g.device).argsort(-1)
    identity = (perms == torch.arange(n, device=perms.device)).all(-1)
    perms[identity] = perms[identity].roll(1, -1)
    picked = t[:1].index_select(d, perms.reshape(-1).to(t.device))  # (1, ..., copies x n at d, ...)
    return torch.cat([t[:1], picked.unflatten(d, (copies, n)).movedim(d, 0).squeeze(1)])


# Floating-point inputs of at least 2 dimensions and 2 entries along the first, one argument at a time: entries
# that are permuted copies of one another (a channel-permuted image: RGB and BGR). They are equal under every
# permutation-invariant checksum (sum, sum of squares, a sorted hash), and their results differ wherever the
# computation reads the order: a cache that dedupes entries by such a checksum shares one entry's result.
FLOATING_FAMILIES: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]]] = {
    "permuted copies": ("every entry along dimension 0 is entry 0 with its elements permuted (seeded) along the "
                        "next dimension of more than one element", _permuted_copies),
}


def _weights(keep_zeros: bool) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]:
    """Where every value is 0 or 1 (some of them 1): values uniform in (0, 1] where it is 1 and its zeros kept
    (`keep_zeros`), or uniform in [0, 1] throughout."""
    def make(t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
        if not (((t == 0) | (t == 1)).all() and (t == 1).any()):
            return None
        drawn = torch.rand(t.shape, generator=g, device=g.device).to(t.device)
        return (torch.where(t == 0, t.float(), 1 - drawn) if keep_zeros else drawn).to(t.dtype)
    return make


# Floating-point inputs whose values are all 0 or 1 (a float mask, weights), one argument at a time: fractional
# weights, where the factory had 1 (its zeros kept) and throughout. A kernel that binarizes its weights (`.bool()`,
# `!= 0`: a select for a multiply, a count of the kept positions for their sum) is right on 0/1 values only.
WEIGHT_FAMILIES: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor | None]]] = {
    "fractional weights": ("every 1 replaced by a value uniform in (0, 1], the zeros kept", _weights(True)),
    "uniform weights": ("every value uniform in [0, 1]", _weights(False)),
}


ARGUMENT_FAMILIES = {**INTEGER_FAMILIES, **SORTED_FAMILIES, **BOOLEAN_FAMILIES, **FLOATING_FAMILIES,
                     **WEIGHT_FAMILIES}


def argument_probes(args: tuple, seed: int) -> Iterator[tuple[str, int, tuple]]:
    """(family, argument, inputs) for each tensor argument of more than one element and each family of
    INTEGER_FAMILIES and SORTED_FAMILIES, BOOLEAN_FAMILIES, or FLOATING_FAMILIES and WEIGHT_FAMILIES (by its
    dtype; complex ones have none) that applies to it and whose values differ from the argument's own; the other
    arguments unchanged. One at a time: each holds a copy of every input."""
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or a.is_complex() or a.numel() < 2:
            continue
        families = ({**FLOATING_FAMILIES, **WEIGHT_FAMILIES} if a.is_floating_point() else BOOLEAN_FAMILIES
                    if a.dtype == torch.bool else {**INTEGER_FAMILIES, **SORTED_FAMILIES})
        for name, (_, make) in families.items():
            values = make(a.detach(), torch.Generator(device=a.device).manual_seed(seed))
            if values is None or torch.equal(values, a):
                continue
            probe = list(clone_tree(args))
            probe[i] = values
            yield name, i, tuple(probe)


def _leaves_range(original: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether integer `values` reach outside the range of the argument's own values."""
    if original.is_floating_point() or original.dtype == torch.bool:
        return False
    return int(values.min()) < int(original.min()) or int(values.max()) > int(original.max())


def _asserts_on_device(subject: Subject) -> bool:
    """Whether the reference runs where an index out of range is a device-side assert, which loses the context
    (every device but the CPU), rather than an exception."""
    return subject.device.type != "cpu"


def _host_rejects(subject: Subject, probe: tuple) -> bool:
    """Whether the float64 oracle on the CPU rejects `probe`, or the host cannot hold it."""
    if subject.oracle_device.type == "cpu":
        return unless_rejected(lambda: subject.oracle(probe)) is None
    return subject.oracle_on_cpu(probe) is None


def transform(args: tuple, name: str, seed: int) -> tuple:
    """Copies of `args` with every non-empty floating-point tensor drawn from distribution `name`.

    Drawn on each tensor's own device with a generator of that device seeded with `seed`: the same
    values for the same seed on the same kind of device (a reproducer names the device), and no
    host-side float64 copies of inputs that can hold 10^9 elements."""
    generators: dict[torch.device, torch.Generator] = {}
    make = DISTRIBUTIONS[name][1]
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 0:
            if a.device not in generators:
                generators[a.device] = torch.Generator(device=a.device).manual_seed(seed)
            values = make(a.detach().double(), generators[a.device], a.dtype)
            a = values.to(dtype=a.dtype)
        elif isinstance(a, torch.Tensor):
            a = a.clone()
        out.append(a)
    return tuple(out)


class AtZero(dict):
    """Output magnitudes at the factory's inputs, by leaf, that a probe's floor is taken of only for the leaves
    whose oracle is 0 throughout on that probe (`Distributions._judge`): a gradient that a drawn distribution
    makes exactly 0 (every decay exp(g) underflowed) has a bound of 0 otherwise, and a kernel that forms it by
    an identity of exact arithmetic (fla's decay gradient as a running sum of q*dq - k*dk) leaves a rounding
    residue of its terms; below a few ulps of the output's usual size that is not a finding, as on the
    degenerate distributions (FLOOR_FROM_FACTORY)."""


def aligned(args: tuple) -> tuple | None:
    """`args` with every floating-point tensor that has the shape and dtype of an earlier one replaced by a copy of
    that earlier one (an image embedding equal to its text embedding, a query equal to its key); None where no two
    share a shape and dtype."""
    out, first = list(args), {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel():
            key = (tuple(a.shape), a.dtype, a.device)
            if key in first:
                out[i] = args[first[key]].clone()
            else:
                first[key] = i
    return tuple(out) if len(first) < sum(1 for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()
                                         and a.numel()) else None


def _magnitudes(oracle) -> dict[str, float]:
    """Per floating output leaf, the largest finite magnitude of the float64 oracle."""
    out = {}
    for path, t in flatten(oracle):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            out[path] = float(t.abs().nan_to_num_(nan=0.0, posinf=0.0).max())
    return out


class Distributions(Gate):
    name = "distributions"
    summary = ("oracle bound holds on zeros, constants, offsets, huge/tiny/subnormal values, heavy tails, fresh seeds, "
               "integers past narrower types, sentinels, sorted boundaries, mask structures, permuted copies, fractional "
               "weights and a seeded affine search")
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        evidence: list[dict] = []
        probes, rejected = 0, []
        self._cut: list[str] = []  # what the search deadline left unjudged (a slow kernel: said, not a timeout)
        cases = subject.first_seed_cases()
        declared = {c.seed for c in subject.cases}
        for case in cases:
            # The factory's own inputs first: a kernel that fails there fails whatever the distribution
            # (and a reproducer run with a fresh seed finds it); then the distributions and fresh seeds.
            for seed in (case.seed,) + tuple(s for s in FRESH_SEEDS if s not in declared):
                fresh = Case(case.shape, case.dtype, seed)
                base = subject.baseline(fresh)
                finding, leaves = judge_probe(subject, base.args, base.reference, base.oracle)
                evidence.extend({"case": fresh.to_json(), **leaf.to_json()} for leaf in leaves)
                probes += 1
                if finding is not None:
                    label = "the factory's inputs" if seed == case.seed else "fresh seed"
                    return self._report(subject, fresh, f"{label} (seed {seed})", finding, evidence, "")
        per_argument: set[str] = set()
        for case in cases:
            failed, judged = self._drawn(subject, case, evidence, rejected, per_argument)
            probes += judged
            if failed is not None:
                return failed
        failed, as_built = self._drawn_as_built(subject, cases, evidence, rejected, per_argument)
        probes += as_built
        if failed is not None:
            return failed
        counts = {"integer": 0, "boolean": 0, "floating": 0}
        for case in cases:
            base = subject.baseline(case)
            at_zero = AtZero(_magnitudes(base.oracle))
            for name, argument, probe in argument_probes(base.args, case.seed):
                if self._past_deadline(subject, f"the per-argument families from {name!r} ({case.label()})"):
                    break
                probe = subject.conform(base.args, probe)
                outside = _leaves_range(base.args[argument], probe[argument]) and _asserts_on_device(subject) \
                    and _host_rejects(subject, probe)
                outcome = None if outside else self._judge(subject, probe, case, evidence, at_zero)
                if outcome is None:
                    rejected.append(f"{name} on argument {argument} ({case.label()})")
                    continue
                kind = _kind(name)
                probes += 1
                counts[kind] += 1
                if outcome is not False:
                    return self._report(subject, case, f"{kind} argument {argument} as {name!r} "
                                        f"({ARGUMENT_FAMILIES[name][0]})", outcome, evidence, "", argument)
        failed, scaled = self.parameter_scales(subject, cases, evidence, rejected)
        if failed is not None:
            return failed
        searched: list[Searched] = []
        for case in cases:
            base = subject.baseline(case)
            floats = [i for i, a in enumerate(base.args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                      and a.numel() > 0]
            if not floats or self._past_deadline(subject, f"the affine search ({case.label()})"):
                continue
            at_zero = AtZero(_magnitudes(base.oracle))

            def objective(inputs: tuple, case: Case = case,
                          at_zero: AtZero = at_zero) -> tuple[float, Finding | bool, bool] | None:
                ratios: list[float] = []
                outcome = self._judge(subject, inputs, case, evidence, at_zero, ratios=ratios)
                if outcome is None:
                    return None
                return ratios[-1], outcome, outcome is not False

            found = search(base.args, floats, case.seed, objective, out_of_time=subject.out_of_time,
                           seconds=min(SEARCH_SECONDS, subject.entry.limits.timeout * SEARCH_SHARE),
                           conform=subject.conform)
            searched.append(found)
            probes += found.judged
            if found.failure is not None:
                affine, inputs, finding = found.failure
                label = (f"search: {affine.describe()} (the seeded affine search's try {found.tries}"
                         f"{', the others as the factory made them' if len(affine.parts) < len(floats) else ''})")
                return self._fail(subject, case, label, base.args, inputs, finding, evidence, affine.argument,
                                  at_zero)
        if probes == 0:
            return self.skipped("no floating-point inputs to draw from other distributions, and no cases")
        message = f"oracle bound held on {probes} probe(s): {len(DISTRIBUTIONS)} distributions and " \
                  f"{len(FRESH_SEEDS)} fresh seeds x {len(cases)} case(s)"
        if searched:
            worst = max(searched, key=lambda f: f.worst_value)
            rejected_tries = sum(f.tries - f.judged for f in searched)
            message += (f"; affine search: {sum(f.tries for f in searched)} transform(s)"
                        f"{f' ({rejected_tries} outside the reference domain)' if rejected_tries else ''}"
                        f"{'' if all(f.complete for f in searched) else ' (time box spent in some case)'}")
            if worst.worst is not None:
                message += f", the worst {worst.worst_value:.2g} x bound ({worst.worst.describe()})"
        if counts["integer"] or counts["boolean"]:
            message += f"; {counts['integer'] + counts['boolean']} integer- or boolean-input probe(s)"
        if counts["floating"]:
            message += f"; {counts['floating']} floating-input probe(s)"
        if scaled:
            message += f"; {scaled} probe(s) of the module's parameters scaled"
        if per_argument:
            message += (f"; one argument at a time where the reference rejects all at once: "
                        f"{', '.join(n for n in DISTRIBUTIONS if n in per_argument)}")
        if self._cut:
            message += (f"; stopped at the search deadline (half the gate's time limit): not judged from "
                        f"{'; '.join(self._cut[:4])}{f' and {len(self._cut) - 4} more' if len(self._cut) > 4 else ''}")
        return self.passed(message + rejected_note(rejected), evidence=evidence, details={"cut": self._cut})

    def _past_deadline(self, subject: Subject, what: str) -> bool:
        """Whether the worker's search deadline (`Subject.deadline`) has passed; if so `what` (the probes about
        to start) is noted as not judged. A kernel slow enough to spend it gets fewer probes, said in the pass
        message, instead of a timeout that loses the verdict (the probes judged so far passed)."""
        if not subject.out_of_time():
            return False
        self._cut.append(what)
        return True

    def _drawn(self, subject: Subject, case: Case, evidence: list, rejected: list[str], per_argument: set[str],
               setting: str = "") -> tuple[GateResult | None, int]:
        """The drawn distributions (`DISTRIBUTIONS`) on `case`'s floating-point inputs, all at once, else one
        argument at a time where the reference rejects them (`within_domain`). Returns (a failure or None, the
        probes judged); `setting` is said in the failure's label."""
        base = subject.baseline(case)
        floats = [i for i, a in enumerate(base.args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                  and a.numel() > 0]
        if not floats:
            return None, 0
        usual = _magnitudes(base.oracle)
        probes = 0
        for name in DISTRIBUTIONS:
            if self._past_deadline(subject, f"the drawn distributions from {name!r}{setting} ({case.label()})"):
                break
            scales = usual if name in FLOOR_FROM_FACTORY else AtZero(usual)

            def judge(probe: tuple, argument: int | None, scales: dict[str, float] | None = scales,
                      name: str = name) -> Finding | bool | None:
                return self._judge(subject, probe, case, evidence, scales, exact=name in EXACT_INPUTS)

            probe = transform(base.args, name, case.seed)
            for argument, inputs, outcome in within_domain(base.args, probe, floats, judge, subject.conform):
                label = name if argument is None else f"{name} on argument {argument}"
                if argument is not None:
                    per_argument.add(name)
                if outcome is None:
                    rejected.append(f"{label}{setting} ({case.label()})")
                    continue
                probes += 1
                if outcome is not False:
                    return self._fail(subject, case, _family(name, argument) + setting, base.args, inputs, outcome,
                                      evidence, argument, scales), probes
        return None, probes

    def _drawn_as_built(self, subject: Subject, cases: list[Case], evidence: list, rejected: list[str],
                        per_argument: set[str]) -> tuple[GateResult | None, int]:
        """A history-dependent module (`Lockstep.stateful`: its forward writes its buffers) judged on the drawn
        distributions again from its buffers as built (a first training step: momentum 0, no statistics yet),
        where those differ from the state the other probes start from; the state put back after. Zero gradients
        on a zero momentum make a Lion step's sign(0) = 0, which copysign(1, c) turns into a step of lr."""
        modules, lock = subject.modules(), subject.lockstep
        if modules is None or lock is None or not lock.stateful or not cases or \
                self._past_deadline(subject, "the drawn distributions from the module's buffers as built"):
            return None, 0
        state = ModuleState(subject, modules)
        try:
            before = {n: t.clone() for n, t in lock.state.items()}
            subject.initial_buffers()
            subject.changed_state()
            if all(n in lock.state and bitwise_mismatch(lock.state[n], t) is None for n, t in before.items()):
                return None, 0  # as built is the state the probes already started from
            return self._drawn(subject, cases[0], evidence, rejected, per_argument,
                               ", from the module's buffers as built")
        finally:
            state.close()

    def parameter_scales(self, subject: Subject, cases: list[Case], evidence: list,
                         rejected: list[str]) -> tuple[GateResult | None, int]:
        """An nn.Module kernel's parameters at other magnitudes: each of the `PARAMETER_CLASSES` largest classes
        of parameters that kernel and reference hold equal (`isolation.parameter_classes`), alone, multiplied by
        each of `PARAMETER_SCALES` in place, alike in both, and the kernel judged on the first case's inputs
        against the oracle of the reference so changed; the values put back after each (`ModuleState`). A
        learned decay past where `1 - sigmoid(a)` is 0, a weight small enough that an epsilon added under a
        square root dominates its norm, a temperature that overflows an exponent the reference shifts first:
        a module is built at one magnitude of its parameters and trained to others. Returns (a failure or None,
        how many probes were judged); probes the reference rejects go to `rejected`."""
        modules = subject.modules()
        if modules is None or not cases:
            return None, 0
        try:
            classes = [c for c in parameter_classes(*modules) if c.kind == "parameter"][:PARAMETER_CLASSES]
        except Exception:  # noqa: BLE001 - a module's own state_dict hooks may raise
            return None, 0
        if not classes:
            return None, 0
        case = cases[0]
        base = subject.baseline(case)
        at_zero = AtZero(_magnitudes(base.oracle))
        inputs = [("on the case's inputs", base.args)]
        equal = aligned(base.args)
        if equal is not None:
            inputs.append(("on the case's inputs with those of one shape made equal", subject.conform(base.args, equal)))
        state = ModuleState(subject, modules)
        judged = 0
        try:
            before = [t.detach().clone() for _, t in outputs_on(subject.run_kernel(clone_tree(base.args)))]
            for c in classes:
                for factor in PARAMETER_SCALES:
                    if self._past_deadline(subject, f"the module's parameters at other magnitudes from "
                                           f"{c.names()} x {factor:g}"):
                        return None, judged
                    with torch.no_grad():
                        for t in c.tensors():
                            t.mul_(factor)
                    subject.changed_state()
                    outcomes = []
                    try:
                        now = [t.detach() for _, t in outputs_on(subject.run_kernel(clone_tree(base.args)))]
                        # its previous output again, bitwise: a copy of the parameters it does not refresh (the
                        # isolation gate's finding, not a magnitude's)
                        stale = len(now) == len(before) and all(
                            a.shape == b.shape and bitwise_mismatch(a, b) is None for a, b in zip(now, before))
                        for label, args in [] if stale else inputs:
                            outcomes.append((label, self._judge(subject, args, case, evidence, at_zero)))
                            if outcomes[-1][1] not in (None, False):
                                break
                    finally:
                        state.restore()
                    what = f"{c.names()} multiplied by {factor:g}, alike in kernel and reference"
                    if stale:
                        break  # (the other magnitudes would be as stale)
                    for label, outcome in outcomes:
                        if outcome is None:
                            rejected.append(f"parameters: {what}, {label} ({case.label()})")
                            continue
                        judged += 1
                        if outcome is not False:
                            return self._report(subject, case, f"the module's parameters at another magnitude: "
                                                f"{what}, {label}", outcome, evidence, ""), judged
        finally:
            state.close()
        return None, judged

    @staticmethod
    def _judge(subject: Subject, probe: tuple, case: Case, evidence: list | None,
               scales: dict[str, float] | None = None, ratios: list[float] | None = None, *,
               exact: bool = False) -> Finding | bool | None:
        """A Finding if the kernel fails on `probe`, False if it passes, None if the reference rejects it
        (`scales`: the output magnitudes each leaf's floor is at least taken of; `ratios` gets the worst
        error / bound; `exact`: the probe's values are exact by construction, so the input sensitivity is not
        taken as the least reference error: the inputs carry no rounding of their own). Outputs the reference itself gives as NaN/Inf where the oracle is finite (it
        overflows in its dtype on these values) are not judged: such inputs say nothing about a kernel."""
        outputs = unless_rejected(lambda: (subject.run_reference(clone_tree(probe)), subject.oracle(probe)))
        if outputs is None:
            return None
        reference, oracle = outputs
        if isinstance(scales, AtZero):
            now = _magnitudes(oracle)
            scales = {path: m for path, m in scales.items() if now.get(path) == 0.0}
        # (the input sensitivity costs an oracle call: asked only where a leaf needs it, except by the search, whose
        # objective is the ratio to the bound with it)
        moves = None if exact else (input_sensitivity(subject, probe, oracle) if ratios is not None
                                    else lambda: input_sensitivity(subject, probe, oracle))
        finding, leaves = judge_probe(subject, probe, reference, where_reference_finite(reference, oracle), scales,
                                      moves, truth=oracle)
        if evidence is not None:
            evidence.extend({"case": case.to_json(), **leaf.to_json()} for leaf in leaves)
        if ratios is not None:
            ratios.append(max((leaf.ratio for leaf in leaves), default=0.0))
        return finding if finding is not None else False

    def _fail(self, subject: Subject, case: Case, label: str, original: tuple, probe: tuple, finding: Finding,
              evidence: list, argument: int | None = None, scales: dict[str, float] | None = None) -> GateResult:
        """Shrink to the fewest values drawn from the distribution, the rest as the factory made them (within
        `argument` when only that one was drawn from it)."""
        positions = [(i, j) for i, a in enumerate(probe) if isinstance(a, torch.Tensor) and a.is_floating_point()
                     and a.numel() > 0 and argument in (None, i) for j in range(a.numel())]
        found = {len(positions): (finding, positions)}

        def mixed(chosen: list[tuple[int, int]]) -> tuple:
            args = list(clone_tree(original))
            for i in {i for i, _ in chosen}:
                flat = torch.tensor([j for k, j in chosen if k == i], device=args[i].device)
                view = args[i].reshape(-1)
                view[flat] = probe[i].reshape(-1)[flat]
                args[i] = view.reshape(args[i].shape)
            return subject.conform(original, tuple(args))

        # a smaller set must fail about as badly: mixing drawn and factory values in one row can miss the bound
        # marginally for reasons of its own (a row of offset and plain values has a huge variance)
        strength = min(finding.details.get("ratio", 0.0), BROKEN_FACTOR) / 2

        def fails(chosen: list[tuple[int, int]]) -> bool:
            result = self._judge(subject, mixed(chosen), case, None, scales)
            if isinstance(result, Finding) and result.kind == finding.kind \
                    and result.details.get("ratio", 0.0) >= strength:
                found[len(chosen)] = (result, chosen)
                return True
            return False

        note = ""
        if len(positions) <= SHRINK_MAX_ELEMENTS:
            shrunk = shrink_subset(positions, fails, seconds=min(SHRINK_SECONDS, subject.entry.limits.timeout / 4))
            final, chosen = found[len(shrunk.value)]
            if len(chosen) < len(positions):
                shown = ", ".join(f"argument {i} at {list(index_of(j, tuple(probe[i].shape)))} = "
                                  f"{float(probe[i].reshape(-1)[j]):.6g}" for i, j in chosen[:5])
                more = f" and {len(chosen) - 5} more" if len(chosen) > 5 else ""
                note = (f"; shrunk to {len(chosen)} of {len(positions)} values from it, the rest as the factory "
                        f"made them: {shown}{more} ({shrunk.note()})")
            elif shrunk.complete:
                note = f"; all {len(positions)} values needed (no smaller set of them fails; {shrunk.note()})"
            finding = final
        return self._report(subject, case, label, finding, evidence, note, argument)

    def _report(self, subject: Subject, case: Case, label: str, finding: Finding, evidence: list,
                note: str, argument: int | None = None) -> GateResult:
        details = {**finding.details, "kind": finding.kind, "distribution": label}
        if argument is not None:
            details["argument"] = argument
        result = self.failed(subject, f"{label}: {finding.message}{note}", case=case, expected=finding.expected,
                             got=finding.got, where=finding.where, broken=finding.broken, evidence=evidence,
                             details=details)
        result.tolerance_free = finding.tolerance_free
        return result


def _kind(family: str) -> str:
    """The kind of argument a family of one argument at a time applies to: integer, boolean or floating."""
    return "boolean" if family in BOOLEAN_FAMILIES else "floating" if family in {**FLOATING_FAMILIES,
                                                                                   **WEIGHT_FAMILIES} else "integer"


def _family(name: str, argument: int | None) -> str:
    label = f"distribution {name!r} ({DISTRIBUTIONS[name][0]})"
    if argument is not None:
        label += (f" on argument {argument} alone, the others as the factory made them (the reference rejects "
                  f"it on all arguments at once)")
    return label


def input_sensitivity(subject: Subject, probe: tuple, oracle) -> dict[str, float]:
    """Per floating output leaf, how far the float64 oracle moves when every floating-point input moves by
    an ulp of its dtype (x * (1 +- eps), signs drawn at random): the error a computation in the kernel's dtype
    incurs by rounding once at the inputs' magnitude (the mean of values that share a large offset, say),
    which a reference that computes wider inside does not show in its own error. Empty where the reference
    rejects the moved inputs."""
    found = {}
    for path, diff in oracle_moves(subject, probe, oracle).items():
        diff = diff[torch.isfinite(diff)]
        found[path] = float(diff.max()) if diff.numel() else 0.0
    return found


def oracle_moves(subject: Subject, probe: tuple, oracle, draws: int = 1) -> dict[str, torch.Tensor]:
    """`input_sensitivity` element by element: per floating output leaf, |oracle(moved inputs) - oracle| (float64,
    on the oracle's device), the largest over `draws` seeded draws of the signs (one draw can move two terms
    that cancel alike, and their difference not at all). Empty where the reference rejects the moved inputs."""
    found: dict[str, torch.Tensor] = {}
    for draw in range(draws):
        out = unless_rejected(lambda draw=draw: subject.oracle(_moved_by_an_ulp(subject, probe, draw)))
        if out is None:
            return {}
        outs = dict(flatten(out))
        for path, want in flatten(oracle):
            got = outs.get(path)
            if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and want.is_floating_point() \
                    and got.shape == want.shape and want.numel():
                diff = (got.double() - want.double().to(got.device)).abs()
                found[path] = torch.maximum(found[path], diff) if path in found else diff
    return found


def _moved_by_an_ulp(subject: Subject, probe: tuple, seed: int) -> tuple:
    """`probe` with every floating-point input x moved to x * (1 +- eps) in float64, signs drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)

    def moved(a):
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 0):
            return a.clone() if isinstance(a, torch.Tensor) else a
        sign = torch.where(torch.rand(a.shape, generator=gen) < 0.5, -1.0, 1.0).to(dtype=torch.float64, device=a.device)
        return a.double() * (1 + torch.finfo(a.dtype).eps * sign)

    return subject.conform(probe, tuple(moved(a) for a in probe))


def where_reference_finite(reference, oracle):
    """`oracle` with NaN wherever the reference (in the kernel's dtype) is NaN/Inf and the oracle is not: the
    reference overflows there in its own dtype, so those outputs are not judged (the bound's comparison
    skips the oracle's non-finite elements). Trees of another structure are left to the comparison."""
    if isinstance(oracle, torch.Tensor):
        if not (isinstance(reference, torch.Tensor) and oracle.is_floating_point()
                and reference.is_floating_point() and reference.shape == oracle.shape):
            return oracle
        bad = ~torch.isfinite(reference.to(oracle.device)) & torch.isfinite(oracle)
        return oracle.masked_fill(bad, math.nan) if bad.any() else oracle
    if isinstance(oracle, (tuple, list)) and isinstance(reference, (tuple, list)) and len(oracle) == len(reference):
        return type(oracle)(where_reference_finite(r, o) for r, o in zip(reference, oracle))
    if isinstance(oracle, dict) and isinstance(reference, dict):
        return {k: where_reference_finite(reference.get(k), v) for k, v in oracle.items()}
    return oracle


GATE = Distributions
