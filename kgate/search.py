"""A short seeded search for the inputs a kernel handles worst: affine transforms of the factory's inputs.

The distributions gate draws fixed families of inputs; some numerical failures need a particular
combination of magnitude and offset that no fixed family hits (a one-pass variance cancels once a common
offset is large against the spread; a running maximum started at 0 underflows once a row lies far enough
below zero). The search walks the space of affine transforms

    x_i -> 10^s_i * x_i + 10^s_i * o_i * spread(x_i)        (per floating-point argument i)

(`spread` the standard deviation of the factory's values of x_i, 1 where they are all equal), applied to
every floating-point argument at once or to one of them, the others as the factory made them. It first
draws `RANDOM_TRIES` transforms from a generator seeded with the case's seed (scales within `LOG_SCALE`); then
sweeps the scale's decades outside that range (`sweep`: every `SWEEP_STEP`-th decade the arguments' dtype can
hold, nearest first, no offset; every argument at once, then each alone where there are several): a kernel
that adds a constant such as an epsilon (`rsqrt(h + eps^2)` for `1 / (sqrt(h) + eps)`), or switches formula at a
fixed magnitude, is wrong in the few decades where its constant matters, and no fixed family of magnitudes
can know which. Then it climbs from the worst transform found, drawn or swept (`CLIMB_TRIES` small
perturbations of it, each kept when it is worse for the kernel). Worse means
a larger `objective`: the caller's error / bound of the kernel on those inputs. The search stops at the
first transform whose objective reports a failure, at its tries, or at its deadline. Same seed, same
transforms: a reproducer run with the case's seed finds the same inputs.

Values are clipped to a sixteenth of the dtype's largest finite value: overflow is the special_values
gate's business.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest
from typing import Generic, TypeVar

import torch

RANDOM_TRIES = 6
CLIMB_TRIES = 4
LOG_SCALE = (-3.0, 3.0)  # decades the scale is drawn from
SWEEP_STEP = 3  # decades between two swept scales: a window of a constant's influence is about 3 decades wide
LOG_OFFSET = (0.0, 4.0)  # decades of the offset's size, in spreads (0: no offset, drawn a quarter of the time)
STEP = 0.5  # a climbing step, in decades

R = TypeVar("R")


@dataclass(frozen=True)
class Affine:
    """x -> 10^log_scale * (x + offset * spread(x)) on one argument."""

    log_scale: float
    offset: float

    def describe(self) -> str:
        parts = []
        if self.log_scale != 0:
            parts.append(f"scaled by 10^{self.log_scale:.2f}")
        if self.offset != 0:
            parts.append(f"shifted by {self.offset:+.3g} x its spread")
        return " and ".join(parts) or "unchanged"


@dataclass(frozen=True)
class Transform:
    """Affine transforms per argument index (the arguments not named keep the factory's values)."""

    parts: tuple[tuple[int, Affine], ...]

    @property
    def argument(self) -> int | None:
        """The one argument transformed, or None when every floating-point argument is."""
        return self.parts[0][0] if len(self.parts) == 1 else None

    def describe(self) -> str:
        return "; ".join(f"argument {i} {a.describe()}" for i, a in self.parts)


def spread(t: torch.Tensor) -> float:
    s = float(t.double().std()) if t.numel() > 1 else 0.0
    return s if s > 0 and math.isfinite(s) else 1.0


def scale_range(dtype: torch.dtype) -> tuple[int, int]:
    """The decades a scale may take for `dtype`: from the smallest normal's decade (up to a sixteenth of the
    largest value, where `apply` clips) to the largest's."""
    info = torch.finfo(dtype)
    return math.ceil(math.log10(info.tiny)), math.floor(math.log10(info.max / 16))


def sweep(args: tuple, floats: list[int]) -> list[Transform]:
    """The swept transforms: scales 10^k for every `SWEEP_STEP`-th decade k outside `LOG_SCALE` that every
    argument concerned can hold, the decades nearest 10^0 first (their order alternates below and above 1),
    applied to every argument in `floats` at once, then to each alone where there are several."""
    targets = [floats] + ([[i] for i in floats] if len(floats) > 1 else [])
    found = []
    for target in targets:
        lo = max(scale_range(args[i].dtype)[0] for i in target)
        hi = min(scale_range(args[i].dtype)[1] for i in target)
        below = [k for k in range(-SWEEP_STEP, lo - 1, -SWEEP_STEP) if k < LOG_SCALE[0]]
        above = [k for k in range(SWEEP_STEP, hi + 1, SWEEP_STEP) if k > LOG_SCALE[1]]
        decades = [k for pair in zip_longest(below, above) for k in pair if k is not None]
        found += [Transform(tuple((i, Affine(float(k), 0.0)) for i in target)) for k in decades]
    return found


def apply(args: tuple, transform: Transform) -> tuple:
    """Copies of `args` with each named argument transformed (in float64, then back to its dtype)."""
    out = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    for i, affine in transform.parts:
        t = args[i]
        limit = torch.finfo(t.dtype).max / 16
        scale = 10.0 ** affine.log_scale
        values = (t.double() + affine.offset * spread(t)) * scale
        out[i] = values.clamp(-limit, limit).to(t.dtype)
    return tuple(out)


@dataclass
class Searched(Generic[R]):
    """The worst transform found, its objective and result, how many were tried, and the first
    transform whose result the caller counts as a failure (None if none)."""

    worst: Transform | None
    worst_value: float
    tries: int
    failure: tuple[Transform, tuple, R] | None
    complete: bool
    judged: int = 0  # tries the reference accepted

    def note(self) -> str:
        spent = "" if self.complete else " (time box spent first)"
        return f"{self.tries} seeded affine transform(s) tried, {self.judged} inside the reference's domain{spent}"


def search(args: tuple, floats: list[int], seed: int, judge: Callable[[tuple], tuple[float, R, bool] | None],
           *, seconds: float, out_of_time: Callable[[], bool] = lambda: False,
           tries: tuple[int, int] = (RANDOM_TRIES, CLIMB_TRIES),
           conform: Callable[[tuple, tuple], tuple] | None = None) -> Searched[R]:
    """Search the affine transforms of `args` (changing only the arguments in `floats`). `judge(inputs)`
    returns (objective, result, failed), or None where the reference rejects the inputs (outside its
    domain: the transform says nothing). `conform(args, inputs)` brings each transform's inputs back into
    the structure the inputs are known to have (a Subject's `conform`: an offset fills a triangular
    matrix's zeros). Stops at the first failure."""
    gen = torch.Generator().manual_seed(seed)
    deadline = time.monotonic() + seconds

    def uniform(lo: float, hi: float) -> float:
        return lo + (hi - lo) * float(torch.rand((), generator=gen, dtype=torch.float64))

    def draw() -> Transform:
        chosen = floats if len(floats) == 1 or uniform(0, 1) < 0.5 \
            else [floats[int(torch.randint(len(floats), (), generator=gen))]]
        parts = []
        for i in chosen:
            offset = 0.0 if uniform(0, 1) < 0.25 else \
                (1 if uniform(0, 1) < 0.5 else -1) * 10 ** uniform(*LOG_OFFSET)
            parts.append((i, Affine(round(uniform(*LOG_SCALE), 2), float(f"{offset:.3g}"))))
        return Transform(tuple(parts))

    def nudge(transform: Transform) -> Transform:
        parts = []
        for i, a in transform.parts:
            lo, hi = (min(a.log_scale, LOG_SCALE[0]), max(a.log_scale, LOG_SCALE[1]))  # a swept scale's decades too
            log_scale = min(max(a.log_scale + uniform(-STEP, STEP), lo), hi)
            offset = a.offset
            if offset != 0:
                size = min(max(math.log10(abs(offset)) + uniform(-STEP, STEP), LOG_OFFSET[0]), LOG_OFFSET[1])
                offset = math.copysign(10 ** size, offset)
            parts.append((i, Affine(round(log_scale, 2), float(f"{offset:.3g}"))))
        return Transform(tuple(parts))

    worst: Transform | None = None
    worst_value = -math.inf
    done = judged_count = 0
    n_random, n_climb = tries
    swept = sweep(args, floats)
    for step in range(len(swept) + n_random + n_climb):
        if time.monotonic() > deadline or out_of_time():
            return Searched(worst, worst_value, done, None, False, judged_count)
        if step < n_random:
            transform = draw()
        elif step < n_random + len(swept):
            transform = swept[step - n_random]
        else:  # the climb, from the worst transform found (none judged yet: another draw)
            transform = draw() if worst is None else nudge(worst)
        inputs = apply(args, transform)
        if conform is not None:
            inputs = conform(args, inputs)
        judged = judge(inputs)
        done += 1
        if judged is None:
            continue
        value, result, failed = judged
        judged_count += 1
        if failed:
            return Searched(transform, value, done, (transform, inputs, result), True, judged_count)
        if value > worst_value:
            worst, worst_value = transform, value
    return Searched(worst, worst_value, done, None, True, judged_count)
