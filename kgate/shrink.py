"""Minimal counterexamples: shrink a failing probe before reporting it, as Hypothesis does.

Two shrinkers, both driven by a predicate `fails(candidate) -> bool` that re-runs the probe:

- `shrink_shape`: the failing shape with the fewest elements that a greedy search finds (all sizes
  to 1 at once, then per dimension 1, 2, 3 and a bisection between the smallest tried size and the
  failing one, repeated until nothing shrinks);
- `shrink_subset`: the smallest set of changed items (arguments, element positions) that still
  fails, by removing chunks of halving size (delta debugging): the fewest special values.

A shrinker only ever moves to a candidate on which `fails` holds, so what it returns still fails.
Each call costs a kernel run, so both stop after `budget` calls or `seconds` and say whether they
finished.

`judge_probe` is what the gates' predicates re-run: one kernel call on given inputs, judged like the
contract and oracle gates (a crash, a wrong shape or dtype, with `layout` a layout or an aliasing the
reference's output does not have: the shapes gate holds the whole contract at every shape, not at the
declared ones only; a miss of the oracle bound), returning a
`Finding` whose `kind` lets a shrinker keep to the same failure instead of drifting to another.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from kgate.compare import clone_tree, flatten, index_of
from kgate.gates.contract import aliased_inputs, layout_problem, module_alias_message, module_aliases
from kgate.gates.oracle import Incomparable, measure_outputs
from kgate.oracle import BROKEN_FACTOR, LeafError, own_dtype
from kgate.subject import Subject, UserCodeError

T = TypeVar("T")

SHAPE_BUDGET = 32
SUBSET_BUDGET = 48
SHRINK_SECONDS = 60.0


@dataclass
class Shrunk(Generic[T]):
    """The smallest failing candidate found, the calls spent and whether the search ran to its end."""

    value: T
    calls: int
    complete: bool

    def note(self) -> str:
        return f"{self.calls} shrink {'try' if self.calls == 1 else 'tries'}" + ("" if self.complete else ", budget spent: smaller may exist")


class _Counter:
    def __init__(self, fails: Callable[[Any], bool], budget: int, seconds: float):
        self.fails = fails
        self.budget = budget
        self.calls = 0
        self.deadline = time.monotonic() + seconds

    @property
    def spent(self) -> bool:
        return self.calls >= self.budget or time.monotonic() > self.deadline

    def __call__(self, candidate: Any) -> bool:
        if self.spent:
            return False
        self.calls += 1
        return bool(self.fails(candidate))


def numel(shape: Sequence[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def shrink_shape(shape: Sequence[int], fails: Callable[[tuple[int, ...]], bool], *,
                 budget: int = SHAPE_BUDGET, seconds: float = SHRINK_SECONDS) -> Shrunk[tuple[int, ...]]:
    """The failing shape with the fewest elements reachable from `shape` (which must fail)."""
    attempt = _Counter(fails, budget, seconds)
    current = tuple(int(s) for s in shape)
    ones = tuple(min(s, 1) for s in current)
    if ones != current and attempt(ones):
        return Shrunk(ones, attempt.calls, True)
    improved = True
    while improved and not attempt.spent:
        improved = False
        for dim, size in enumerate(current):
            smaller = _shrink_size(current, dim, size, attempt)
            if smaller < size:
                current = current[:dim] + (smaller,) + current[dim + 1:]
                improved = True
    return Shrunk(current, attempt.calls, not attempt.spent)


def _shrink_size(shape: tuple[int, ...], dim: int, size: int, attempt: _Counter) -> int:
    """The smallest size of `dim` (< size where possible) at which the shape still fails."""
    if size <= 1:
        return size

    def at(value: int) -> tuple[int, ...]:
        return shape[:dim] + (value,) + shape[dim + 1:]

    small = [v for v in (1, 2, 3) if v < size]
    for value in small:
        if attempt(at(value)):
            return value
    # Bisect between the largest small size tried (passes) and `size` (fails); a failure that is not
    # monotone in the size still ends on a failing size, only maybe not the least one.
    lo, hi = (small[-1] if small else 0), size
    while hi - lo > 1 and not attempt.spent:
        mid = (lo + hi) // 2
        if attempt(at(mid)):
            hi = mid
        else:
            lo = mid
    return hi


def shrink_subset(items: Sequence[T], fails: Callable[[list[T]], bool], *,
                  budget: int = SUBSET_BUDGET, seconds: float = SHRINK_SECONDS) -> Shrunk[list[T]]:
    """The smallest non-empty sub-list of `items` (which must fail) on which `fails` still holds."""
    attempt = _Counter(fails, budget, seconds)
    current = list(items)
    chunk = max(1, len(current) // 2)
    while not attempt.spent:
        removed = False
        start = 0
        while start < len(current) and not attempt.spent:
            candidate = current[:start] + current[start + chunk:]
            if candidate and attempt(candidate):
                current = candidate
                removed = True
            else:
                start += chunk
        if chunk == 1 and not removed:
            return Shrunk(current, attempt.calls, True)
        chunk = max(1, min(chunk if removed else chunk // 2, len(current) // 2))
    return Shrunk(current, attempt.calls, False)


# -- judging one probe ------------------------------------------------------------------------------------

CRASH, CONTRACT, ORACLE, NAN, INF = "crash", "contract", "oracle", "nan", "inf"


@dataclass
class Finding:
    """Why one probe failed. `kind` is crash, contract (structure/shape/dtype), nan (finite where the oracle
    and the reference are NaN), inf (finite where both are the same infinity) or oracle (bound missed)."""

    kind: str
    message: str
    where: str | None = None
    expected: str | None = None
    got: str | None = None
    broken: bool = True
    tolerance_free: bool = True
    details: dict[str, Any] = field(default_factory=dict)


def _float_leaves(out: Any, reference: Any, oracle: Any) -> Iterator[tuple[str, torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]]:
    """(path, kernel's, reference's, oracle's) for each non-empty floating-point output leaf that the reference
    and the oracle hold at the same path and shape; the last two on the kernel's device."""
    refs, truths = dict(flatten(reference)), dict(flatten(oracle))
    for path, got in flatten(out):
        want, truth = refs.get(path), truths.get(path)
        if all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (got, want, truth)) \
                and got.shape == want.shape == truth.shape and got.numel():
            yield path, got.detach(), want.detach().to(got.device), truth.detach().to(got.device)


def nan_lost(out: Any, reference: Any, oracle: Any) -> tuple[str, tuple[int, ...], float, int] | None:
    """The first output element that is finite where the float64 oracle and the reference (in the kernel's
    dtype) both give NaN: (path, index, the kernel's value, how many such elements), or None. Where both agree
    that the result is NaN (0/0 of an empty selection, a NaN the inputs carry), a finite value is a wrong
    result that no bound measures (the bound judges the elements where the oracle is finite); a NaN where
    either is finite is the bound's business and the special_values gate's."""
    for path, got, want, truth in _float_leaves(out, reference, oracle):
        lost = torch.isnan(want) & torch.isnan(truth) & torch.isfinite(got)
        if bool(lost.any()):
            flat = int(lost.reshape(-1).nonzero()[0])
            return path, index_of(flat, tuple(got.shape)), float(got.reshape(-1)[flat]), int(lost.sum())
    return None


def inf_lost(out: Any, reference: Any, oracle: Any) -> tuple[str, tuple[int, ...], float, int, float] | None:
    """The first output element that is finite where the float64 oracle and the reference (in the kernel's dtype)
    give the same infinity: (path, index, the kernel's value, how many such elements, the infinity), or None.
    log 0, the log-sum-exp of nothing, a maximum over masked-out values: where both agree that the result is
    infinite, a finite value (a clamp to the dtype's range, an empty reduction started at 0) is a wrong result
    that no bound measures (the bound judges the elements where the oracle is finite). A NaN or the other
    infinity there is the special_values gate's business (`special_values_match` says how they count)."""
    for path, got, want, truth in _float_leaves(out, reference, oracle):
        lost = torch.isinf(truth) & (want.double() == truth.double()) & torch.isfinite(got)
        if bool(lost.any()):
            flat = int(lost.reshape(-1).nonzero()[0])
            return (path, index_of(flat, tuple(got.shape)), float(got.reshape(-1)[flat]), int(lost.sum()),
                    float(truth.reshape(-1)[flat]))
    return None


def inf_finding(lost: tuple[str, tuple[int, ...], float, int, float]) -> Finding:
    """The Finding of `inf_lost`'s element."""
    path, index, got, count, infinity = lost
    where = f"{path}{list(index)}"
    return Finding(INF, f"{where}: the float64 oracle and the reference give {infinity}, the kernel {got!r} "
                   f"({count} element(s) finite where both are that infinity)", where=where,
                   expected=f"{infinity} (float64 oracle and reference)", got=repr(got))


def nan_finding(lost: tuple[str, tuple[int, ...], float, int], inputs: str = "") -> Finding:
    """The Finding of `nan_lost`'s element (`inputs`: what the probe did to them, said before the rest)."""
    path, index, got, count = lost
    where = f"{path}{list(index)}"
    return Finding(NAN, f"{where}: {inputs}the float64 oracle and the reference give NaN, the kernel {got!r} "
                   f"({count} element(s) finite where both are NaN)", where=where,
                   expected="NaN (float64 oracle and reference)", got=repr(got))


def judge_probe(subject: Subject, args: tuple, reference: Any, oracle: Any,
                scales: dict[str, float] | None = None,
                sensitivity: dict[str, float] | Callable[[], dict[str, float]] | None = None, *,
                layout: bool = False, truth: Any = None) -> tuple[Finding | None, list[LeafError]]:
    """Run the kernel on a copy of `args` and judge it against the reference's metadata and the oracle.
    `truth`: the oracle as computed, where the caller passes an `oracle` with elements masked out of the
    bound's comparison as NaN (the distributions gate's `where_reference_finite`); the NaN rule
    (`nan_lost`) reads it.

    A crash of the kernel is a finding (the reference accepted these inputs); the reference's and the
    factory's exceptions are left to the caller, which usually skips such a probe.
    """
    given = clone_tree(args)
    try:
        out = subject.run_kernel(given)
    except UserCodeError as exc:
        if exc.role != "kernel":
            raise
        return Finding(CRASH, f"kernel raised {type(exc.exc).__name__}: {exc.exc}",
                       details={"traceback": exc.trace}), []
    leaves = measure_outputs(out, reference, oracle, subject.tolerance, scales, sensitivity,
                             terms=lambda: subject.terms(args))
    if isinstance(leaves, Incomparable):
        return Finding(CONTRACT, leaves.message, expected=leaves.expected, got=leaves.got), []
    refs = dict(flatten(reference))
    for path, got in flatten(out):
        want = refs.get(path)
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            for attr in ("dtype", "device"):
                if getattr(got, attr) != getattr(want, attr):
                    return Finding(CONTRACT, f"{path} has {attr} {getattr(got, attr)}, the reference's has "
                                   f"{getattr(want, attr)}", where=path, expected=str(getattr(want, attr)),
                                   got=str(getattr(got, attr))), leaves
            problem = layout_problem(got, want) if layout else None
            if problem:
                message, expected, found = problem
                return Finding(CONTRACT, f"{path} {message}", where=path, expected=expected, got=found), leaves
    aliased = aliased_inputs(out, given, subject.inplace) if layout else {}
    if aliased:  # as the contract gate: only where the reference's output, on its own copy, aliases it too
        ref_args = clone_tree(args)
        allowed = aliased_inputs(subject.run_reference(ref_args), ref_args, subject.inplace)
        for path, hits in aliased.items():
            extra = sorted(hits - allowed.get(path, set()))
            if extra:
                return Finding(CONTRACT, f"{path} aliases input argument {extra[0]} (shares its memory); the "
                               f"reference's {path} does not alias it", where=path, expected="a fresh tensor",
                               got=f"a view of argument {extra[0]}"), leaves
    modules = subject.modules()
    shared = module_aliases(out, modules[0]) if modules is not None else []
    floats = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    # (as the contract gate, on any probe's inputs; where the reference ran as itself, not as a converted copy)
    if shared and floats[:1] in ([], [own_dtype(modules[1])]) and not module_aliases(reference, modules[1]):
        path, name = shared[0]
        return Finding(CONTRACT, module_alias_message(path, name), where=path, expected="a fresh tensor",
                       got=f"a view of {name}"), leaves
    lost = nan_lost(out, reference, oracle if truth is None else truth)
    if lost is not None:
        return nan_finding(lost), leaves
    infinite = inf_lost(out, reference, oracle if truth is None else truth)
    if infinite is not None:
        return inf_finding(infinite), leaves
    worst = max(leaves, key=lambda leaf: leaf.ratio, default=None)
    if worst is None or worst.passed:
        return None, leaves
    where = f"{worst.path}{worst.index}" if worst.index is not None else worst.path
    return Finding(ORACLE, worst.describe(), where=where, expected=f"{worst.expected!r} (float64 oracle)",
                   got=repr(worst.got), broken=worst.ratio > BROKEN_FACTOR, tolerance_free=False,
                   details={"ratio": worst.ratio}), leaves
