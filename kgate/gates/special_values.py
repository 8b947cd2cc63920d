"""special_values: where the oracle gives NaN/+Inf/-Inf the kernel gives the same, and it is finite
where the oracle is finite. Probes: a NaN, a +Inf and a -Inf injected, one at a time, into each
floating-point input at several positions (`positions`: its last element, its first, its centre, the
second and the second-to-last along every dimension and `RANDOM_POSITIONS` seeded ones), and all inputs scaled
to overflow-prone magnitudes. The last, first and centre elements are at the end, start and middle of their row
along every dimension, so a kernel that mishandles special values in one part of a reduction (a `nansum` over a
row's tail, a clamp on its first block) meets one there, whichever dimension it reduces; the edges' neighbours
are what an interpolation weights by 0 at the edge (0 x Inf is NaN), which a kernel that replicates the edge
never reads. Each probe holds a single special
value: two in one reduction would let one hide the other's mishandling. Tolerance-free: only the
class of each element (NaN, +Inf, -Inf, finite) is compared, against the oracle rounded to the
output's dtype; an integer or boolean output (an argmax, a mask) must equal the oracle's, or another
evaluation of the reference's (`SpecialValues.integer_output`).

The same value at the same position of every floating-point input of one shape at once, at the last and the
first element (`SpecialValues.joint`): a pairwise formula right for one infinite operand and wrong for two (a
log-add-exp `hi + log1p(exp(lo - hi))` whose -inf - -inf is NaN where the result is -inf) meets them only together.

Whole lines of special values too, one probe each: NaN, +Inf and -Inf filling the line through an input's
last element along each of its dimensions (a row that is all NaN, whichever dimension a kernel reduces: a guard
that writes 0 for an "empty" row shows only there; a column all -Inf, which a segment maximum initialised to
-Inf takes for an empty segment), NaN filling the whole input, and NaN filling lines the reference does not
read (`unread_lines`: where its gradient is exactly 0, the padding rows a loss's ignore_index leaves out; a
kernel that multiplies them by a zero weight makes its output NaN).

Subnormal semantics, tolerance-free: all inputs scaled to subnormal magnitudes (peak half the smallest
normal) and so that their products are subnormal (peak 0.9 x sqrt(smallest normal)). Where the oracle,
rounded to the output's dtype, is clearly subnormal (at least `CLEARLY_SUBNORMAL` of the smallest normal,
above what another summation order's rounding can move to zero), the kernel may not flush to zero a
result the reference keeps (FTZ/DAZ builds), nor keep one the reference flushes: element by element on
subnormal inputs; on the products probe only where it does so to every such output (a chained product
whose intermediate underflows in the kernel's order loses some subnormal results without any flush). A 0
counts as a flush only where the inputs determine the result to within its own magnitude: where moving every
input by an ulp of its dtype (SENSITIVITY_DRAWS seeded sign draws, the largest move per element:
`distributions.oracle_moves`) moves the oracle by at least |oracle|, a 0 is the rounding of a computation in the
dtype (a float16 sum whose running sums are a thousand times its result), in the reference or the kernel alike.
Where the kernel runs on another device than the CPU, a reference's 0 is its flush only where the same reference
in the same dtype on the CPU gives 0 too (`Subject.reference_on_cpu`): torch's CUDA bfloat16 cumsum gives 0
where its CPU path keeps the subnormal sum of subnormal inputs, and CUDA's float atomics (index_add_) flush what
they add: a device's path, not the op's semantics. Nor is
it one where the reference on its bfloat16 inputs widened to float32 keeps the subnormal
(`Subject.reference_widened`): both dtypes have the same smallest normal, so a flush gives 0 in both, and a 0 of
the bfloat16 evaluation alone is an intermediate rounded below bfloat16's smallest subnormal (Llama's RMSNorm
reference computes `weight * y` in bfloat16; its backward loses what Liger's kernel keeps). Nor is it one where
the reference keeps clearly subnormal results of the same output on the same probe: FTZ zeroes every subnormal
result of the operation that makes it, so such a reference's 0s are the rounding of an intermediate (the same
reference in float16 rounds `dy * weight` in float16's subnormal range, 117 zeros beside 88,733 kept subnormals).

Pruned weights: an nn.Module kernel's weights that the reference holds equal (two or more dimensions) get the
first half of their rows zeroed alike in both, and NaN and +Inf are injected at each input's first and second
elements (`SpecialValues.pruned`): a kernel that skips blocks whose weights are all 0 (a pruned group, an idle
expert) gives finite outputs where the reference's 0 x Inf is NaN.

The probes run in rounds: first, for every case, the last element of each input, the overflow probe and
the two subnormal probes; then the whole lines and the other positions. A spent search budget (`Subject.out_of_time`) ends the later rounds
only, and the pass message names the probe it stopped before.

`special_values_match` relaxes the comparison for kernels that need it:

- `nonfinite`: only finite vs non-finite must match (sums legitimately re-associated, as in chunked
  scans and split reductions, where inf - inf order decides between NaN and Inf);
- `spread`: as `nonfinite` where the oracle is non-finite (the kernel must be non-finite there too),
  but on a probe that injects a NaN/Inf into an input, outputs the oracle keeps finite may be
  non-finite as well: a tiled or chunked kernel multiplies masked-out zeros by the injected value
  (0 * NaN = NaN), so the poison reaches more of its tile than in the oracle. Those outputs are
  counted in the pass message and `details["spread"]`. On the overflow probe (no non-finite input)
  finite vs non-finite must match both ways, as in `nonfinite`.

Inputs whose zeros the domain declares (`Subject.structural_zeros`: a KernelBench problem's triangular or
diagonal matrices) may have those zeros skipped by the kernel rather than multiplied: where the oracle's
NaN/Inf reaches an output only through such a product (the oracle there is the same, and finite, with 0
and with 1 in place of the injected value), a finite output is allowed and counted.

The oracle runs on the kernel's device. Where the kernel's class differs from it there and that device is not
the CPU, the oracle is evaluated on the CPU as well (`Subject.oracle_on_cpu`), and an element whose kernel class
matches either evaluation passes, counted in the pass message and `details["devices"]`: the reference's own
special-value semantics may differ by device (torch's CUDA rms_norm spreads one Inf input to a NaN row through
its Welford statistics, its CPU path and the formula give 0 at the finite elements). A class that no evaluation
of the reference gives (a NaN dropped where both give NaN) still fails.

Where a class still differs, the reference itself is run in the kernel's dtype on the same probe, and an
element whose kernel class matches it passes, counted in the pass message and `details["rounded"]`: the dtype
rounds away what the float64 oracle keeps (sigmoid's saved output rounds to 1.0 in bfloat16, its derivative
to 0, so an Inf cotangent gives NaN in torch's own op where the oracle gives Inf). A kernel whose class
neither the oracle nor its own reference in its dtype gives (a NaN dropped, an overflow the reference does
not make) still fails.

A probe the reference (or the float64 oracle) rejects by raising, outside its declared domain, is
skipped and listed in the pass message; the overflow probe is then retried one input at a time. If
the reference rejects every probe the gate is skipped. A kernel that raises on a probe the reference
accepts is not skipped: its exception propagates (the verdict `error`, naming the kernel)."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kgate.compare import clone_tree, flatten, index_of, structure
from kgate.gates.base import Gate, GateResult
from kgate.gates.distributions import oracle_moves
from kgate.inputs import Case
from kgate.oracle import BROKEN_FACTOR, measure, reference_gradients
from kgate.subject import ModuleState, Subject, rejected_note, unless_rejected, within_domain

_NAMES = {0: "finite", 1: "NaN", 2: "+Inf", 3: "-Inf"}
_NONFINITE_NAMES = {0: "finite", 1: "non-finite"}
_INJECTED = ((math.nan, "NaN"), (math.inf, "+Inf"), (-math.inf, "-Inf"))
OVERFLOW = "inputs scaled to overflow-prone magnitudes"
SUBNORMAL = "inputs scaled to subnormal magnitudes"
UNDERFLOW = "inputs scaled so that their products are subnormal"
# Where the oracle's magnitude is at least this share of the smallest normal, a result is clearly subnormal: a
# rounding of another summation order cannot make it zero, a flush to zero (FTZ/DAZ) does.
CLEARLY_SUBNORMAL = 1 / 16
# Sign draws of the inputs' one-ulp move that tells a reference's rounding 0 from a flush (`subnormals`).
SENSITIVITY_DRAWS = 4
# Seeded positions injected beside the last, first and centre elements (rows or tiles other than those).
RANDOM_POSITIONS = 2
# Rounds whose position also gets one value in every input of a shape at once (`SpecialValues.joint`): the last
# element's (the first round) and the first element's.
JOINT_ROUNDS = 2
UNREAD_LINES = 2  # lines the reference does not read (its gradient there exactly 0), NaN-filled, per input


def _shown(index: tuple) -> str:
    """An injection site as a label shows it: [3, :] for row 3's whole line."""
    return "[" + ", ".join(":" if isinstance(k, slice) else str(k) for k in index) + "]"


def unread_lines(subject: Subject, args: tuple, floats: list[int], seed: int) -> list[tuple[int, tuple]]:
    """Up to UNREAD_LINES lines along the last dimension of each floating-point input (other than its last line,
    which `SpecialValues.lines` fills anyway) where the reference's gradient is exactly 0 throughout: the rows of
    the padding tokens a loss's ignore_index or a mask leaves out, the keys a mask hides, the table rows a gather
    never selects. A NaN there must stay out of the outputs the reference keeps finite: a kernel that multiplies
    the rows it should skip by a zero weight, or adds -inf to them, makes it NaN. Found by one backward pass of
    the reference on the case's inputs, with seeded random weights on its finite outputs; none where the
    reference has no gradient (integer outputs, a non-differentiable operation, a reference that raises)."""
    if not floats:
        return []
    leaves = list(clone_tree(args))
    for i in floats:
        leaves[i] = leaves[i].detach().clone().requires_grad_(True)
    try:
        with torch.enable_grad(), reference_gradients():
            out = subject.run_reference(tuple(leaves), grad=True)
            gen = torch.Generator().manual_seed(seed)
            total = None
            for _, o in flatten(out):
                if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point() and o.numel():
                    w = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)
                    term = torch.where(torch.isfinite(o), o.double() * w, torch.zeros_like(w)).sum()
                    total = term if total is None else total + term
            if total is None:
                return []
            grads = torch.autograd.grad(total, [leaves[i] for i in floats], allow_unused=True)
    except Exception:  # noqa: BLE001 - no gradient to read (a non-differentiable reference, or one that raises)
        return []
    pick = torch.Generator().manual_seed(seed + 1)
    found: list[tuple[int, tuple]] = []
    for i, g in zip(floats, grads):
        shape = tuple(args[i].shape)
        if g is None or len(shape) < 2 or shape[-1] < 1:
            continue  # an input the reference does not use at all: "all of it" is probed anyway
        rows = (g.detach() == 0).reshape(-1, shape[-1]).all(dim=1).cpu()
        rows[-1] = False  # the last line is filled anyway
        zero = torch.nonzero(rows).flatten()
        if zero.numel() == 0:
            continue
        chosen = zero[torch.randperm(zero.numel(), generator=pick)[:UNREAD_LINES]]
        for row in sorted(int(r) for r in chosen):
            index = index_of(row, shape[:-1])
            found.append((i, index + (slice(None),)))
    return found


def classify(t: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf (complex: by the worse of the two parts)."""
    if t.is_complex():
        t = torch.view_as_real(t)
        return torch.maximum(classify(t[..., 0]), classify(t[..., 1]))
    cls = torch.zeros(t.shape, dtype=torch.uint8, device=t.device)
    if not t.is_floating_point():
        return cls
    cls[torch.isnan(t)] = 1
    cls[t == math.inf] = 2
    cls[t == -math.inf] = 3
    return cls


def overflow_scale(dtype: torch.dtype) -> float:
    """A magnitude at which careless exp/square/sum overflow but sound formulations do not."""
    return min(1e4, math.sqrt(torch.finfo(dtype).max) / 4)


def positions(shape: tuple[int, ...], gen: torch.Generator) -> list[tuple[str, tuple[int, ...]]]:
    """Where special values are injected into a tensor of `shape` (numel > 0), as (name, index): the last
    element (the end of its row along every dimension: a reduction's tail, the last tile), the first (the
    start along every dimension), the centre (the middle along every dimension; with an even size the
    first element of the second half), the second and the second-to-last along every dimension (an edge's
    neighbour: a stencil or an interpolation that replicates the edge instead of weighting its neighbour by 0
    never reads it, where 0 x Inf is NaN) and RANDOM_POSITIONS drawn from `gen`; repeats dropped."""
    named = [("last element", tuple(n - 1 for n in shape)), ("first element", tuple(0 for _ in shape)),
             ("centre", tuple(n // 2 for n in shape)),
             ("second element along every dimension", tuple(min(1, n - 1) for n in shape)),
             ("second-to-last element along every dimension", tuple(max(n - 2, 0) for n in shape))]
    numel = math.prod(shape)
    named += [("seeded position", index_of(int(torch.randint(numel, (1,), generator=gen)), shape))
              for _ in range(RANDOM_POSITIONS)]
    chosen: dict[tuple[int, ...], str] = {}
    for name, index in named:
        chosen.setdefault(index, name)
    return [(name, index) for index, name in chosen.items()]


class SpecialValues(Gate):
    name = "special_values"
    summary = "NaN/+Inf/-Inf exactly where the float64 oracle has them, finite elsewhere"
    tolerance_free = True

    @staticmethod
    def floats(args: tuple) -> list[int]:
        return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                and a.numel() > 0]

    def probes(self, args: tuple, seed: int, *, later: bool = False, unread: list[tuple[int, tuple]] = (),
               structured: bool = False) -> Iterator[tuple[str, tuple, str | None, tuple | None]]:
        """(label, inputs, the injected value's name or None for the overflow probe, where it was
        injected: (argument, index) or None). The first round (`later` False): NaN, +Inf and -Inf at each
        input's last element, then the overflow probe; the later rounds (`later` True): the same at the
        input's other `positions`, one position of every input per round."""
        gen = torch.Generator().manual_seed(seed)
        floats = self.floats(args)
        sites = {i: positions(tuple(args[i].shape), gen) for i in floats}
        rounds = range(1, max((len(s) for s in sites.values()), default=0)) if later else range(1)
        if later:
            yield from self.lines(args, floats, structured)
            for i, index in unread:
                probe = clone_tree(args)
                probe[i][index] = math.nan
                shown = _shown(index)
                yield (f"NaN filling argument {i} at {shown} (a line the reference does not read: its gradient 0)",
                       probe, "NaN", (i, index))
        for r in rounds:
            for i in floats:
                if r >= len(sites[i]):
                    continue
                name, index = sites[i][r]
                for value, label in _INJECTED:
                    probe = clone_tree(args)
                    probe[i][index] = value
                    yield f"{label} injected into argument {i} at {list(index)} ({name})", probe, label, (i, index)
            if r < JOINT_ROUNDS:
                yield from self.joint(args, floats, sites, r)
        if floats and not later:
            probe = clone_tree(args)
            for i in floats:
                t = probe[i]
                peak = t.abs().max()
                if peak > 0:
                    probe[i].copy_(t / peak * overflow_scale(t.dtype))
            yield OVERFLOW, probe, None, None
            for label, peak in ((SUBNORMAL, lambda d: torch.finfo(d).tiny / 2),
                                (UNDERFLOW, lambda d: math.sqrt(torch.finfo(d).tiny) * 0.9)):
                probe = clone_tree(args)
                for i in floats:
                    t = probe[i]
                    top = t.abs().max()
                    if top > 0:
                        probe[i].copy_(t.double() / float(top) * peak(t.dtype))
                yield label, probe, None, None

    @staticmethod
    def joint(args: tuple, floats: list[int], sites: dict[int, list], r: int
              ) -> Iterator[tuple[str, tuple, str | None, tuple | None]]:
        """The same special value at the same position of every floating-point input of one shape at once (the
        position of round `r` of the first of them): a pairwise formula that is right for one infinite operand
        and wrong for two (log-add-exp's `hi + log1p(exp(lo - hi))`, -inf - -inf = NaN where the result is
        -inf; a difference of two +inf) meets them only together."""
        groups: dict[tuple, list[int]] = {}
        for i in floats:
            groups.setdefault(tuple(args[i].shape), []).append(i)
        for members in groups.values():
            if len(members) < 2 or r >= len(sites[members[0]]):
                continue
            name, index = sites[members[0]][r]
            for value, label in _INJECTED:
                probe = clone_tree(args)
                for i in members:
                    probe[i][index] = value
                shown = ", ".join(map(str, members))
                yield (f"{label} injected into arguments {shown} at once, each at {list(index)} ({name})", probe,
                       label, None)

    def pruned(self, subject: Subject, spread: list, structural: list, devices: list,
               rounded: list) -> tuple[GateResult | None, int]:
        """An nn.Module kernel's weights (parameters of two or more dimensions that the reference holds equal,
        isolation's `ParameterClass`) with the first half of their rows zeroed alike in kernel and reference (a
        pruned layer, a group or an expert whose weights are all 0), then NaN and +Inf injected at each input's
        first element and the second along every dimension (`PRUNED_POSITIONS`), in the first case: a kernel
        that skips the zero blocks (a block-sparse or pruned-group fast path) gives finite outputs where the
        reference's 0 x Inf is NaN. Everything put back after. Returns (a failure or None, the probes judged)."""
        from kgate.gates.isolation import parameter_classes  # (isolation imports this gate's neighbours)

        modules = subject.modules()
        cases = subject.first_seed_cases()
        if modules is None or not cases or subject.out_of_time():
            return None, 0
        try:
            classes = [c for c in parameter_classes(*modules) if c.kind == "parameter"
                       and c.reference[0][1].dim() >= 2 and c.reference[0][1].shape[0] >= 2]
        except Exception:  # noqa: BLE001 - a module's own state_dict hooks may raise: not probed
            return None, 0
        if not classes:
            return None, 0
        case = cases[0]
        base = subject.baseline(case)
        state = ModuleState(subject, modules)
        judged = 0
        try:
            with torch.no_grad():
                for c in classes:
                    for t in c.tensors():
                        t[: t.shape[0] // 2] = 0
            subject.changed_state()
            args = clone_tree(base.args)
            if not self._follows(subject, args):
                return None, 0  # wrong already on finite inputs: a cache of the old weights (isolation's finding)
            for i in self.floats(args):
                shape = tuple(args[i].shape)
                for name, index in (("first element", (0,) * len(shape)),
                                    ("second element along every dimension", tuple(min(1, n - 1) for n in shape))):
                    for value, label in _INJECTED[:2]:
                        probe = clone_tree(args)
                        probe[i][index] = value
                        oracle = unless_rejected(lambda probe=probe: subject.oracle(probe))
                        if oracle is None:
                            continue
                        judged += 1
                        where = (f"{label} injected into argument {i} at {list(index)} ({name}), with the first half "
                                 "of the rows of every weight zeroed alike in kernel and reference (pruned)")
                        result = self.judge(subject, case, where, probe, oracle, label, spread=spread,
                                            structural=structural, devices=devices, rounded=rounded)
                        if result is not None:
                            return result, judged
        finally:
            state.close()
        return None, judged

    @staticmethod
    def _follows(subject: Subject, args: tuple) -> bool:
        """Whether the kernel, on `args` as they are (no special value), is within the oracle bound of the
        modules' weights as they are now."""
        from kgate.gates.oracle import Incomparable, measure_outputs

        outputs = unless_rejected(lambda: (subject.run_reference(clone_tree(args)), subject.oracle(args)))
        if outputs is None:
            return False
        leaves = measure_outputs(subject.run_kernel(clone_tree(args)), *outputs, subject.tolerance)
        return not isinstance(leaves, Incomparable) and all(leaf.passed for leaf in leaves)

    @staticmethod
    def lines(args: tuple, floats: list[int], structured: bool = False) -> Iterator[tuple[str, tuple, str, tuple]]:
        """Special values filling a whole line of each input: NaN, +Inf and -Inf along each dimension, the line
        through its last element (a row whose every value is NaN, or -Inf: a reduction that treats it as empty,
        or a max that takes -Inf for "nothing seen", whichever dimension it reduces); NaN in the whole input.
        Fewer than every value on every line: an interpreted kernel pays seconds a probe. With `structured`
        inputs (declared zeros: a triangular matrix) +-Inf fills the last dimension's line only: across the others
        it meets the declared zeros of the other operand, whose 0 x Inf a kernel that skips them never forms."""
        for i in floats:
            shape = tuple(args[i].shape)
            lines = [(f"the whole line along dimension {d} through the last element",
                      tuple(slice(None) if k == d else n - 1 for k, n in enumerate(shape)),
                      _INJECTED if d == len(shape) - 1 or not structured else _INJECTED[:1])
                     for d in range(len(shape)) if shape[d] > 1]
            lines.append(("all of it", tuple(slice(None) for _ in shape), _INJECTED[:1]))
            for where, index, values in lines:
                shown = _shown(index)
                for value, label in values:
                    probe = clone_tree(args)
                    probe[i][index] = value
                    yield f"{label} filling argument {i} at {shown} ({where})", probe, label, (i, index)

    def check(self, subject: Subject) -> GateResult:
        tried, rejected = 0, []
        spread: list[dict] = []
        structural: list[dict] = []
        devices: list[dict] = []
        rounded: list[dict] = []
        cut = None  # the probe a spent search budget stopped the later rounds before
        for case, later in [(c, later) for later in (False, True) for c in subject.first_seed_cases()]:
            if cut is not None:
                break
            base = subject.baseline(case)
            floats = self.floats(base.args)
            skippable = subject.structural_zeros(base.args)
            unread = unread_lines(subject, base.args, floats, case.seed) if later else []
            for label, probe, injected, site in self.probes(base.args, case.seed, later=later, unread=unread,
                                                            structured=skippable):
                if later and subject.out_of_time():
                    cut = f"{label} ({case.label()})"
                    break
                # The injection probes change one argument; the overflow probe all of them, and where the
                # reference rejects that it is retried one argument at a time.
                arguments = floats if injected is None else []
                for argument, inputs, oracle in within_domain(
                        base.args, probe, arguments, lambda p, _: unless_rejected(lambda: subject.oracle(p)),
                        subject.conform):
                    where = label if argument is None else f"argument {argument} scaled to overflow-prone magnitudes"
                    if oracle is None:
                        rejected.append(f"{where} ({case.label()})")
                        continue
                    tried += 1
                    # the declared-zero masks cost two more oracle calls: made only if a class differs
                    skipped = functools.cache(functools.partial(self.skipped_zeros, subject, inputs, oracle, site)) \
                        if skippable and site else None
                    reference = None
                    if label in (SUBNORMAL, UNDERFLOW):
                        reference = unless_rejected(lambda inputs=inputs: subject.run_reference(clone_tree(inputs)))
                    result = self.judge(subject, case, where, inputs, oracle, injected, spread, skipped, structural,
                                        reference, devices, rounded)
                    if result is not None:
                        return result
        if cut is None and tried:
            result, pruned = self.pruned(subject, spread, structural, devices, rounded)
            if result is not None:
                return result
            tried += pruned
        stopped = (f"; the search budget (kgate.worker.SEARCH_SHARE of the gate's time limit) ran out before the probe "
                   f"{cut}: not every position was tried") if cut is not None else ""
        if tried == 0:
            if rejected:
                return self.skipped(f"the reference rejects every probe ({len(rejected)}: "
                                    f"{', '.join(rejected[:4])}{' ...' if len(rejected) > 4 else ''}): nothing to "
                                    f"judge{stopped}")
            return self.skipped("no floating-point inputs to inject special values into")
        message = (f"NaN/Inf pattern matched the oracle in {tried} probe(s) (NaN, +Inf and -Inf at the last, first, "
                   f"centre, second and second-to-last elements and {RANDOM_POSITIONS} seeded positions of each floating-point input and "
                   f"filling its last line along each dimension, NaN filling all of it and lines the reference does not read; inputs "
                   f"scaled to overflow-prone "
                   f"magnitudes); subnormal results kept where the reference keeps them (inputs scaled to subnormal "
                   f"magnitudes and to products in the subnormal range)")
        message += stopped
        details: dict = {"cut": cut} if cut is not None else {}
        if spread:
            by_value: Counter = Counter()
            for s in spread:
                by_value[s["injected"]] += s["outputs"]
            spreads = ", ".join(f"{v} to {n}" for v, n in by_value.items())
            message += (f"; {spreads.replace(' to ', ' spread to ', 1)} output(s) the oracle keeps finite "
                        f"(after {len({(s['probe'], str(s['case'])) for s in spread})} injection probe(s)), allowed by "
                        f"special_values_match: spread")
            details["spread"] = spread
        if structural:
            message += (f"; {sum(s['outputs'] for s in structural)} output(s) finite where the oracle's NaN/Inf "
                        f"comes only from a declared zero of a structured input (0 x NaN: a kernel may skip "
                        f"those zeros)")
            details["structural"] = structural
        if devices:
            message += (f"; {sum(d['outputs'] for d in devices)} output(s) of the class the reference gives on the "
                        f"CPU where its float64 evaluation on {devices[0]['device']} gives another (after "
                        f"{len({(d['probe'], str(d['case'])) for d in devices})} probe(s)): the reference's own "
                        f"special-value semantics differ by device, and either is allowed")
            details["devices"] = devices
        if rounded:
            message += (f"; {sum(r['outputs'] for r in rounded)} output(s) of the class the reference itself gives in "
                        f"the kernel's dtype where the float64 oracle gives another (after "
                        f"{len({(r['probe'], str(r['case'])) for r in rounded})} probe(s)): the dtype rounds away "
                        f"what the oracle keeps, and the kernel computes as its reference does")
            details["rounded"] = rounded
        return self.passed(message + rejected_note(rejected), details=details)

    @staticmethod
    def skipped_zeros(subject: Subject, probe: tuple, oracle, site: tuple) -> dict | None:
        """Per output path, where the oracle's value does not depend on the injected element at all:
        equal (and finite) with 0 and with 1 put there instead. Where the oracle is nevertheless
        NaN/Inf there, the injected value reached it only through products with zeros: with inputs
        whose zeros the domain declares (triangular, diagonal matrices), a kernel may skip those
        products. None when the reference rejects the finite variants."""
        i, index = site
        outs = []
        for value in (0.0, 1.0):
            variant = clone_tree(probe)
            variant[i][index] = value
            out = unless_rejected(lambda v=variant: subject.oracle(v))
            if out is None:
                return None
            outs.append(dict(flatten(out)))
        masks = {}
        for path, want in flatten(oracle):
            a, b = outs[0].get(path), outs[1].get(path)
            if isinstance(want, torch.Tensor) and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
                    and a.shape == b.shape == want.shape and (a.is_floating_point() or a.is_complex()):
                masks[path] = (a == b) & torch.isfinite(a)
        return masks

    def judge(self, subject: Subject, case: Case, label: str, probe: tuple, oracle, injected: str | None = None,
              spread: list | None = None, skipped: Callable[[], dict | None] | None = None,
              structural: list | None = None, reference=None, devices: list | None = None,
              rounded: list | None = None) -> GateResult | None:
        """A failure, or None. Under `spread`, outputs that only the injected value made non-finite are
        appended to `spread` ({"probe", "injected", "path", "outputs"}). `skipped` (`skipped_zeros`, called
        only where some class differs) names the outputs the injected value reaches only through declared
        zeros: finite is allowed there, and counted in `structural`. Where a class still differs and the
        oracle runs on another device than the CPU, the oracle on the CPU is asked too (`Subject.oracle_on_cpu`):
        a class that either evaluation of the reference gives is allowed, and counted in `devices`. Where one
        still differs, a class the reference itself gives in the kernel's dtype is allowed too, and counted in
        `rounded`: the float64 oracle keeps a value the dtype rounds away (a derivative that rounds to 0, so an
        Inf cotangent gives NaN), and the kernel computes as its reference does."""
        mode = subject.entry.entry.special_values_match
        on_cpu = functools.cache(lambda: subject.oracle_on_cpu(clone_tree(probe)))
        # the reference run in the kernel's dtype, asked only where a class still differs
        in_dtype = functools.cache(lambda: reference if reference is not None else unless_rejected(
            lambda: subject.run_reference(clone_tree(probe))))
        # asked only for a subnormal finding
        moves = functools.cache(lambda: oracle_moves(subject, probe, oracle, draws=SENSITIVITY_DRAWS))

        def by_path(evaluate: Callable[[tuple], Any]) -> Callable[[], dict]:
            """Another evaluation of the reference on the probe, by output path, made once when first asked."""
            @functools.cache
            def outputs() -> dict:
                out = evaluate(clone_tree(probe))
                return dict(flatten(out)) if out is not None else {}
            return outputs

        # the reference in the dtype on the host; on bfloat16 inputs widened to float32
        cpu_reference, widened_reference = by_path(subject.reference_on_cpu), by_path(subject.reference_widened)

        out = subject.run_kernel(clone_tree(probe))
        if structure(out) != structure(oracle):
            return self.failed(subject, f"output structure differs from the reference's ({label})", case=case,
                               expected=structure(oracle), got=structure(out))
        oracles = dict(flatten(oracle))
        references = dict(flatten(reference)) if reference is not None else {}
        found: list[dict] = []
        for path, got in flatten(out):
            want = oracles[path]
            if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
                continue
            if got.shape != want.shape:
                continue
            # other evaluations of the reference, each with the list its agreements are counted in
            others = ((devices, on_cpu, {"device": str(subject.oracle_device)}),
                      (rounded, in_dtype if got.dtype != torch.float64 else lambda: None, {}))
            if not (got.is_floating_point() or got.is_complex()):
                failure = self.integer_output(subject, case, label, path, got.detach(), want, others)
                if failure is not None:
                    return failure
                continue
            expected = classify(want.to(device=got.device, dtype=got.dtype))
            actual = classify(got.detach())
            if mode != "exact":
                # Declared: only finite vs non-finite must match (NaN and +-Inf count as one class).
                expected, actual = expected.clamp(max=1), actual.clamp(max=1)
            diff = expected != actual
            masks = skipped() if skipped is not None and diff.any() else None
            if masks is not None and path in masks:
                allowed = masks[path].to(device=diff.device) & (expected != 0) & (actual == 0)
                diff &= ~allowed
                if allowed.any() and structural is not None:
                    structural.append({"probe": label, "case": case.to_json(), "path": path,
                                       "outputs": int(allowed.sum())})
            if mode == "spread" and injected is not None:
                # Declared: the injected value may poison outputs the oracle keeps finite (never the reverse).
                extra = (expected == 0) & (actual == 1)
                diff &= ~extra
                if extra.any():
                    found.append({"probe": label, "case": case.to_json(), "injected": injected, "path": path,
                                  "outputs": int(extra.sum())})
            # other evaluations of the reference: a class either gives is allowed (see the docstring); the oracle on
            # the CPU is rounded to the output's dtype, the reference is in it already
            for counted, evaluation, record in others:
                if not diff.any() or evaluation() is None:
                    continue
                same = self.same_class(evaluation(), path, got, actual, mode, evaluation is on_cpu)
                if same is None:
                    continue
                agrees = diff & same
                diff &= ~agrees
                if agrees.any() and counted is not None:
                    counted.append({"probe": label, "case": case.to_json(), "path": path,
                                    "outputs": int(agrees.sum()), **record})
            if diff.any():
                flat = int(diff.reshape(-1).nonzero()[0, 0])
                index = list(index_of(flat, tuple(got.shape)))
                names = _NAMES if mode == "exact" else _NONFINITE_NAMES
                e, a = names[int(expected.reshape(-1)[flat])], names[int(actual.reshape(-1)[flat])]
                value = float(got.detach().reshape(-1)[flat].double().cpu())
                also = " (on the CPU too)" if on_cpu() is not None else ""  # asked above: diff was non-empty
                return self.failed(
                    subject, f"{path}{index}: the oracle gives {e}{also}, the kernel gives {value!r} "
                    f"({int(diff.sum())} of {diff.numel()} elements differ in class) after {label}",
                    case=case, expected=e, got=f"{a} ({value!r})", where=f"{path}{index}", details={"probe": label})
            if injected is not None and got.is_floating_point():
                failure = self.finite_values(subject, case, label, path, got.detach(), want, in_dtype)
                if failure is not None:
                    return failure
            ref = references.get(path)
            if isinstance(ref, torch.Tensor) and ref.shape == got.shape and got.is_floating_point():
                failure = self.subnormals(subject, case, label, path, got.detach(), ref, want,
                                          lambda path=path: moves().get(path),
                                          lambda path=path: cpu_reference().get(path),
                                          lambda path=path: widened_reference().get(path))
                if failure is not None:
                    return failure
        if spread is not None:
            spread.extend(found)
        return None

    def finite_values(self, subject: Subject, case: Case, label: str, path: str, got: torch.Tensor,
                      want: torch.Tensor, in_dtype: Callable[[], Any]) -> GateResult | None:
        """On a probe that injects a NaN/Inf: the outputs the injected value moved (the oracle's value there
        differs from the case's own) that the oracle and the kernel both keep finite are measured against the
        oracle's bound (calibrated from the reference's own error on this probe); a miss by more than
        BROKEN_FACTOR bounds fails. A NaN that lands in another bin, another index or another branch than the
        reference's gives a finite value of the wrong size, which the classes alone do not see (a bucketize
        that sends NaN to the first bin where torch sends it past the last). Outputs the injection left alone,
        and smaller misses, are the oracle gate's. Not tolerance-free."""
        tree = in_dtype()
        ref = dict(flatten(tree)).get(path) if tree is not None else None
        if not isinstance(ref, torch.Tensor) or ref.shape != got.shape or not got.numel():
            return None
        truth = want.detach().to(got.device)
        before = dict(flatten(subject.baseline(case).oracle)).get(path)
        if not isinstance(before, torch.Tensor) or before.shape != got.shape:
            return None
        before = before.detach().to(got.device)
        # the outputs the injected value moved (the oracle's value changed), finite in oracle and kernel
        moved = (truth != before) & ~(torch.isnan(truth) & torch.isnan(before))
        both = torch.isfinite(got) & torch.isfinite(truth) & moved
        if not bool(both.any()):
            return None
        tol = subject.tolerance
        # the other elements are the classes' business: there the kernel is given the oracle's value
        kept = torch.where(both, got, truth.to(got.dtype))
        # the reference's own error where it is finite, and at least its error on the case's own inputs: a NaN
        # that its algorithm spreads over a tile (cuDNN's transposed convolutions) past the oracle's would
        # leave the bound its floor alone
        ref = ref.detach().to(got.device)
        ref = torch.where(torch.isfinite(ref) | ~torch.isfinite(truth), ref, truth.to(ref.dtype))
        clean = dict(flatten(subject.baseline(case).reference)).get(path)
        own = measure(clean, clean, before, path=path, factor=tol.factor, ulps=tol.ulps, atol=tol.atol).ref_err \
            if isinstance(clean, torch.Tensor) and clean.shape == before.shape else None
        leaf = measure(kept, ref, truth, path=path, factor=tol.factor, ulps=tol.ulps, atol=tol.atol,
                       sensitivity=own or 0.0)
        if leaf.ratio <= BROKEN_FACTOR:  # a wrong bin or branch, not the accuracy the oracle gate judges
            return None
        where = f"{path}{leaf.index}" if leaf.index is not None else path
        result = self.failed(subject, f"{where}: finite where the oracle is finite, but {leaf.describe()} after "
                             f"{label}", case=case, expected=f"{leaf.expected!r} (float64 oracle)", got=repr(leaf.got),
                             where=where, broken=True, details={"probe": label, "ratio": leaf.ratio})
        result.tolerance_free = False  # a bound's miss, unlike the gate's classes
        return result

    def integer_output(self, subject: Subject, case: Case, label: str, path: str, got: torch.Tensor,
                       want: torch.Tensor, others: tuple[tuple[list | None, Callable[[], Any], dict], ...]
                       ) -> GateResult | None:
        """An integer or boolean output (an argmax, a mask, a count) under a special value: equal to the oracle's,
        or where it differs, to another evaluation of the reference (`others`, as `judge` asks them for the
        classes of a floating output: the oracle on the CPU, the reference in the kernel's dtype, whose rounding
        may make a tie the oracle has not; each agreement counted in its list). A NaN the kernel's comparison
        skips gives another index where torch's argmax returns the NaN's. Tolerance-free."""
        diff = got != want.to(device=got.device, dtype=got.dtype)
        for counted, evaluation, record in others:
            if not diff.any():
                break
            tree = evaluation()
            other = dict(flatten(tree)).get(path) if tree is not None else None
            if isinstance(other, torch.Tensor) and other.shape == got.shape:
                agrees = diff & (got == other.detach().to(device=got.device, dtype=got.dtype))
                diff &= ~agrees
                if agrees.any() and counted is not None:
                    counted.append({"probe": label, "case": case.to_json(), "path": path,
                                    "outputs": int(agrees.sum()), **record})
        if not diff.any():
            return None
        flat = int(diff.reshape(-1).nonzero()[0, 0])
        index = list(index_of(flat, tuple(got.shape)))
        e, a = want.reshape(-1)[flat].item(), got.reshape(-1)[flat].item()
        return self.failed(
            subject, f"{path}{index}: the oracle gives {e!r}, the kernel gives {a!r} ({int(diff.sum())} of "
            f"{diff.numel()} elements of this {str(got.dtype).removeprefix('torch.')} output differ) after {label}",
            case=case, expected=repr(e), got=repr(a), where=f"{path}{index}", details={"probe": label})

    @staticmethod
    def same_class(tree, path: str, got: torch.Tensor, actual: torch.Tensor, mode: str,
                   rounds: bool) -> torch.Tensor | None:
        """Where the leaf at `path` of `tree` (another evaluation of the reference: a float64 one, rounded to the
        output's dtype where `rounds`, else one in that dtype already) has the kernel's class `actual`; None
        where that leaf is missing or not comparable."""
        other = dict(flatten(tree)).get(path)
        if not isinstance(other, torch.Tensor) or other.shape != got.shape or not (rounds or other.dtype == got.dtype):
            return None
        other = classify(other.detach().to(device=got.device, dtype=got.dtype))
        return actual == (other if mode == "exact" else other.clamp(max=1))

    def subnormals(self, subject: Subject, case: Case, label: str, path: str, got: torch.Tensor, ref: torch.Tensor,
                   want: torch.Tensor, moves: Callable[[], torch.Tensor | None] = lambda: None,
                   reference_on_cpu: Callable[[], torch.Tensor | None] = lambda: None,
                   reference_widened: Callable[[], torch.Tensor | None] = lambda: None) -> GateResult | None:
        """Where the oracle, rounded to the output's dtype, is clearly subnormal (`CLEARLY_SUBNORMAL`): the kernel
        flushes to zero where the reference keeps the subnormal, or keeps one where the reference flushes. Only
        where the inputs determine the result to within its own magnitude (`moves()`, the oracle's move per
        element when every input moves by an ulp of its dtype, `oracle_moves`, is below |oracle|): elsewhere a 0
        is a rounding of the computation in the dtype (a float16 prefix sum whose running sums are a thousand
        times its result), not a flush. A reference's 0 is its flush only where the same reference in the same
        dtype on the CPU (`reference_on_cpu()`, asked where the kernel runs elsewhere) gives 0 as well: where it
        keeps the subnormal there, the device's 0 is that device's path (torch's CUDA bfloat16 cumsum on
        subnormal inputs), not the op's semantics, and a kernel keeping the subnormal departs from no contract. Nor where
        the reference on bfloat16 inputs widened to float32 (`reference_widened()`) keeps it: the two dtypes share
        the smallest normal, so a flush gives 0 in both, and a 0 of the bfloat16 evaluation alone is the rounding
        of an intermediate below bfloat16's smallest subnormal (Liger's RMSNorm backward keeps what Llama's
        reference loses in `weight * y`). Nor where the reference keeps clearly subnormal results of the same
        output (`kept`): FTZ zeroes every subnormal result of the operation that makes it, so a reference that
        keeps some does not flush, and its 0s are roundings of an intermediate."""
        tiny = torch.finfo(got.dtype).tiny
        o = want.to(device=got.device, dtype=got.dtype)
        clearly = (o.abs() >= tiny * CLEARLY_SUBNORMAL) & (o.abs() < tiny)
        r = ref.to(got.device)
        kept = clearly & (r != 0) & (r.abs() < tiny)
        flushed = clearly & (r == 0)
        for reference_flushes, mask, expected, what, bad in (
                (False, kept, "the subnormal the reference keeps", "the kernel flushes it to zero", got == 0),
                (True, flushed, "0, as the reference flushes it", "the kernel keeps a subnormal",
                 (got != 0) & (got.abs() < tiny))):
            diff = mask & bad
            if reference_flushes and diff.any() and kept.any():
                # FTZ zeroes every subnormal result of the operation that makes it: a reference that keeps clearly
                # subnormal results of this output does not flush, and its 0s here are its rounding of an
                # intermediate (float16 `dy * weight` of Llama's RMSNorm backward, quantised in float16's subnormal
                # range; an input's one-ulp move does not show it)
                continue
            moved = moves() if diff.any() else None
            if moved is not None and moved.shape == o.shape:
                rounding = moved.to(got.device) >= want.to(got.device).abs()
                mask, diff = mask & ~rounding, diff & ~rounding
            for other in (reference_on_cpu, reference_widened):  # another evaluation that keeps it: no flush
                kept_there = other() if reference_flushes and diff.any() else None
                if isinstance(kept_there, torch.Tensor) and kept_there.shape == o.shape:
                    kept_there = kept_there.to(device=got.device, dtype=got.dtype) != 0
                    mask, diff = mask & ~kept_there, diff & ~kept_there
            # On the products probe a chained computation may underflow in an intermediate another order keeps
            # (a * b * c as (a * b) * c): some subnormal results lost is a reformulation; every one lost is a flush.
            if diff.any() and (label != UNDERFLOW or bool(diff.sum() == mask.sum())):
                flat = int(diff.reshape(-1).nonzero()[0, 0])
                index = list(index_of(flat, tuple(got.shape)))
                e, g = float(r.reshape(-1)[flat]), float(got.reshape(-1)[flat])
                return self.failed(
                    subject, f"{path}{index}: the reference gives {e!r} (the oracle {float(o.reshape(-1)[flat])!r}), "
                    f"the kernel {g!r}: {what} ({int(diff.sum())} of {int(mask.sum())} clearly subnormal outputs) after "
                    f"{label}", case=case, expected=f"{expected} ({e!r})", got=repr(g),
                    where=f"{path}{index}", details={"probe": label, "subnormal": True})
        return None


GATE = SpecialValues
