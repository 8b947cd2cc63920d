"""shapes: correct across a sweep of shapes, the declared ones plus edge shapes generated from them.

Generated: first, from the largest declared shape, the same elements split otherwise (`SPLIT`: one size
doubled, another halved), each judged right after a call at the declared shape (a plan cached by its element
count alone); then from each declared shape: every size 1, size 1 in one dimension, size 1 in two dimensions at
once (shapes of three or more dimensions, the others kept), every size the largest
prime not above it, one dimension larger than a block of 4096 (4097), sizes 3, 17 and 131 (odd,
non-multiples of 8/16/32/64/128) and declared size +-1 in one dimension, then one dimension past 8192
(16384, a power of two: a multiple of every block size up to it), one past 65535 (65537: past the blocks a
CUDA grid's y and z dimensions take, and past 2^16), and, last, size 0 in each dimension (`MAX_EMPTY`: an empty
batch, then empty reductions). The 4097 and 16384 shapes keep the other dimensions where the shape stays within
the cap, else make them 1; the 65537 shapes halve them, widest first, to at most `GRID_KEEP` elements. A kernel
that raises on a size 0 past dimension 0 where the reference returns is passed over (a domain it states); a
value it returns there is judged.

Before the sweep, untied sizes (`untied_probes`): a size that several arguments share, halved in one argument
alone, then in all but one; judged like a shape where the reference accepts it, passed over where the kernel
raises (`MAX_UNTIED`).

At most `MAX_GENERATED` shapes, `MAX_PAST_8192` of them past 8192 and `MAX_PAST_GRID` past 65535, each of at
most `CAP_FACTOR` x the largest
declared shape's elements (at least `MIN_CAP`; past 8192 at least 16384, so the long dimension alone always
fits), and whose inputs hold at most `INPUT_FACTOR` x the declared inputs' elements (at least
`MIN_INPUT_CAP`); a shape at least as large in every dimension as one whose inputs were too large is skipped
without building its inputs. The sweep stays cheap on a CPU. A kernel that fails only on the empty
batch gets `details.empty_only` (the audit report counts those apart), and a failure on real data is
never shrunk to an empty shape.

Each shape, in every dtype with the first seed, is judged like the contract and oracle gates: the
kernel must not raise where the reference accepts the inputs, must give the reference's structure,
shape, dtype and layout, alias no input the reference's output does not (a fast path that returns its
input only at size 1), and stay within the oracle bound. A shape that the inputs factory or the reference
rejects (raises on) is skipped: making the factory raise on shapes outside the kernel's domain is how
a manifest declares that domain. A failing shape is shrunk to the failing shape with the fewest
elements (kgate.shrink) before it is reported, with its `kgate run ... --shape` reproducer.

Past 8192: kernels switch paths at a size (split-K slabs of 8192 whose epilogue runs only for a ragged
tail, statistics of long rows taken from a strided sample), which neither the declared shapes nor 4097
reach. There an oracle miss counts only where it is broken (beyond `BROKEN_FACTOR` bounds), with the input
sensitivity as the least reference error (`kgate.gates.distributions.input_sensitivity`), also while it is
shrunk: a correct sum of 16384 float32 terms in another order than the reference's wider CPU accumulation can
miss the plain bound many times over (a masked mean as a GEMM: 18 times; 2.3 times this one), a path that
drops or clips data misses it by orders of magnitude. Crashes, contract, NaN and infinity findings count as
anywhere (a finite value where the oracle and the reference agree on an infinity: `kgate.shrink.inf_lost`).
Past 65535 (65537) alike.
What a shape past 8192 costs is bounded before the float64 oracle runs on it: its reference outputs may hold
at most `INPUT_FACTOR` x the declared outputs' elements (at least `MIN_OUTPUT_CAP`, about a Gram matrix at
4097), and it is not even built where the largest tensor the reference or the kernel would make there passes
that cap, predicted from the largest they made at the 4097 shape of the same dimension (`largest_made`: a
dispatch mode over one more call of each) grown as from a shape of 2049 to 4097 (run only where a quadratic
growth, `QUADRATIC` per doubling, would pass the cap): attention over the sequence and pairwise comparisons hold
16384^2 elements there, a linear kernel 4 times what it made at 4097 (65537: 4 doublings).

On the shapes longer than one block (4097 in one dimension) special values are written into every
floating-point input too, one probe at a time, and judged tolerance-free:

- a NaN in the first, then the last, element: where the float64 oracle and the reference then give NaN, the
  kernel must not give a finite value (`kgate.shrink.nan_lost`);
- runs (`runs`): the first half plus one of the long dimension (the inputs' dimension of size 4097) filled
  with -inf (a masked prefix, which attention and scan masks make), then with +inf; where the reference
  rejects that, each input alone. Where the oracle and the reference agree on an element's class (NaN, +inf,
  -inf, finite), the kernel must give that class (`class_changed`; under `special_values_match: nonfinite`
  or `spread` as the special_values gate reads it).

Each counts only where the kernel handles the same probe at every declared shape (else it is the
special_values gate's finding), and is not shrunk (smaller shapes are within one block). A kernel that
carries a running value from one block to the next (a scan, a running maximum, an online softmax) can drop a
NaN at a block boundary, or join two -inf (two +inf) carries into a NaN (max(a, b) + log1p(exp(-|a - b|)),
exp(m_old - m_new) with both -inf): that shows only on rows longer than one block, which the special_values
gate, at the declared shapes, never meets, and a run needs a whole block of it.

Sizes of the weights (`_model_sizes`): a subject that can build its kernel and reference at other sizes of their
weights (`Subject.model_sizes`: a KernelBench problem's integers that size its Model, never free sizes) is judged
at up to `kgate.kernelbench.MAX_MODEL_SIZES` of them, after the declared shapes (also where no shape can be
swept): contract, oracle bound and, for a history-dependent module, the oracle gate's sequence of calls. A tail
over a weight dimension that the problem's own sizes (powers of two) never have shows there. Where the inputs
have no free size (their sizes follow the weights'), one size more: all of those integers grown together until
the inputs pass 2^20 elements (`kgate.kernelbench.MANY_INPUT_ELEMENTS`, within the weights' element budget), where
a path taken above a size threshold (a statistic estimated from the first 64K elements, partials added in float16,
bands of rows normalised apart) shows, as `many_shape` shows it for inputs of a free size.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kgate.compare import bitwise_mismatch, clone_tree, flatten, index_of
from kgate.gates.base import Gate, GateResult
from kgate.gates.distributions import input_sensitivity
from kgate.gates.special_values import classify
from kgate.inputs import Case
from kgate.kernelbench import MANY_INPUT_ELEMENTS
from kgate.shrink import (
    CRASH,
    ORACLE,
    SHRINK_SECONDS,
    Finding,
    judge_probe,
    nan_finding,
    nan_lost,
    numel,
    shrink_shape,
)
from kgate.subject import (
    Baseline,
    InputsTooLarge,
    Subject,
    UserCodeError,
    input_elements,
    outputs_on,
    unless_rejected,
    within_domain,
)

MAX_GENERATED = 36  # at most MAX_PAST_8192 of them past 8192, MAX_PAST_GRID past 65535, MAX_EMPTY empty
MAX_PAST_8192 = 6
MAX_PAST_GRID = 3
MAX_EMPTY = 6
MIN_CAP = 1 << 13
CAP_FACTOR = 4
INPUT_FACTOR = 8
MIN_INPUT_CAP = 1 << 20
MIN_OUTPUT_CAP = 1 << 24  # past 8192: about what a Gram matrix holds at 4097 (4097^2), which the sweep runs
BLOCK_PLUS_ONE = 4097
ODD_SIZES = (3, 17, 131)
EMPTY = "empty"  # "empty (size 0 in dim N)"
SPLIT = "the same elements split otherwise"  # one size doubled, another halved (`edge_shapes`)
SPLITS = 2
LONG = "larger than one block"  # the generated shapes on which NaN and run probes run too (`nan_at_ends`, `runs`)
PAST_8192 = 16384  # a power of two: a multiple of every block size up to it
PAST_GRID = 65537  # past 65535, the most blocks a CUDA grid's y and z dimensions take, and past 2^16
PAST = " past "  # in the label of a shape past 8192 or 65535: its reference outputs are sized before the oracle runs
OWNED_SEED = 7919  # `_owned`: the seed offset of the second call's inputs
MANY = MANY_INPUT_ELEMENTS  # `many_shape`: inputs past this many elements (a parallel or split path above ~1M)
GRID_KEEP = 16  # past 65535 the other sizes are halved, widest first, until they hold at most this many elements
QUADRATIC = 4.0  # the most a shape's largest tensor grows per doubling of one size (attention, pairwise)
MAX_UNTIED = 8  # untied sizes (`untied_probes`): probes judged
MAX_UNTIED_TRIES = 32  # ... and tried (the reference rejects most at once: a matmul's inner sizes)
DISAGREES, DISAGREES_AT_LEAST = 1000.0, 1e-3  # `_agrees`: the reference's relative error on a probe beyond both
CLASS = "class"  # a finding's kind: an element of another class than the one the oracle and the reference agree on
RUNS = ((-math.inf, "-inf"), (math.inf, "+inf"))
CLASS_NAMES = {0: "finite", 1: "NaN", 2: "+inf", 3: "-inf"}


class OutputsTooLarge(Exception):
    """The reference's outputs on a generated shape hold more elements than the sweep's cap."""


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
    for shape in ranked[:1]:  # first, so that they run right after the declared shapes on the same instance
        splits = [(grow, halve) for grow in range(len(shape)) for halve in reversed(range(len(shape)))
                  if grow != halve and shape[halve] >= 2 and shape[halve] % 2 == 0 and shape[grow] >= 1]
        for grow, halve in splits:
            if sum(why.startswith(SPLIT) for _, why in chosen) < SPLITS:
                add(_with(_with(shape, grow, shape[grow] * 2), halve, shape[halve] // 2),
                    f"{SPLIT} (dim {grow} x2, dim {halve} /2)")
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
    # Past 8192, then past 65535, after the others (the costliest shapes: a sweep cut short by its time limit drops
    # them first), each dimension in turn across the declared shapes; within max(cap, size) elements, so the
    # shape of the long dimension alone, the others 1, always fits.
    def beyond(size: int, threshold: int, most: int, keep: int = 1) -> list[tuple[tuple[int, ...], str]]:
        found: list[tuple[tuple[int, ...], str]] = []
        for dim in range(max((len(s) for s in ranked), default=0)):
            for shape in ranked:
                if dim < len(shape):
                    big = _with(shape, dim, size)
                    while numel(big) > max(cap, size * keep) and any(s > 1 for d, s in enumerate(big) if d != dim):
                        widest = max((d for d in range(len(big)) if d != dim), key=lambda d: big[d])
                        big = _with(big, widest, (big[widest] + 1) // 2 if keep > 1 else 1)
                    if big not in seen and numel(big) <= max(cap, size * keep) and len(found) < most:
                        seen.add(big)
                        found.append((big, f"dim {dim}{PAST}{threshold} ({size})"))
        return found

    past = beyond(PAST_8192, 8192, MAX_PAST_8192) + beyond(PAST_GRID, 65535, MAX_PAST_GRID, GRID_KEEP)
    # Empty inputs last, and always: size 0 in each dimension in turn, dimension 0 first (an empty batch, then an
    # empty reduction whose result is the empty sum's or maximum's identity). A kernel that fails only there is
    # told apart from one that fails on real data (`empty_only` in the verdict's details).
    empty = list(dict.fromkeys((_with(shape, dim, 0), dim) for dim in range(max((len(s) for s in ranked), default=0))
                               for shape in ranked if dim < len(shape) and shape[dim] != 0
                               and _with(shape, dim, 0) not in seen))[:MAX_EMPTY]
    return (chosen[:MAX_GENERATED - MAX_PAST_8192 - MAX_PAST_GRID - len(empty)] + past
            + [(shape, f"{EMPTY} (size 0 in dim {dim})") for shape, dim in empty])


def _reads_outside(subject: Subject, args: tuple, reference: Any) -> bool:
    """Whether the reference's output on `args` gains a NaN when every input lies inside a buffer of NaN bytes (the
    bounds gate's guards, `guard_args`: same values, same strides): then it reads memory it was not given (torch's
    CPU scaled_dot_product_attention with values longer than the keys), its result is whatever lies there, and
    the probe is outside what it computes."""
    from kgate.gates.bounds import guard_args
    from kgate.gates.initialization import NAN_BYTE

    try:
        again = subject.run_reference(guard_args(args, NAN_BYTE, set())[0])
    except UserCodeError:
        return True
    for (_, got), (_, want) in zip(outputs_on(again), outputs_on(reference)):
        if got.shape != want.shape or (got.is_floating_point() and
                                       bool((torch.isnan(got) & ~torch.isnan(want.to(got.device))).any())):
            return True
    return False


def changed_by_next_call(run: Any, subject: Subject, case: Case, args: tuple) -> str | bool | None:
    """`run` (the kernel's or the reference's call) on `args`, its outputs kept, then on other inputs of the same
    shape (`OWNED_SEED`): the path of the first output the second call changed, False where none, None where a
    call raised (`Shapes._owned`)."""
    try:
        first = outputs_on(run(clone_tree(args)))
        kept = [t.detach().clone() for _, t in first]
        run(subject.inputs(Case(case.shape, case.dtype, case.seed + OWNED_SEED)))
    except UserCodeError:
        return None
    return next((path for (path, t), before in zip(first, kept) if bitwise_mismatch(before, t.detach()) is not None),
                False)


def many_shape(shape: tuple[int, ...], per_shape: float) -> tuple[int, ...] | None:
    """`shape` with every size the largest prime not above it and dimension 0 the smallest prime at which the
    inputs (`per_shape` elements per unit of the shape's product) pass MANY elements (a kernel that switches to a
    threaded, split or persistent path above ~1M elements, with a chunk count that need not divide them); None
    for a shape of no dimensions or none there within 2 x MANY."""
    if not shape or per_shape <= 0:
        return None
    primes = tuple(largest_prime_at_most(s) for s in shape)
    rest = numel(primes[1:]) * per_shape
    if rest <= 0:
        return None
    size = max(2, math.ceil((MANY + 1) / rest))
    while any(size % d == 0 for d in range(2, int(size ** 0.5) + 1)):
        size += 1
    if size * rest > 2 * MANY:
        return None
    return (size,) + primes[1:]


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
    summary = ("contract and oracle bound hold on declared plus generated edge shapes (1, primes, odd, 4097, 16384, "
               "65537, past 2^20 elements, empty), on sizes the inputs share, untied, and at other sizes of a "
               "KernelBench Model's weights")
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        if not takes_shape(subject):
            sized = self._model_sizes(subject, [])
            if isinstance(sized, GateResult):
                return sized
            if sized[0]:
                return self.passed(f"{sized[1]}; no shapes swept: the inputs have no free size")
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
        sizes, out_sizes = [], []
        for shape in declared:  # the declared shapes must work: factory or reference errors are errors
            for dtype in dtypes:
                case = Case(shape, dtype, seed)
                base = subject.baseline(case)
                sizes.append(input_elements(base.args))
                out_sizes.append(_elements(base.reference))
                finding = self._judge(subject, case, base, evidence)
                if finding is not None:
                    return self._fail(subject, case, "a declared shape", finding, evidence)
        sized = self._model_sizes(subject, evidence)
        if isinstance(sized, GateResult):
            return sized
        input_cap = max(INPUT_FACTOR * max(sizes), MIN_INPUT_CAP)
        output_cap = max(INPUT_FACTOR * max(out_sizes), MIN_OUTPUT_CAP)  # past 8192 only
        largest = max(declared, key=numel)
        untied = self._untied(subject, Case(largest, dtypes[0], seed), evidence)
        if isinstance(untied, GateResult):
            return untied
        generated = edge_shapes(declared, max(CAP_FACTOR * max(numel(s) for s in declared), MIN_CAP))
        per_shape = max(sizes) / max(numel(largest), 1)  # input elements per unit of a shape's product
        many = many_shape(largest, per_shape) if max(sizes) <= MANY else None
        if many is not None and many not in [g for g, _ in generated] + declared:  # before the empty shapes
            at = next((i for i, (_, why) in enumerate(generated) if why.startswith(EMPTY)), len(generated))
            generated.insert(at, (many, f"dim 0{PAST}{MANY} input elements (every size prime)"))
        many_cap = max(input_cap, 2 * MANY)
        rejected: list[str] = []
        too_big: list[str] = []
        too_big_out: list[str] = []
        oversized: list[tuple[int, ...]] = []  # shapes whose inputs were too large
        long_made: dict[int, tuple[tuple[int, ...], int]] = {}  # per dimension: its 4097 shape, `largest_made` there
        too_costly: list[str] = []
        raised_empty: list[str] = []
        # Half the gate's time limit for the generated sweep, a quarter for shrinking: a slow kernel gets
        # a shorter sweep (said in the message), not a timeout that loses the verdict.
        timeout = subject.entry.limits.timeout
        deadline = subject.deadline if subject.deadline is not None else time.monotonic() + timeout / 2
        swept = 0
        for shape, why in generated:
            if time.monotonic() > deadline:
                break
            swept += 1
            predicted = subject.predicted_input_elements(Case(shape, dtypes[0], seed))
            if predicted is None and PAST in why:  # as the declared inputs grow with their shape's product
                predicted = round(per_shape * numel(shape))
            cap = many_cap if shape == many else input_cap
            if any(_covers(shape, small) for small in oversized) or (predicted or 0) > cap:  # not even built
                too_big.append(_fmt(shape))
                continue
            if why.startswith(SPLIT):  # right after a call on the declared elements: a plan cached by their count
                try:
                    subject.run_kernel(clone_tree(subject.baseline(Case(largest, dtypes[0], seed)).args))
                except UserCodeError:
                    pass  # it ran there before; the call only sets up what the kernel keeps
            if PAST in why and _dim_of(why) in long_made:
                predicted = _predicted_made(subject, Case(shape, dtypes[0], seed), _dim_of(why),
                                            *long_made[_dim_of(why)], output_cap)
                if predicted > output_cap:
                    too_costly.append(f"{_fmt(shape)} (~{predicted:.3g} elements)")
                    continue
            for dtype in dtypes:
                case = Case(shape, dtype, seed)
                try:  # inputs past the cap are not run (the reference and the oracle neither)
                    if PAST in why:
                        base = _sized_baseline(subject, case, cap, output_cap)
                    else:
                        base = subject.baseline(case, max_elements=input_cap)
                except UserCodeError as exc:
                    rejected.append(f"{_fmt(shape)} ({exc.role} raised {type(exc.exc).__name__})")
                    break
                except InputsTooLarge:
                    too_big.append(_fmt(shape))
                    oversized.append(shape)
                    break
                except OutputsTooLarge:
                    too_big_out.append(_fmt(shape))
                    break
                finding = self._judge(subject, case, base, evidence, past=PAST in why)
                if finding is not None and finding.kind == CRASH and why.startswith(EMPTY) and \
                        not why.endswith(" 0)"):  # an empty dimension past the batch: raising states a domain
                    raised_empty.append(_fmt(shape))
                    break
                if finding is None and LONG in why and _dim_of(why) not in long_made:
                    long_made[_dim_of(why)] = (shape, largest_made(subject, base.args))
                if finding is None and LONG in why:
                    result = self._special_runs(subject, case, why, base.args, declared, evidence) or \
                        self._owned(subject, case, why, base.args)
                    if result is not None:
                        return result
                if finding is not None:
                    return self._fail(subject, case, why, finding, evidence, after=largest)
        notes = [n for n in (untied, sized[1]) if n]
        if raised_empty:
            notes.append(f"the kernel raises on {len(raised_empty)} with an empty dimension past the first, where the "
                         f"reference returns (passed over): {', '.join(raised_empty)}")
        if rejected:
            notes.append(f"skipped {len(rejected)} the reference or factory rejects: {', '.join(rejected[:6])}")
        if too_big:
            notes.append(f"skipped {len(too_big)} whose inputs are too large for the sweep: {', '.join(too_big)}")
        if too_costly:
            notes.append(f"skipped {len(too_costly)} past 8192 or 65535 whose largest tensor, grown from 4097 as from 2049 "
                         f"to 4097, would be too large for the sweep: {', '.join(too_costly)}")
        if too_big_out:
            notes.append(f"skipped {len(too_big_out)} whose reference outputs are too large for the sweep: "
                         f"{', '.join(too_big_out)}")
        if swept < len(generated):
            notes.append(f"stopped after {swept} of {len(generated)} generated shapes (half the gate's "
                         f"{timeout:g} s time limit)")
        message = (f"contract and oracle bound held on {len(declared)} declared and "
                   f"{swept - len(rejected) - len(too_big) - len(too_big_out) - len(too_costly)} generated shape(s) x "
                   f"{len(dtypes)} dtype(s)")
        return self.passed(message + ("; " + "; ".join(notes) if notes else ""), evidence=evidence,
                           details={"generated": [list(s) for s, _ in generated], "rejected": rejected,
                                    "too_large": too_big, "outputs_too_large": too_big_out,
                                    "too_costly": too_costly})

    def _model_sizes(self, subject: Subject, evidence: list) -> GateResult | tuple[int, str]:
        """Both models built again at other sizes of the weights (`Subject.model_sizes`: a KernelBench problem's
        integers that size the Model, each + 1, or halved + 1), at the first case's shape, dtype and seed: the
        kernel must give the reference's contract and stay within the oracle bound, and, where the module is
        history-dependent, over the oracle gate's sequence of calls on one state (`Oracle.state_sequence`: a tail
        of a parameter's elements whose buffer is never updated shows from the second call). Where ModelNew
        raises when built there or called there, it is passed over (a narrower domain it states). Returns the
        failure, or (sizes judged, a note for the pass message: "" for none tried)."""
        from kgate.gates.oracle import Oracle

        judged: list[str] = []
        passed_over: list[str] = []
        for size in subject.model_sizes():
            if subject.out_of_time() and (judged or passed_over):
                break
            with size.open() as other:
                if isinstance(other, str):
                    passed_over.append(f"{size.label} ({other})")
                    continue
                other.deadline = subject.deadline
                case = other.cases[0]
                try:
                    base = other.baseline(case)
                    finding = self._judge(other, case, base, evidence)
                    if finding is not None and finding.kind == CRASH:
                        passed_over.append(f"{size.label} (ModelNew raised there: {finding.message[:120]})")
                        continue
                    failed = None if finding is not None else Oracle().state_sequence(other, case, evidence)[0]
                except UserCodeError as exc:
                    if exc.role == "kernel":
                        raise
                    passed_over.append(f"{size.label} (the {exc.role} raised {type(exc.exc).__name__})")
                    continue
                where = f"with the weights sized {size.label} (kernel and reference built again there)"
                if finding is not None:
                    result = self.failed(subject, f"{where}: {finding.message}", case=case, expected=finding.expected,
                                         got=finding.got, where=finding.where, broken=finding.broken,
                                         evidence=evidence, details={**finding.details, "kind": finding.kind,
                                                                     "model_size": size.overrides})
                    result.tolerance_free = finding.tolerance_free
                    return result
                if failed is not None:
                    return self.failed(subject, f"{where}: {failed.message}", case=case, expected=failed.expected,
                                       got=failed.got, where=failed.where, broken=failed.broken, evidence=evidence,
                                       details={**failed.details, "model_size": size.overrides})
                judged.append(size.label)
        notes = [f"the weights sized {', then '.join(judged)} (both models built again) within bound"] if judged else []
        if passed_over:
            notes.append(f"passed over at {len(passed_over)} other size(s) of the weights: {'; '.join(passed_over)}")
        return len(judged), "; ".join(notes)

    def _untied(self, subject: Subject, case: Case, evidence: list) -> GateResult | str:
        """The untied-sizes probes (`untied_probes`) on the declared inputs of `case`: the first one the reference
        accepts and the kernel gets wrong (values, contract, a lost NaN) fails the gate; one the kernel raises on
        is passed over (a narrower domain it states). Returns the failure, or a note for the pass message."""
        base = subject.baseline(case)
        args, usual = base.args, None
        judged, raised, unreproducible = 0, 0, 0
        for tries, (label, probe) in enumerate(untied_probes(args)):
            if judged >= MAX_UNTIED or tries >= MAX_UNTIED_TRIES:
                break
            outputs = unless_rejected(lambda p=probe: (subject.run_reference(clone_tree(p)), subject.oracle(p)))
            if outputs is None:
                continue
            if usual is None:  # the reference's own agreement with the oracle on the factory's inputs, once
                usual = _relative_errors(base.reference, base.oracle)
            if not _agrees(*outputs, usual) or _reads_outside(subject, probe, outputs[0]):
                unreproducible += 1
                continue
            judged += 1
            finding, leaves = judge_probe(subject, probe, *outputs, layout=True)
            if finding is not None and finding.kind == CRASH:
                raised += 1
                continue
            if finding is not None:
                evidence.extend({"case": case.to_json(), "untied": label, **leaf.to_json()} for leaf in leaves)
                result = self.failed(subject, f"untied sizes at the shape {_fmt(case.shape)}: {label}: "
                                     f"{finding.message}", case=case, expected=finding.expected, got=finding.got,
                                     where=finding.where, broken=finding.broken, evidence=evidence,
                                     details={**finding.details, "kind": finding.kind, "untied": label,
                                              "empty_only": False})
                result.tolerance_free = finding.tolerance_free
                return result
        skipped = (f"; {unreproducible} passed over where the reference and its float64 evaluation disagree far "
                   "beyond their agreement on the factory's inputs, or the reference reads memory past its inputs "
                   "(inputs it does not check: torch's scaled_dot_product_attention takes values of another length "
                   "than the keys)" if unreproducible else "")
        if not judged:
            return skipped.removeprefix("; ")
        return f"{judged} untied-size probe(s) the reference accepts" + (
            f", {raised} of which the kernel raises on (passed over)" if raised else "") + skipped

    def _owned(self, subject: Subject, case: Case, why: str, args: tuple) -> GateResult | None:
        """On a shape longer than one block: one call's outputs, kept, must not change under the next call on other
        inputs of the same shape (a large path that hands its workspace out as the output: the isolation gate's
        reused-buffer probe runs at the declared shapes only). Not shrunk: it is a sequence of two calls."""
        # (a raise: it ran on these inputs before, so it is another gate's finding; the reference's own outputs
        # changed so too, or it raised: handing out memory again is then the operator's, not judged)
        path = changed_by_next_call(subject.run_kernel, subject, case, args)
        if not path or changed_by_next_call(subject.run_reference, subject, case, args) is not False:
            return None
        result = self.failed(subject, f"shape {_fmt(case.shape)} ({why}): {path} of one call changed when the kernel "
                             "was called again on other inputs of this shape (the output is memory the kernel hands "
                             "out again), where the reference's is fresh memory", case=case,
                             expected="the first call's output unchanged", got=f"{path} changed", where=path,
                             broken=True, details={"kind": "reused", "why": why})
        result.tolerance_free = True
        return result

    def _special_runs(self, subject: Subject, case: Case, why: str, args: tuple, declared: list[tuple[int, ...]],
                      evidence: list) -> GateResult | None:
        """On a shape longer than one block: the NaN probes (`nan_at_ends`), then the runs (`runs`). A finding
        counts only where the kernel handles the same probe at every declared shape (else it is the
        special_values gate's); it is not shrunk (smaller shapes are within one block)."""
        def at_declared() -> list[tuple]:
            return [subject.baseline(Case(d, case.dtype, case.seed)).args for d in declared]

        finding = nan_at_ends(subject, args)
        if finding is not None and any(nan_at_ends(subject, a) for a in at_declared()):
            finding = None
        if finding is None:
            dims = long_dims(args, BLOCK_PLUS_ONE)
            finding = runs(subject, args, dims)
            if finding is not None:
                value = [r for r in RUNS if r[1] == finding.details["value"]]
                if any(runs(subject, a, same_dims(a, args, dims), value) for a in at_declared()):
                    finding = None
        if finding is None:
            return None
        result = self.failed(subject, f"shape {_fmt(case.shape)} ({why}): {finding.message}", case=case,
                             expected=finding.expected, got=finding.got, where=finding.where, broken=True,
                             evidence=evidence,
                             details={**finding.details, "kind": finding.kind, "found_at": list(case.shape),
                                      "why": why, "empty_only": False})
        result.tolerance_free = True
        return result

    @staticmethod
    def _judge(subject: Subject, case: Case, base, evidence: list, past: bool = False) -> Finding | None:
        finding, leaves = _judged(subject, base, past)
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

    def _fail(self, subject: Subject, case: Case, why: str, finding: Finding, evidence: list,
              after: tuple[int, ...] | None = None) -> GateResult:
        found: dict[tuple[int, ...], Finding] = {case.shape: finding}
        past = PAST in why  # smaller shapes are judged as the one found: a gross miss shrinks to a gross miss

        empty_only = numel(case.shape) == 0

        def fails(shape: tuple[int, ...]) -> bool:
            if numel(shape) == 0 and not empty_only:
                return False  # a failure on real data stays one: shrinking it to no data would hide it
            probe = Case(shape, case.dtype, case.seed)
            try:
                base = subject.baseline(probe)
            except UserCodeError:
                return False  # the reference or the factory rejects this shape: not a counterexample
            result, _ = _judged(subject, base, past)
            if result is not None and result.kind == finding.kind:
                found[shape] = result
                return True
            return False

        if why.startswith(SPLIT) and after is not None:  # a finding of the call after the declared one: not shrunk
            smallest = case.shape
            why = f"{why}, right after a call at the declared {_fmt(after)}"
        else:
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


def _relative_errors(out: Any, truth: Any) -> dict[str, float]:
    """Per floating-point output of `out` (a reference's), its largest error against `truth` (its float64 oracle)
    where both are finite, relative to the oracle's largest magnitude there."""
    truths = dict(flatten(truth))
    found = {}
    for path, r in flatten(out):
        o = truths.get(path)
        if isinstance(r, torch.Tensor) and isinstance(o, torch.Tensor) and r.is_floating_point() \
                and r.shape == o.shape and r.numel():
            o64, r64 = o.detach().double(), r.detach().to(o.device).double()
            finite = torch.isfinite(o64) & torch.isfinite(r64)
            if bool(finite.any()):
                scale = float(o64[finite].abs().max())
                found[path] = float((r64 - o64)[finite].abs().max()) / scale if scale else 0.0
    return found


def _agrees(reference: Any, oracle: Any, usual: dict[str, float]) -> bool:
    """Whether the reference and its float64 oracle compute one function on a probe: each output's relative
    reference error there (`_relative_errors`) within `DISAGREES` times its error on the factory's inputs
    (`usual`) and at least `DISAGREES_AT_LEAST`. A reference that accepts inputs it does not check (torch's CPU
    scaled_dot_product_attention with values of another length than the keys: its float32 and float64 paths
    differ by the outputs' own size) is no oracle there."""
    return all(err <= max(DISAGREES * usual.get(path, 0.0), DISAGREES_AT_LEAST)
               for path, err in _relative_errors(reference, oracle).items())


def untied_probes(args: tuple) -> Iterator[tuple[str, tuple]]:
    """Inputs of other sizes than the factory ties together: a size (>= 2) that dimensions of several tensor
    arguments share is halved, by narrowing to its first half, in one argument's dimensions of that size alone
    (queries fewer than keys, a value width other than the key width), then in every argument's but one (keys
    and values fewer than queries). Within an argument all dimensions of the size change together (a square
    matrix stays square); two sizes equal by chance are then both changed, which the reference usually rejects.
    Larger sizes, and sizes more arguments share, first. Yields (label, probe): the reference decides which are
    legal (`MAX_UNTIED_TRIES`)."""
    holders: dict[int, dict[int, list[int]]] = {}  # size -> argument -> its dimensions of that size
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            for d, size in enumerate(a.shape):
                if size >= 2:
                    holders.setdefault(size, {}).setdefault(i, []).append(d)
    shared = sorted(((size, held) for size, held in holders.items() if len(held) >= 2),
                    key=lambda item: (-len(item[1]), -item[0]))
    subsets = [(size, (i,)) for size, held in shared for i in held]
    subsets += [(size, tuple(j for j in held if j != i)) for size, held in shared if len(held) >= 3 for i in held]
    for size, changed in subsets:
        probe = list(args)
        for i in changed:
            t = args[i].detach()
            for d in holders[size][i]:
                t = t.narrow(d, 0, size // 2)
            t = t.clone(memory_format=torch.contiguous_format)  # dense, and no view of the factory's tensor
            probe[i] = t.requires_grad_() if args[i].requires_grad else t
        which = ", ".join(f"argument {i} dim{'s' if len(holders[size][i]) > 1 else ''} "
                          f"{', '.join(map(str, holders[size][i]))}" for i in changed)
        yield f"size {size} halved to {size // 2} in {which} only (the other arguments' {size} kept)", tuple(probe)


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


def long_dims(args: tuple, size: int) -> dict[int, int]:
    """Per non-empty floating-point input of `args` that has a dimension of `size`, its last such dimension."""
    found = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() and size in a.shape:
            found[i] = len(a.shape) - 1 - tuple(reversed(a.shape)).index(size)
    return found


def same_dims(args: tuple, long_args: tuple, dims: dict[int, int]) -> dict[int, int]:
    """`dims` (found on `long_args`) for the inputs of `args` (another shape) that are non-empty floating-point
    tensors of the same number of dimensions."""
    return {i: d for i, d in dims.items() if i < len(args) and isinstance(a := args[i], torch.Tensor)
            and a.is_floating_point() and a.numel() and a.dim() == long_args[i].dim()}


def runs(subject: Subject, args: tuple, dims: dict[int, int], values=RUNS) -> Finding | None:
    """For each of `values` in turn (-inf, then +inf), the first half plus one of dimension `dims[i]` of every
    input i filled with it (a masked prefix, which attention and scan masks make, across the block boundaries
    in it); where the reference rejects that, each input alone (`within_domain`). The first probe on which
    the kernel gives an element a class (`class_changed`) other than the one the float64 oracle and the
    reference agree on, or None. Probes the reference rejects, and a kernel that raises on them (the
    special_values gate's business), are passed over."""
    if not dims:
        return None
    mode = subject.entry.entry.special_values_match

    def judge(inputs: tuple, _: int | None) -> tuple | None:
        outputs = unless_rejected(lambda: (subject.run_reference(clone_tree(inputs)), subject.oracle(inputs)))
        if outputs is None:
            return None
        try:
            out = subject.run_kernel(clone_tree(inputs))
        except UserCodeError as exc:
            if exc.role != "kernel":
                raise
            return (None,)
        return (class_changed(out, *outputs, mode=mode),)

    for value, name in values:
        probe = list(clone_tree(args))
        prefix = {}
        for i, d in dims.items():
            prefix[i] = (probe[i].shape[d] // 2 + 1, probe[i].shape[d], d)
            probe[i][(slice(None),) * d + (slice(0, prefix[i][0]),)] = value
        for alone, _, outcome in within_domain(args, tuple(probe), list(dims), judge, subject.conform):
            changed = outcome[0] if outcome is not None else None
            if changed is None:
                continue
            path, index, got, expected, count = changed
            which = sorted(dims) if alone is None else [alone]
            filled = ", ".join(f"{prefix[i][0]} of {prefix[i][1]} along dim {prefix[i][2]} of argument {i}"
                               for i in which)
            where = f"{path}{list(index)}"
            return Finding(CLASS, f"{where}: with {name} filling the first {filled} (a masked prefix), the float64 "
                           f"oracle and the reference give {expected}, the kernel {got!r} ({count} element(s) of "
                           f"another class where both agree)", where=where,
                           expected=f"{expected} (float64 oracle and reference)", got=repr(got),
                           details={"value": name, "arguments": which})
    return None


def class_changed(out: Any, reference: Any, oracle: Any, mode: str = "exact"
                  ) -> tuple[str, tuple[int, ...], float, str, int] | None:
    """The first floating-point output element whose class (NaN, +inf, -inf, finite) differs from the one the
    float64 oracle and the reference (in the kernel's dtype) agree on: (path, index, the kernel's value, the
    class, how many such elements), or None. Elements on whose class the two disagree (an overflow of the dtype
    alone, an inf - inf that one order makes NaN) are not judged. `mode` is the manifest's
    `special_values_match`: `nonfinite` counts NaN and +-inf as one class; `spread` as well, and a kernel
    may also give a non-finite value where the two agree on finite (a tile poisoned by 0 * inf)."""
    refs, truths = dict(flatten(reference)), dict(flatten(oracle))
    for path, got in flatten(out):
        want, truth = refs.get(path), truths.get(path)
        if not all(isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) for t in (got, want, truth)) \
                or not got.shape == want.shape == truth.shape or got.numel() == 0:
            continue
        expected = classify(truth.detach().to(got.device))
        agreed = expected == classify(want.detach().to(got.device))
        actual = classify(got.detach())
        if mode != "exact":
            expected, actual = expected.clamp(max=1), actual.clamp(max=1)
        differs = agreed & (expected != actual)
        if mode == "spread":
            differs &= ~((expected == 0) & (actual != 0))
        if bool(differs.any()):
            flat = int(differs.reshape(-1).nonzero()[0])
            cls = int(expected.reshape(-1)[flat])
            name = CLASS_NAMES[cls] if mode == "exact" else ("finite", "non-finite")[cls]
            value = got.detach().reshape(-1)[flat]
            return (path, index_of(flat, tuple(got.shape)), complex(value) if value.is_complex() else float(value),
                    name, int(differs.sum()))
    return None


def _judged(subject: Subject, base: Baseline, past: bool) -> tuple[Finding | None, list]:
    """`judge_probe` on a baseline, with the layout. `past` (a shape past 8192): an oracle miss counts only where
    it is broken (beyond BROKEN_FACTOR bounds) with the input sensitivity as the least reference error (the
    distributions gate's `input_sensitivity`): a sum of 16384 float32 terms in another order than the
    reference's wider accumulation misses the bound by a few times, a path that drops or clips data by far."""
    finding, leaves = judge_probe(subject, base.args, base.reference, base.oracle, layout=True)
    if past and finding is not None and finding.kind == ORACLE:
        finding, leaves = judge_probe(subject, base.args, base.reference, base.oracle,
                                      sensitivity=input_sensitivity(subject, base.args, base.oracle), layout=True)
        if finding is not None and finding.kind == ORACLE and not finding.broken:
            finding = None
    return finding, leaves


class _LargestMade(TorchDispatchMode):
    """While active, the most elements a tensor result of any op holds in its storage (a view of an input counts
    as that input; an expanded view as what it is a view of)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as kgate.gates.initialization.AllocationHook: no import of torch._dynamo

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta:
                try:
                    self.largest = max(self.largest, t.untyped_storage().nbytes() // max(t.element_size(), 1))
                except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage
                    pass
        return out


def largest_made(subject: Subject, args: tuple) -> int:
    """The most elements a tensor that one call of the reference, then one of the kernel, on `args` made held: what
    a shape's work grows with (an attention's scores, a pairwise matrix). 0 where either raises."""
    recorder = _LargestMade()
    try:
        with recorder:
            subject.run_reference(clone_tree(args))
            subject.run_kernel(clone_tree(args))
    except UserCodeError:
        return 0
    return recorder.largest


def _predicted_made(subject: Subject, case: Case, dim: int, long_shape: tuple[int, ...], made: int,
                    cap: int) -> float:
    """The largest tensor the reference or the kernel would make at `case` (a shape past 8192 or 65535 in `dim`),
    from `made` at `long_shape` (its 4097 shape): grown per doubling of the size by the growth from 2049 to 4097
    (2 for a linear cost, `QUADRATIC` for a quadratic one, at most that), times the ratio of the other dimensions'
    sizes. The shape of 2049 is run only where a quadratic growth would pass `cap` (where it raises, the growth
    is taken as quadratic)."""
    others = (numel(case.shape) / case.shape[dim]) / max(numel(long_shape) / long_shape[dim], 1)
    doublings = math.log2(case.shape[dim] / long_shape[dim])
    if made * QUADRATIC ** doublings * others <= cap:
        return made * QUADRATIC ** doublings * others
    half = Case(_with(long_shape, dim, BLOCK_PLUS_ONE // 2 + 1), case.dtype, case.seed)
    try:
        smaller = largest_made(subject, subject.inputs(half))
    except UserCodeError:
        smaller = 0
    growth = made / smaller if smaller else QUADRATIC
    return made * min(growth, QUADRATIC) ** doublings * others


def _dim_of(why: str) -> int:
    """The dimension a 4097 or past-8192 shape was made long in (its `why` begins "dim N")."""
    return int(why.split()[1])


def _covers(shape: tuple[int, ...], small: tuple[int, ...]) -> bool:
    """Whether `shape` is at least `small` in every dimension (its inputs, then, at least as large)."""
    return len(shape) == len(small) and all(a >= b for a, b in zip(shape, small))


def _elements(obj: Any) -> int:
    return sum(t.numel() for _, t in flatten(obj) if isinstance(t, torch.Tensor))


def _sized_baseline(subject: Subject, case: Case, input_cap: int, output_cap: int) -> Baseline:
    """`Subject.baseline` for a shape past 8192 (not cached), whose reference outputs are counted before the
    float64 oracle runs: an output quadratic in the long dimension (a Gram matrix, pairwise distances) holds
    16384^2 elements there."""
    args = subject.inputs(case)
    if (held := input_elements(args)) > input_cap:
        raise InputsTooLarge(held)
    reference = subject.run_reference(clone_tree(args))
    if _elements(reference) > output_cap:
        raise OutputsTooLarge()
    return Baseline(args, reference, subject.oracle(args))


def _fmt(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "default"
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


GATE = Shapes
