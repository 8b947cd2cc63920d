"""contract: the output has the reference's structure, shape, dtype and device, is a plain
torch.Tensor (no subclass, no lazy wrapper) and does not alias an input. Tolerance-free."""

from __future__ import annotations

import torch

from kgate.compare import clone_tree, flatten, overlaps, structure
from kgate.gates.base import Gate, GateResult
from kgate.subject import Subject


class Contract(Gate):
    name = "contract"
    summary = "output matches the reference's structure, shape, dtype, device; plain torch.Tensor; no input aliasing"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        cases = subject.first_seed_cases()
        for case in cases:
            base = subject.baseline(case)
            args = clone_tree(base.args)
            out = subject.run_kernel(args)
            ref = base.reference
            if structure(out) != structure(ref):
                return self.failed(subject, "output structure differs from the reference's", case=case,
                                   expected=structure(ref), got=structure(out), where="out")
            for (path, got), (_, want) in zip(flatten(out), flatten(ref)):
                if not isinstance(want, torch.Tensor):
                    continue
                if type(got) is not torch.Tensor:
                    return self.failed(subject, f"{path} is a {type(got).__module__}.{type(got).__qualname__}, "
                                       "not a plain torch.Tensor", case=case, expected="torch.Tensor",
                                       got=type(got).__qualname__, where=path)
                for attr in ("shape", "dtype", "device"):
                    a, b = getattr(want, attr), getattr(got, attr)
                    if attr == "shape":
                        a, b = tuple(a), tuple(b)
                    if a != b:
                        return self.failed(subject, f"{path} has {attr} {b}, the reference's has {a}", case=case,
                                           expected=str(a), got=str(b), where=path)
                for i, arg in enumerate(args):
                    if isinstance(arg, torch.Tensor) and i not in subject.inplace and overlaps(got, arg):
                        return self.failed(subject, f"{path} aliases input argument {i} (shares its memory)",
                                           case=case, expected="a fresh tensor", got=f"a view of argument {i}",
                                           where=path)
        return self.passed(f"structure, shape, dtype, device and aliasing as the reference in {len(cases)} case(s)")


GATE = Contract
