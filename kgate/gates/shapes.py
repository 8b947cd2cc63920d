"""shapes: correct across a sweep of shapes, the declared ones plus edge shapes generated from them.

Generated from each declared shape: every size 1, size 1 in one dimension, size 1 in two dimensions at once
(shapes of three or more dimensions, the others kept), every size the largest
prime not above it, one dimension larger than a block of 4096 (4097), sizes 3, 17 and 131 (odd,
non-multiples of 8/16/32/64/128) and declared size +-1 in one dimension, and, last, an empty batch
(size 0 in dimension 0). At most `MAX_GENERATED` shapes, each of at most `CAP_FACTOR` x the largest
declared shape's elements (at least `MIN_CAP`), and whose inputs hold at most `INPUT_FACTOR` x the
declared inputs' elements: the sweep stays cheap on a CPU. A kernel that fails only on the empty
batch gets `details.empty_only` (the audit report counts those apart), and a failure on real data is
never shrunk to an empty shape.

Each shape, in every dtype with the first seed, is judged like the contract and oracle gates: the
kernel must not raise where the reference accepts the inputs, must give the reference's structure,
shape, dtype and layout, alias no input the reference's output does not (a fast path that returns its
input only at size 1), and stay within the oracle bound. A shape that the inputs factory or the reference
rejects (raises on) is skipped: making the factory raise on shapes outside the kernel's domain is how
a manifest declares that domain. A failing shape is shrunk to the failing shape with the fewest
elements (kgate.shrink) before it is reported, with its `kgate run ... --shape` reproducer.

On the shapes longer than one block (4097 in one dimension) a NaN is also written into the first, then the
last, element of every floating-point input: where the float64 oracle and the reference then give NaN, the
kernel must not give a finite value (`kgate.shrink.nan_lost`, tolerance-free), where it keeps those NaNs at
every declared shape (else the special_values gate's finding). A NaN that stops at a block
boundary, in a kernel that carries a running value from one block to the next (a scan, a running maximum),
shows only on rows longer than one block, which the special_values gate, at the declared shapes, never meets.
"""

from __future__ import annotations

import inspect
import time

import torch

from kgate.compare import clone_tree
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case
from kgate.shrink import NAN, SHRINK_SECONDS, Finding, judge_probe, nan_finding, nan_lost, numel, shrink_shape
from kgate.subject import InputsTooLarge, Subject, UserCodeError, input_elements, unless_rejected

MAX_GENERATED = 26
MIN_CAP = 1 << 13
CAP_FACTOR = 4
INPUT_FACTOR = 8
MIN_INPUT_CAP = 1 << 20
BLOCK_PLUS_ONE = 4097
ODD_SIZES = (3, 17, 131)
EMPTY = "empty (size 0 in dim 0)"
LONG = "larger than one block"  # the generated shapes on which NaN probes run too (`nan_at_ends`)


def largest_prime_at_most(n: int) -> int:
    """The largest prime <= n (n itself for n < 3, which keeps 1 and 2 as they are)."""
    if n < 3:
        return n
    for candidate in range(n, 1, -1):
        if all(candidate % d for d in range(2, int(candidate ** 0.5) + 1)):
            return candidate
    return 2


def edge_shapes(declared: list[tuple[int, ...]], cap: int) -> list[tuple[tuple[int, ...], str]]:
    """Edge shapes derived from the declared ones, most telling first, deduplicated, within `cap`."""
    seen = set(declared)
    chosen: list[tuple[tuple[int, ...], str]] = []

    def add(shape: tuple[int, ...], why: str) -> None:
        if shape not in seen and numel(shape) <= cap:
            seen.add(shape)
            chosen.append((shape, why))

    ranked = sorted((s for s in declared if len(s) > 0), key=numel, reverse=True)
    for shape in ranked:
        add((1,) * len(shape), "every size 1")
    for shape in ranked:
        for dim, size in enumerate(shape):
            if size != 1:
                add(_with(shape, dim, 1), f"size 1 in dim {dim}")
    for shape in ranked:  # two at once, the others kept (a fast path for a 1 x 1 image: H = W = 1, channels kept)
        if len(shape) >= 3:
            for first in range(len(shape)):
                for second in range(first + 1, len(shape)):
                    if shape[first] != 1 and shape[second] != 1:
                        add(_with(_with(shape, first, 1), second, 1), f"size 1 in dims {first} and {second}")
    for shape in ranked:
        add(tuple(largest_prime_at_most(s) for s in shape), "every size prime")
    for shape in ranked:
        for dim in range(len(shape)):
            big = _with(shape, dim, BLOCK_PLUS_ONE)
            if numel(big) > cap:  # keep the long dimension, make the others 1
                big = tuple(BLOCK_PLUS_ONE if d == dim else min(s, 1) for d, s in enumerate(shape))
            add(big, f"dim {dim} {LONG} ({BLOCK_PLUS_ONE})")
    for shape in ranked:
        for dim, size in enumerate(shape):
            for value in (size + 1, size - 1):
                if size >= 8 and value % 2:
                    add(_with(shape, dim, value), f"declared size {size} {value - size:+d} in dim {dim}")
    for shape in ranked:
        for dim in range(len(shape)):
            for value in ODD_SIZES:
                add(_with(shape, dim, value), f"odd size {value} in dim {dim}")
    # Empty inputs last, and always: a kernel that fails only there is told apart from one that fails on
    # real data (`empty_only` in the verdict's details).
    empty = list(dict.fromkeys((0,) + shape[1:] for shape in ranked if shape[0] != 0 and (0,) + shape[1:] not in seen))
    return chosen[:MAX_GENERATED - len(empty)] + [(shape, EMPTY) for shape in empty]


def _with(shape: tuple[int, ...], dim: int, value: int) -> tuple[int, ...]:
    return shape[:dim] + (value,) + shape[dim + 1:]


def takes_shape(subject: Subject) -> bool:
    """Whether the inputs depend on the case's shape (a factory with `shape`, or declarative inputs)."""
    source = subject.factory.source
    if callable(source):
        try:
            params = inspect.signature(source).parameters
        except (TypeError, ValueError):
            return False
        return "shape" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if source is None:
        return True
    return any(spec.shape is None and spec.value is None for spec in source)


class Shapes(Gate):
    name = "shapes"
    summary = "contract and oracle bound hold on declared plus generated edge shapes (1, primes, odd, 4097, empty)"
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        if not takes_shape(subject):
            if isinstance(subject.factory.source, list):  # declarative inputs, each with its own shape
                return self.skipped("every declared input has a fixed `shape:` (or is a `value:`), so only that "
                                    "shape exists (the oracle gate judges it); leave `shape:` out of the inputs "
                                    "that follow the kernel's `shapes:` to sweep shapes")
            return self.skipped("the inputs factory takes no `shape` keyword, so only its default shape exists "
                                "(the oracle gate judges it); give make_inputs a `shape` parameter and the "
                                "kernel `shapes:` to sweep shapes")
        seed = subject.cases[0].seed
        dtypes = list(dict.fromkeys(c.dtype for c in subject.cases))
        declared = list(dict.fromkeys(c.shape for c in subject.cases if c.shape is not None))
        if not declared:
            derived = self._derive_shape(subject, dtypes[0], seed)
            if derived is None:
                return self.skipped("no `shapes:` declared and the factory's default inputs do not tell which "
                                    "shape produced them; declare `shapes:` to sweep shapes")
            declared = [derived]
        evidence: list[dict] = []
        sizes = []
        for shape in declared:  # the declared shapes must work: factory or reference errors are errors
            for dtype in dtypes:
                case = Case(shape, dtype, seed)
                base = subject.baseline(case)
                sizes.append(input_elements(base.args))
                finding = self._judge(subject, case, base, evidence)
                if finding is not None:
                    return self._fail(subject, case, "a declared shape", finding, evidence)
        input_cap = max(INPUT_FACTOR * max(sizes), MIN_INPUT_CAP)
        generated = edge_shapes(declared, max(CAP_FACTOR * max(numel(s) for s in declared), MIN_CAP))
        rejected: list[str] = []
        too_big: list[str] = []
        # Half the gate's time limit for the generated sweep, a quarter for shrinking: a slow kernel gets
        # a shorter sweep (said in the message), not a timeout that loses the verdict.
        timeout = subject.entry.limits.timeout
        deadline = subject.deadline if subject.deadline is not None else time.monotonic() + timeout / 2
        swept = 0
        for shape, why in generated:
            if time.monotonic() > deadline:
                break
            swept += 1
            for dtype in dtypes:
                case = Case(shape, dtype, seed)
                try:  # inputs past the cap are not run (the reference and the oracle neither)
                    base = subject.baseline(case, max_elements=input_cap)
                except UserCodeError as exc:
                    rejected.append(f"{_fmt(shape)} ({exc.role} raised {type(exc.exc).__name__})")
                    break
                except InputsTooLarge:
                    too_big.append(_fmt(shape))
                    break
                finding = self._judge(subject, case, base, evidence)
                if finding is None and LONG in why:
                    finding = nan_at_ends(subject, base.args)
                    # shape-dependent only where the same NaNs are kept at every declared shape: a kernel that
                    # drops them there too is the special_values gate's finding, not this one's
                    if finding is not None and any(nan_at_ends(subject, subject.baseline(Case(d, dtype, seed)).args)
                                                   for d in declared):
                        finding = None
                    if finding is not None:  # not shrunk: smaller shapes are within one block
                        result = self.failed(subject, f"shape {_fmt(shape)} ({why}): {finding.message}", case=case,
                                             expected=finding.expected, got=finding.got, where=finding.where,
                                             broken=True, evidence=evidence,
                                             details={**finding.details, "kind": NAN, "found_at": list(shape),
                                                      "why": why, "empty_only": False})
                        result.tolerance_free = True
                        return result
                if finding is not None:
                    return self._fail(subject, case, why, finding, evidence)
        notes = []
        if rejected:
            notes.append(f"skipped {len(rejected)} the reference or factory rejects: {', '.join(rejected[:6])}")
        if too_big:
            notes.append(f"skipped {len(too_big)} whose inputs are too large for the sweep: {', '.join(too_big)}")
        if swept < len(generated):
            notes.append(f"stopped after {swept} of {len(generated)} generated shapes (half the gate's "
                         f"{timeout:g} s time limit)")
        message = (f"contract and oracle bound held on {len(declared)} declared and "
                   f"{swept - len(rejected) - len(too_big)} generated shape(s) x {len(dtypes)} dtype(s)")
        return self.passed(message + ("; " + "; ".join(notes) if notes else ""), evidence=evidence,
                           details={"generated": [list(s) for s, _ in generated], "rejected": rejected,
                                    "too_large": too_big})

    @staticmethod
    def _judge(subject: Subject, case: Case, base, evidence: list) -> Finding | None:
        finding, leaves = judge_probe(subject, base.args, base.reference, base.oracle, layout=True)
        evidence.extend({"case": case.to_json(), **leaf.to_json()} for leaf in leaves)
        return finding

    def _derive_shape(self, subject: Subject, dtype: str, seed: int) -> tuple[int, ...] | None:
        """The shape of the default inputs' first tensor, if asking the factory for it reproduces them."""
        default = subject.inputs(Case(None, dtype, seed))
        tensors = [a for a in default if isinstance(a, torch.Tensor)]
        if not tensors:
            return None
        shape = tuple(tensors[0].shape)
        try:
            again = subject.inputs(Case(shape, dtype, seed))
        except UserCodeError:
            return None
        same = [tuple(a.shape) for a in again if isinstance(a, torch.Tensor)] == [tuple(t.shape) for t in tensors]
        return shape if same else None

    def _fail(self, subject: Subject, case: Case, why: str, finding: Finding, evidence: list) -> GateResult:
        found: dict[tuple[int, ...], Finding] = {case.shape: finding}

        empty_only = numel(case.shape) == 0

        def fails(shape: tuple[int, ...]) -> bool:
            if numel(shape) == 0 and not empty_only:
                return False  # a failure on real data stays one: shrinking it to no data would hide it
            probe = Case(shape, case.dtype, case.seed)
            try:
                base = subject.baseline(probe)
            except UserCodeError:
                return False  # the reference or the factory rejects this shape: not a counterexample
            result, _ = judge_probe(subject, base.args, base.reference, base.oracle, layout=True)
            if result is not None and result.kind == finding.kind:
                found[shape] = result
                return True
            return False

        shrunk = shrink_shape(case.shape, fails, seconds=min(SHRINK_SECONDS, subject.entry.limits.timeout / 4))
        smallest = shrunk.value
        final = found[smallest]
        minimal = Case(smallest, case.dtype, case.seed)
        origin = why
        if smallest != case.shape:
            origin = f"shrunk from {_fmt(case.shape)}, {why}, in {shrunk.note()}"
        tail = "; every non-empty shape swept passed (the kernel fails only on empty inputs)" if empty_only else ""
        result = self.failed(subject, f"shape {_fmt(smallest)} ({origin}): {final.message}{tail}", case=minimal,
                             expected=final.expected, got=final.got, where=final.where, broken=final.broken,
                             evidence=evidence,
                             details={**final.details, "kind": final.kind, "found_at": list(case.shape),
                                      "why": why, "smallest": list(smallest), "empty_only": empty_only})
        result.tolerance_free = final.tolerance_free
        return result


def nan_at_ends(subject: Subject, args: tuple) -> Finding | None:
    """A NaN written into the first, then the last, element of every non-empty floating-point input of `args`:
    the first probe where the kernel is finite where the oracle and the reference both give NaN, or None.
    Probes the reference rejects, and a kernel that raises on them (the special_values gate's business), are
    passed over."""
    floats = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel()]
    if not floats:
        return None
    for where, at in (("first", 0), ("last", -1)):
        probe = list(clone_tree(args))
        for i in floats:
            probe[i] = probe[i].contiguous()
            probe[i].view(-1)[at] = float("nan")
        probe_args = subject.conform(args, tuple(probe))
        outputs = unless_rejected(lambda p=probe_args: (subject.run_reference(clone_tree(p)), subject.oracle(p)))
        if outputs is None:
            continue
        try:
            out = subject.run_kernel(clone_tree(probe_args))
        except UserCodeError as exc:
            if exc.role != "kernel":
                raise
            continue
        lost = nan_lost(out, *outputs)
        if lost is not None:
            return nan_finding(lost, f"with a NaN in the {where} element of every floating-point input, ")
    return None


def _fmt(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "default"
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


GATE = Shapes
