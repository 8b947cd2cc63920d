"""oracle: agreement with the float64 oracle within the bound calibrated from the reference's own
error in the kernel's dtype (formula in kgate/oracle.py). Judged on every case of the sweep."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kgate.compare import clone_tree, flatten, structure
from kgate.gates.base import Gate, GateResult
from kgate.manifest import Tolerance
from kgate.oracle import BROKEN_FACTOR, LeafError, Terms, measure
from kgate.subject import Subject


@dataclass
class Incomparable:
    """The kernel's output cannot be measured against the oracle (structure or shape differs)."""

    message: str
    expected: str | None = None
    got: str | None = None


def measure_outputs(out: Any, reference: Any, oracle: Any, tol: Tolerance,
                    scales: dict[str, float] | None = None,
                    sensitivity: dict[str, float] | None = None,
                    terms: Callable[[], dict[str, Terms]] | None = None) -> Incomparable | list[LeafError]:
    """The oracle gate's judgement of one output tree: one LeafError per tensor leaf, or why none.

    Shared by every gate that judges against the oracle bound (shapes, layouts, distributions, ...).
    `scales` (output path -> magnitude) raises the magnitude each leaf's floor is taken of; `sensitivity`
    (output path -> the oracle's change when the inputs move by an ulp) the least reference error; `terms`
    (`Subject.terms` on the inputs: output path -> the magnitudes of the terms the oracle's computation
    combines) is called at most once, and only where a leaf misses the bound otherwise (`measure`)."""
    if structure(out) != structure(oracle):
        return Incomparable("output structure differs from the reference's: cannot compare",
                            expected=structure(oracle), got=structure(out))
    refs = dict(flatten(reference))
    oracles = dict(flatten(oracle))
    leaves = []
    known: list[dict[str, Terms]] = []

    def magnitude(path: str) -> Terms | None:
        if terms is None:
            return None
        if not known:
            known.append(terms())
        return known[0].get(path)

    for path, got in flatten(out):
        want = oracles[path]
        if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
            continue
        if tuple(got.shape) != tuple(want.shape):
            return Incomparable(f"{path} has shape {tuple(got.shape)}, the oracle's is {tuple(want.shape)}",
                                expected=str(tuple(want.shape)), got=str(tuple(got.shape)))
        ref = refs.get(path)
        leaves.append(measure(got, ref if isinstance(ref, torch.Tensor) else None, want, path=path,
                              factor=tol.factor, ulps=tol.ulps, atol=tol.atol,
                              scale_at_least=(scales or {}).get(path, 0.0),
                              sensitivity=(sensitivity or {}).get(path, 0.0),
                              terms=None if terms is None else lambda path=path: magnitude(path)))
    return leaves


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
            leaves = measure_outputs(out, base.reference, base.oracle, tol,
                                     terms=lambda base=base: subject.terms(base.args))
            if isinstance(leaves, Incomparable):
                return self.failed(subject, leaves.message, case=case, expected=leaves.expected, got=leaves.got,
                                   broken=True)
            for leaf in leaves:
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
