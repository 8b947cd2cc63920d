"""input_integrity: inputs are bitwise unchanged by the call, shape and strides included, unless the
manifest declares them in-place (`inplace: [index, ...]`). Tolerance-free."""

from __future__ import annotations

import torch

from kgate.compare import bitwise_mismatch, clone_tree
from kgate.gates.base import Gate, GateResult
from kgate.subject import Subject


class InputIntegrity(Gate):
    name = "input_integrity"
    summary = "inputs bitwise unchanged after the call (unless declared in-place)"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        checked = 0
        for case in subject.first_seed_cases():
            base = subject.baseline(case)
            args = clone_tree(base.args)
            before = [(a.shape, a.stride(), a.detach().clone()) if isinstance(a, torch.Tensor) else None
                      for a in args]
            subject.run_kernel(args)
            for i, (arg, saved) in enumerate(zip(args, before)):
                if saved is None or i in subject.inplace:
                    continue
                checked += 1
                shape, stride, copy = saved
                if tuple(arg.shape) != tuple(shape) or arg.stride() != stride:
                    return self.failed(subject, f"argument {i} changed its shape or strides in place", case=case,
                                       expected=f"shape {tuple(shape)} stride {stride}",
                                       got=f"shape {tuple(arg.shape)} stride {arg.stride()}", where=f"args[{i}]")
                mismatch = bitwise_mismatch(copy, arg)
                if mismatch:
                    return self.failed(subject, f"argument {i} was modified in place: {mismatch.describe()}",
                                       case=case, expected=repr(mismatch.expected), got=repr(mismatch.got),
                                       where=f"args[{i}]{list(mismatch.index)}",
                                       details={"modified": mismatch.count})
        if checked == 0:
            return self.skipped("no tensor inputs outside the declared in-place ones")
        return self.passed(f"{checked} input tensor(s) unchanged")


GATE = InputIntegrity
