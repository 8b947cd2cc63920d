"""oracle: agreement with the float64 oracle within the bound calibrated from the reference's own
error in the kernel's dtype (formula in kgate/oracle.py). Judged on every case of the sweep."""

from __future__ import annotations

import torch

from kgate.compare import clone_tree, flatten, structure
from kgate.gates.base import Gate, GateResult
from kgate.oracle import BROKEN_FACTOR, LeafError, measure
from kgate.subject import Subject


class Oracle(Gate):
    name = "oracle"
    summary = "agrees with the float64 oracle within c x the reference's own error in the kernel's dtype"
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        tol = subject.tolerance
        evidence = []
        worst: tuple[float, LeafError, object] | None = None
        for case in subject.cases:
            base = subject.baseline(case)
            out = subject.run_kernel(clone_tree(base.args))
            if structure(out) != structure(base.oracle):
                return self.failed(subject, "output structure differs from the reference's: cannot compare",
                                   case=case, expected=structure(base.oracle), got=structure(out), broken=True)
            refs = dict(flatten(base.reference))
            oracles = dict(flatten(base.oracle))
            for path, got in flatten(out):
                want = oracles[path]
                if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
                    continue
                if tuple(got.shape) != tuple(want.shape):
                    return self.failed(subject, f"{path} has shape {tuple(got.shape)}, the oracle's is "
                                       f"{tuple(want.shape)}", case=case, broken=True)
                ref = refs.get(path)
                leaf = measure(got, ref if isinstance(ref, torch.Tensor) else None, want, path=path,
                               factor=tol.factor, ulps=tol.ulps, atol=tol.atol)
                evidence.append({"case": case.to_json(), **leaf.to_json()})
                if worst is None or leaf.ratio > worst[0]:
                    worst = (leaf.ratio, leaf, case)
        if worst is None:
            return self.skipped("no tensor outputs to compare")
        ratio, leaf, case = worst
        if leaf.passed:
            return self.passed(f"within bound in {len(subject.cases)} case(s); worst {ratio:.2g} x bound "
                               f"({leaf.path}, {case.label()})", evidence=evidence)
        where = f"{leaf.path}{leaf.index}" if leaf.index is not None else leaf.path
        return self.failed(subject, leaf.describe(), case=case, expected=f"{leaf.expected!r} (float64 oracle)",
                           got=repr(leaf.got), where=where, broken=ratio > BROKEN_FACTOR, evidence=evidence,
                           details={"ratio": ratio})


GATE = Oracle
