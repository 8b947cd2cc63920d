"""input_integrity: inputs are bitwise unchanged by the call, shape and strides included, unless the
manifest declares them in-place (`inplace: [index, ...]`). Tolerance-free.

On the factory's inputs, and again on copies whose floating-point inputs hold, at every `EVERY`-th element,
values whose bits an in-place "sanitising" pass changes while it changes no output: negative zeros and
subnormals (a `x[x == 0] = 0` or flush-to-zero over the input), then NaNs with a payload and infinities
(a `nan_to_num_`, a clamp, a canonicalising copy). Each of those probes is skipped where the reference
rejects it (its declared domain)."""

from __future__ import annotations

import torch

from kgate.compare import bitwise_mismatch, clone_tree
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case
from kgate.subject import Subject, unless_rejected

EVERY = 7  # every EVERY-th element of a floating-point input carries one of a probe's bit patterns
_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _patterns(dtype: torch.dtype, finite: bool) -> list[torch.Tensor]:
    """The values a probe writes: -0.0 and a subnormal (`finite`), or a NaN with a payload other than the
    canonical one, +inf and -inf."""
    if finite:
        return [torch.tensor(-0.0, dtype=dtype), torch.tensor(torch.finfo(dtype).tiny / 4, dtype=dtype)]
    nan = torch.tensor(float("nan"), dtype=dtype)
    payload = (nan.view(_INTS[nan.element_size()]) + 1).view(dtype)  # still a NaN, its payload not the default
    return [payload, torch.tensor(float("inf"), dtype=dtype), torch.tensor(float("-inf"), dtype=dtype)]


def with_patterns(args: tuple, finite: bool) -> tuple:
    """Copies of `args` with every EVERY-th element of each real floating-point tensor set, in turn, to the
    probe's bit patterns (`_patterns`)."""
    out = list(clone_tree(args))
    for a in out:
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 0
                and a.element_size() in _INTS):
            continue
        flat = a.view(-1) if a.is_contiguous() else None
        if flat is None:
            continue
        values = _patterns(a.dtype, finite)
        for k, value in enumerate(values):
            flat[k * EVERY::EVERY * len(values)] = value.to(a.device)
    return tuple(out)


class InputIntegrity(Gate):
    name = "input_integrity"
    summary = "inputs bitwise unchanged after the call (unless declared in-place)"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        checked, patterned = 0, 0
        for case in subject.first_seed_cases():
            base = subject.baseline(case)
            probes = [("", clone_tree(base.args))]
            for finite, label in ((True, "negative zeros and subnormals"), (False, "NaNs with a payload and infinities")):
                probe = subject.conform(base.args, with_patterns(base.args, finite))
                if unless_rejected(lambda probe=probe: subject.run_reference(clone_tree(probe))) is not None:
                    probes.append((f" (inputs holding {label} at every {EVERY}th element)", probe))
            for label, args in probes:
                result = self.unchanged(subject, case, args, label)
                if isinstance(result, GateResult):
                    return result
                checked += result if not label else 0
                patterned += 1 if label else 0
        if checked == 0:
            return self.skipped("no tensor inputs outside the declared in-place ones")
        return self.passed(f"{checked} input tensor(s) unchanged, and on {patterned} probe(s) whose inputs hold "
                           "negative zeros, subnormals, NaN payloads or infinities")

    def unchanged(self, subject: Subject, case: Case, args: tuple, label: str) -> GateResult | int:
        """A failure if the kernel's call changes one of `args` (not declared in-place), else how many tensor
        arguments were checked."""
        checked = 0
        before = [(a.shape, a.stride(), a.detach().clone()) if isinstance(a, torch.Tensor) else None
                  for a in args]
        subject.run_kernel(args)
        for i, (arg, saved) in enumerate(zip(args, before)):
            if saved is None or i in subject.inplace:
                continue
            checked += 1
            shape, stride, copy = saved
            if tuple(arg.shape) != tuple(shape) or arg.stride() != stride:
                return self.failed(subject, f"argument {i} changed its shape or strides in place{label}", case=case,
                                   expected=f"shape {tuple(shape)} stride {stride}",
                                   got=f"shape {tuple(arg.shape)} stride {arg.stride()}", where=f"args[{i}]")
            mismatch = bitwise_mismatch(copy, arg)
            if mismatch:
                return self.failed(subject, f"argument {i} was modified in place{label}: {mismatch.describe()}",
                                   case=case, expected=repr(mismatch.expected), got=repr(mismatch.got),
                                   where=f"args[{i}]{list(mismatch.index)}",
                                   details={"modified": mismatch.count})
        return checked


GATE = InputIntegrity
