"""layouts: strided inputs give the result of their contiguous copy.

Each tensor input (one dimension or more, not empty) is rebuilt with the same logical values in
other memory layouts: transposed (the last two dimensions swapped in memory), every other element
(a stride-2 view, as torch.testing.make_tensor(noncontiguous=True) makes), sliced (a view into a
larger buffer: row strides and an offset), storage offset (contiguous strides, offset start), and
channels-last for 4-D and 5-D tensors. The buffers' unused elements hold NaN (integers: their
maximum), so a kernel that reads the raw storage as if it were contiguous gets visibly wrong values.

Then inputs that share memory, on the first case: each tensor input of two or more entries along
dimension 0 broadcast from its first (`expand`, stride 0), each pair of inputs of one shape, dtype
and device passed as one tensor (`f(x, x)`), and three or more such inputs all passed as one (`f(x, x, x)`), judged like the strided layouts against the kernel's own result
on dense copies of the same values (the oracle on the dense copies), and laid out as the reference's output
where that result is (an output that is itself a stride-0 view where the reference's is dense fails). A kernel
that writes into an input in one layout only (a reshape that is a view there; one that writes its contiguous
input too is the input_integrity gate's finding) fails too, tolerance-free.

A layout the reference rejects (raises on) is outside the kernel's contract and skipped; one on which its
own launches lose the CUDA context ends the gate with `skip` (kgate.faults.ContextLost). On the
others the kernel must not raise, and its result must be bitwise equal to its result on the
contiguous copy or else, unless the manifest declares `bitwise_layouts: true`, within the oracle bound
(no worse than on the contiguous copy): torch's own reductions may sum in another order when strides
change, which is correct rounding, not a layout bug. Failing probes are shrunk to the fewest strided
arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten, overlaps, structure
from kgate.gates.base import Gate, GateResult
from kgate.gates.contract import layout_problem
from kgate.gates.oracle import Incomparable, measure_outputs
from kgate.inputs import Case
from kgate.oracle import BROKEN_FACTOR
from kgate.shrink import CONTRACT, CRASH, ORACLE, SHRINK_SECONDS, Finding, shrink_subset
from kgate.subject import Subject, UserCodeError


def _poison(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def _buffer(size: tuple[int, ...] | int, like: torch.Tensor) -> torch.Tensor:
    return torch.full(size if isinstance(size, tuple) else (size,), _poison(like.dtype), dtype=like.dtype,
                      device=like.device)


def transposed(t: torch.Tensor) -> torch.Tensor | None:
    if t.dim() < 2:
        return None
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def every_other(t: torch.Tensor) -> torch.Tensor | None:
    if t.dim() < 1:
        return None
    view = _buffer(tuple(t.shape[:-1]) + (2 * t.shape[-1],), t)[..., ::2]
    return view.copy_(t)


def sliced(t: torch.Tensor) -> torch.Tensor | None:
    if t.dim() < 1:
        return None
    buf = _buffer(tuple(s + 3 for s in t.shape), t)
    view = buf[tuple(slice(1, 1 + s) for s in t.shape)]
    return view.copy_(t)


def storage_offset(t: torch.Tensor) -> torch.Tensor | None:
    view = _buffer(t.numel() + 17, t)[17:].view(t.shape)
    return view.copy_(t)


def channels_last(t: torch.Tensor) -> torch.Tensor | None:
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    if t.dim() not in formats:
        return None
    return t.contiguous(memory_format=formats[t.dim()])


EVERY_OTHER = "every other element"
LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "transposed": transposed,
    EVERY_OTHER: every_other,
    "sliced": sliced,
    "storage offset": storage_offset,
    "channels-last": channels_last,
}


def relayout(t: torch.Tensor, kind: str) -> torch.Tensor | None:
    """`t`'s values in the layout `kind`, or None when that layout is the contiguous one for `t`."""
    if t.numel() == 0:
        return None
    out = LAYOUTS[kind](t)
    if out is None or (out.stride() == t.contiguous().stride() and out.storage_offset() == 0):
        return None
    return out


def fresh_copy(template: torch.Tensor) -> torch.Tensor:
    """A new buffer holding `template`'s whole storage, viewed with its shape, strides and offset."""
    flat = torch.empty(0, dtype=template.dtype, device=template.device)
    flat.set_(template.untyped_storage(), 0, (template.untyped_storage().nbytes() // template.element_size(),))
    return flat.clone().as_strided(template.shape, template.stride(), template.storage_offset())


def describe_layout(t: torch.Tensor) -> str:
    return f"strides {tuple(t.stride())}, offset {t.storage_offset()}"


class Layouts(Gate):
    name = "layouts"
    summary = ("transposed, strided, sliced, offset and channels-last inputs give the contiguous copy's result "
               "(bitwise where declared, else within the oracle bound)")
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        bitwise = bool(getattr(subject.entry.entry, "bitwise_layouts", False))
        probes, equal, rejected = 0, 0, []
        evidence: list[dict] = []
        writes_any = False
        for case in subject.first_seed_cases():
            base = subject.baseline(case)
            contiguous = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in base.args)
            given = clone_tree(contiguous)
            expected = self._outputs(subject, given)
            # a kernel that writes into its contiguous input too is the input_integrity gate's finding
            writes = any(isinstance(a, torch.Tensor) and i not in subject.inplace and bitwise_mismatch(a, b)
                         for i, (a, b) in enumerate(zip(contiguous, given)))
            writes_any = writes_any or writes
            for kind in LAYOUTS:
                strided = {i: v for i, a in enumerate(contiguous) if isinstance(a, torch.Tensor)
                           and (v := relayout(a, kind)) is not None}
                if not strided:
                    continue
                try:  # the reference's own result on the layout: also the bound's calibration if the kernel's differs
                    reference = subject.run_reference(self._apply(contiguous, strided))
                except UserCodeError as exc:
                    if exc.role != "reference":
                        raise
                    rejected.append(f"{kind} ({case.label()})")
                    continue
                probes += 1
                finding, same = self._judge(subject, base, contiguous, expected, strided, bitwise, evidence, case,
                                            reference, writes)
                del reference
                equal += same
                if finding is not None:
                    return self._fail(subject, case, base, contiguous, expected, strided, bitwise, kind, finding,
                                      evidence)
        shared = 0
        for case in subject.first_seed_cases()[:1] if not writes_any else []:  # (no stride-0 input to write into)
            for label, make in self.shared_memory(subject, case):
                finding = self._judge_shared(subject, make, rejected, label, case)
                if finding is False:
                    continue
                shared += 1
                probes += 1
                if finding is not None:
                    result = self.failed(subject, f"{label}: {finding.message}", case=case, expected=finding.expected,
                                         got=finding.got, where=finding.where, broken=finding.broken,
                                         evidence=evidence, details={**finding.details, "kind": finding.kind,
                                                                     "layout": label})
                    result.tolerance_free = finding.tolerance_free
                    return result
        if probes == 0:
            reason = "no tensor input has a non-contiguous layout to try"
            if rejected:
                reason = f"the reference rejects every strided layout tried: {', '.join(rejected[:4])}"
            return self.skipped(reason)
        mode = "bitwise equal required" if bitwise else "bitwise equal or within the oracle bound"
        message = (f"{probes - shared} strided probe(s) gave the contiguous copy's result ({mode}; {equal} bitwise "
                   "equal)")
        if shared:
            message += f"; {shared} probe(s) of inputs that share memory (broadcast, one tensor as two arguments) " \
                "within the oracle bound"
        if rejected:
            message += f"; skipped {len(rejected)} the reference rejects"
        result = self.passed(message, evidence=evidence)
        result.tolerance_free = bitwise
        return result

    @staticmethod
    def shared_memory(subject: Subject, case: Case) -> list[tuple[str, Callable[[], tuple]]]:
        """(label, a maker of fresh inputs) for the probes whose inputs share memory: each tensor input of two
        or more entries along dimension 0 broadcast from its first (`expand`: stride 0, every entry the same
        memory), each pair of inputs of one shape, dtype and device passed as one tensor (`f(x, x)`: a
        Gram matrix), and three or more such inputs all passed as one (self-attention's q = k = v: `f(x, x, x)`).
        Arguments the kernel writes in place are left out."""
        args = subject.baseline(case).args
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel() and a.dim()
                   and i not in subject.inplace]
        found: list[tuple[str, Callable[[], tuple]]] = []

        def replaced(i: int, value: Callable[[tuple], torch.Tensor]) -> Callable[[], tuple]:
            def make() -> tuple:
                fresh = list(clone_tree(args))
                fresh[i] = value(fresh)
                return tuple(fresh)
            return make

        for i in tensors:
            if args[i].shape[0] >= 2:
                found.append((f"argument {i} broadcast along dimension 0 (stride 0: every entry is the first)",
                              replaced(i, lambda fresh, i=i: fresh[i][:1].expand(fresh[i].shape))))
        for n, i in enumerate(tensors):
            for j in tensors[n + 1:]:
                a, b = args[i], args[j]
                if a.shape == b.shape and a.dtype == b.dtype and a.device == b.device:
                    found.append((f"one tensor passed as arguments {i} and {j}",
                                  replaced(j, lambda fresh, i=i: fresh[i])))
        groups: dict[tuple, list[int]] = {}
        for i in tensors:
            groups.setdefault((tuple(args[i].shape), args[i].dtype, args[i].device), []).append(i)
        for group in (g for g in groups.values() if len(g) >= 3):  # every one of them at once: f(x, x, x)
            def all_one(fresh: list, group: list[int] = group) -> torch.Tensor:
                for j in group[1:-1]:
                    fresh[j] = fresh[group[0]]
                return fresh[group[0]]
            found.append((f"one tensor passed as arguments {', '.join(map(str, group))}", replaced(group[-1], all_one)))
        return found

    @staticmethod
    def _judge_shared(subject: Subject, make: Callable[[], tuple], rejected: list, label: str,
                      case: Case) -> Finding | None | bool:
        """The kernel on inputs that share memory against its own result on dense copies of the same values, as
        the strided probes are judged: bitwise equal, or within the oracle bound and no worse than the dense
        result; and laid out as the reference's output where the dense result is. A Finding, None, or False
        (the reference rejects the inputs, or the kernel raises on the dense copies: other gates' business)."""
        def dense() -> tuple:  # (copies: `.contiguous()` of a contiguous tensor would keep the sharing)
            return tuple(a.clone(memory_format=torch.contiguous_format) if isinstance(a, torch.Tensor) else a
                         for a in make())
        try:
            reference = subject.run_reference(make())
            oracle = subject.oracle(dense())
        except UserCodeError as exc:
            if not exc.role.startswith("reference"):
                raise
            rejected.append(f"{label} ({case.label()})")
            return False
        try:
            plain = subject.run_kernel(dense())
        except UserCodeError as exc:
            if exc.role != "kernel":
                raise
            return False
        given = make()
        try:
            out = subject.run_kernel(given)
        except UserCodeError as exc:
            if exc.role != "kernel":
                raise
            return Finding(CRASH, f"kernel raised {type(exc.exc).__name__}: {exc.exc} (the reference accepts "
                           "these inputs, and the kernel their dense copies)", details={"traceback": exc.trace})
        if structure(out) != structure(plain):
            return Finding(CONTRACT, "output structure differs from the dense copies' result")
        pairs = [(p, g, w) for (p, g), (_, w) in zip(flatten(out), flatten(plain))
                 if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)]
        refs = dict(flatten(reference))
        for path, got, was in pairs:  # (first: an expanded output holds the dense result's values)
            want = refs.get(path)
            aliases = any(isinstance(a, torch.Tensor) and overlaps(got, a) for a in given)  # (the contract gate's)
            if isinstance(want, torch.Tensor) and not aliases:
                problem = layout_problem(got, want)
                if problem and layout_problem(was, want) is None:
                    message, expected, found = problem
                    return Finding(CONTRACT, f"{path} {message}", where=path, expected=expected, got=found,
                                   tolerance_free=True)
        if all(g.shape == w.shape and g.dtype == w.dtype and bitwise_mismatch(w, g) is None for _, g, w in pairs):
            return None
        leaves = measure_outputs(out, reference, oracle, subject.tolerance)
        dense_leaves = measure_outputs(plain, reference, oracle, subject.tolerance)
        if isinstance(leaves, Incomparable) or isinstance(dense_leaves, Incomparable):
            return Finding(CONTRACT, "output cannot be compared with the oracle")
        for leaf, was in zip(leaves, dense_leaves):
            allowed = max(leaf.bound, was.err)
            if leaf.err > allowed:
                ratio = leaf.err / allowed if allowed > 0 else float("inf")
                return Finding(ORACLE, f"differs from the dense copies' result beyond the oracle bound: "
                               f"{leaf.describe()}", where=leaf.where, expected=f"{leaf.expected!r} (float64 oracle)",
                               got=repr(leaf.got), broken=ratio > BROKEN_FACTOR, tolerance_free=False,
                               details={"ratio": ratio})
        return None

    @staticmethod
    def _apply(args: tuple, strided: dict[int, torch.Tensor]) -> tuple:
        """Copies of `args` with the chosen arguments in their strided layout (fresh buffers each time)."""
        out = []
        for i, a in enumerate(args):
            if i in strided:
                a = fresh_copy(strided[i])
            elif isinstance(a, torch.Tensor):
                a = a.clone()
            out.append(a)
        return tuple(out)

    @staticmethod
    def _outputs(subject: Subject, args: tuple) -> list:
        """The outputs, plus the in-place arguments (their final values are results too)."""
        out = subject.run_kernel(args)
        return [out, [args[i] for i in sorted(subject.inplace) if i < len(args)]]

    def _judge(self, subject: Subject, base, contiguous: tuple, expected: list, strided: dict[int, torch.Tensor],
               bitwise: bool, evidence: list | None, case: Case,
               reference: Any = None, writes: bool = False) -> tuple[Finding | None, bool]:
        """(why this probe fails or None, whether its result was bitwise equal to the contiguous one).
        `reference`: the reference's output on these strided arguments, when already run."""
        given = self._apply(contiguous, strided)
        try:
            got = self._outputs(subject, given)
        except UserCodeError as exc:
            if exc.role != "kernel":
                raise
            return Finding(CRASH, f"kernel raised {type(exc.exc).__name__}: {exc.exc}",
                           details={"traceback": exc.trace}), False
        for i in sorted(strided):  # an input the kernel writes only in this layout (a reshape that is a view)
            changed = bitwise_mismatch(strided[i], given[i]) if i not in subject.inplace and not writes else None
            if changed is not None:
                return Finding(CONTRACT, f"argument {i} was changed by the call ({changed.describe()}): the "
                               "kernel writes into its input in this layout", where=f"argument {i}",
                               expected="the input unchanged", got="changed", tolerance_free=True), False
        got_leaves = [(p, t) for p, t in flatten(got) if isinstance(t, torch.Tensor)]
        want_leaves = [(p, t) for p, t in flatten(expected) if isinstance(t, torch.Tensor)]
        if [p for p, _ in got_leaves] != [p for p, _ in want_leaves]:
            return Finding(CONTRACT, "output structure differs from the contiguous copy's"), False
        first = None
        for (path, g), (_, w) in zip(got_leaves, want_leaves):
            mismatch = bitwise_mismatch(w, g)
            if mismatch is not None:
                first = (path, mismatch)
                break
        if first is None:
            return None, True
        path, mismatch = first
        label = f"{path}{list(mismatch.index)}"
        if bitwise or g.shape != w.shape or g.dtype != w.dtype:
            return Finding(CONTRACT if g.shape != w.shape or g.dtype != w.dtype else ORACLE,
                           f"{path} differs from the contiguous copy's result: {mismatch.describe()}",
                           where=label, expected=repr(mismatch.expected), got=repr(mismatch.got),
                           tolerance_free=True, details={"differing": mismatch.count}), False
        # Not bitwise: hold the strided result to the oracle bound, calibrated on the reference's error on
        # the contiguous inputs or on the strided ones (a reduction's rounding depends on the layout, for
        # PyTorch as for the kernel: a kernel equal to the reference failed when the contiguous run happened
        # to round better), and no worse than the contiguous result.
        out_strided, out_contig = got[0], expected[0]
        leaves = measure_outputs(out_strided, base.reference, base.oracle, subject.tolerance)
        contig = measure_outputs(out_contig, base.reference, base.oracle, subject.tolerance)
        if reference is None:
            reference = subject.run_reference(self._apply(contiguous, strided))
        as_reference = measure_outputs(out_strided, reference, base.oracle, subject.tolerance)
        if any(isinstance(x, Incomparable) for x in (leaves, contig, as_reference)):
            return Finding(CONTRACT, "output cannot be compared with the oracle"), False
        for leaf, ref_leaf, strided_leaf in zip(leaves, contig, as_reference):
            if evidence is not None:
                evidence.append({"case": case.to_json(), **leaf.to_json()})
            allowed = max(leaf.bound, strided_leaf.bound, ref_leaf.err)
            if leaf.err > allowed:
                ratio = leaf.err / allowed if allowed > 0 else float("inf")
                return Finding(ORACLE, f"differs from the contiguous copy's result beyond the oracle bound: "
                               f"{leaf.describe()}", where=leaf.where, expected=f"{leaf.expected!r} (float64 oracle)",
                               got=repr(leaf.got), broken=ratio > BROKEN_FACTOR, tolerance_free=False,
                               details={"ratio": ratio}), False
        return None, False

    def _fail(self, subject: Subject, case: Case, base, contiguous: tuple, expected: list,
              strided: dict[int, torch.Tensor], bitwise: bool, kind: str, finding: Finding,
              evidence: list) -> GateResult:
        found = {tuple(strided): finding}

        def fails(indices: list[int]) -> bool:
            result, _ = self._judge(subject, base, contiguous, expected, {i: strided[i] for i in indices},
                                    bitwise, None, case)
            if result is not None and result.kind == finding.kind:
                found[tuple(indices)] = result
                return True
            return False

        shrunk = shrink_subset(sorted(strided), fails, seconds=min(SHRINK_SECONDS, subject.entry.limits.timeout / 4))
        final = found[tuple(shrunk.value)]
        which = "; ".join(f"argument {i} {kind} ({describe_layout(strided[i])})" for i in shrunk.value)
        note = ""
        if len(shrunk.value) < len(strided):
            note = f" (shrunk from {len(strided)} strided arguments, {shrunk.note()})"
        result = self.failed(subject, f"{which}: {final.message}{note}", case=case, expected=final.expected,
                             got=final.got, where=final.where, broken=final.broken, evidence=evidence,
                             details={**final.details, "kind": final.kind, "layout": kind,
                                      "arguments": list(shrunk.value),
                                      "strides": {str(i): list(strided[i].stride()) for i in shrunk.value}})
        result.tolerance_free = final.tolerance_free
        return result


GATE = Layouts
