"""oracle: agreement with the float64 oracle within the bound calibrated from the reference's own
error in the kernel's dtype (formula in kgate/oracle.py). Judged on every case of the sweep, and where
kernel and reference are `nn.Module`s built in training mode, again in eval mode (`module.eval()`, as
inference calls them) on the first case of each shape and dtype: both modules' buffers as built and, where
they hold a normalization layer (BatchNorm, InstanceNorm), their equal parameters and buffers moved alike by
an optimizer-style step (as built, a BatchNorm's weight is 1, its bias 0, its running mean 0 and its running
variance 1, which hide a wrong inference formula), then moved again for a second round (an inference fold
computed once and kept is stale there). A BatchNorm that always normalises with the batch's statistics, an
inference path of its own with a wrong formula, or a cached fold, is right in training mode only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.batchnorm import _NormBase

from kgate.compare import clone_tree, flatten, structure
from kgate.gates.base import Gate, GateResult
from kgate.gates.isolation import parameter_classes
from kgate.manifest import Tolerance
from kgate.oracle import BROKEN_FACTOR, LeafError, Terms, measure
from kgate.subject import ModuleState, Subject, UserCodeError

EVAL_SEED = 7727  # seeds the steps of the parameters and buffers before the eval-mode rounds
EVAL_ROUNDS = 2  # eval-mode rounds where the state is stepped: the second finds a fold kept from the first


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
            failed, note = self.eval_mode(subject, evidence)
            if failed is not None:
                return failed
            return self.passed(f"within bound in {len(subject.cases)} case(s); worst {ratio:.2g} x bound "
                               f"({leaf.path}, {case.label()}){note}", evidence=evidence)
        return self.failed(subject, leaf.describe(), case=case, expected=f"{leaf.expected!r} (float64 oracle)",
                           got=repr(leaf.got), where=leaf.where, broken=ratio > BROKEN_FACTOR, evidence=evidence,
                           details={"ratio": ratio})

    def eval_mode(self, subject: Subject, evidence: list) -> tuple[GateResult | None, str]:
        """Kernel and reference modules built in training mode, judged again in eval mode on the first case of
        each shape and dtype, from their buffers as built (the gates call the two unequally often, and a
        BatchNorm's running statistics follow its calls), everything put back after. Where a normalization layer
        is, their equal parameters and buffers (isolation's `ParameterClass`; a running mean's zeros get noise)
        are stepped alike before the first round, and again before a second round: an inference fold computed
        once (at construction, or at the first eval-mode call) and kept is stale there. Returns (a failure or
        None, a note for the pass message)."""
        modules = subject.modules()
        if modules is None or not modules[1].training:
            return None, ""
        modes = [(m, m.training) for module in modules for m in module.modules()]
        # the steps are for normalization layers, whose state as built (weight 1, bias 0, running mean 0, running
        # variance 1) hides a wrong inference formula; elsewhere the parameters stay, and only the buffers are saved
        # (no copy of a large model's weights)
        step = any(isinstance(m, _NormBase) for module in modules for m in module.modules())
        state = ModuleState(subject, modules, parameters=step)
        judged: list[int] = []  # cases judged in each round
        try:
            subject.initial_buffers()
            try:
                classes = parameter_classes(*modules) if step else []
            except Exception:  # noqa: BLE001 - a module's own state_dict hooks may raise: the state as built
                classes = []
            for module in modules:
                module.eval()
            for round_ in range(EVAL_ROUNDS if classes else 1):
                for c in classes:
                    c.apply_step(EVAL_SEED + round_, offset_zeros=True)
                subject.drop_converted_references()
                setting = ("buffers as built" if not classes else
                           "buffers as built, parameters and buffers stepped alike" if round_ == 0 else
                           f"parameters and buffers stepped alike again after {sum(judged)} eval-mode call(s)")
                failed = self._eval_round(subject, evidence, setting)
                if isinstance(failed, GateResult):
                    return failed, ""
                if isinstance(failed, str):
                    return None, failed
                judged.append(failed)
        finally:
            for m, training in modes:
                m.training = training
            state.close()
        return None, f"; and in eval mode in {judged[0]} case(s)" + \
            (f", {len(judged)} rounds (parameters and buffers stepped before each)" if len(judged) > 1 else "")

    def _eval_round(self, subject: Subject, evidence: list, setting: str) -> GateResult | str | int:
        """One round of the eval-mode probe on the first case of each shape and dtype: a failure, a note (the
        reference raised: not judged in eval mode), or the number of cases judged."""
        judged = 0
        for case in subject.first_seed_cases():
            args = subject.inputs(case)
            try:
                reference = subject.run_reference(clone_tree(args))
                oracle = subject.oracle(args)
            except UserCodeError as exc:
                if not exc.role.startswith("reference"):
                    raise
                return f"; not in eval mode (the reference raised there: {type(exc.exc).__name__})"
            out = subject.run_kernel(clone_tree(args))
            leaves = measure_outputs(out, reference, oracle, subject.tolerance,
                                     terms=lambda args=args: subject.terms(args))
            if isinstance(leaves, Incomparable):
                return self.failed(subject, f"in eval mode (module.eval(); {setting}): {leaves.message}", case=case,
                                   expected=leaves.expected, got=leaves.got, broken=True,
                                   details={"mode": "eval", "setting": setting})
            judged += 1
            for leaf in leaves:
                evidence.append({"case": case.to_json(), "mode": "eval", **leaf.to_json()})
                if not leaf.passed:
                    return self.failed(
                        subject, f"in eval mode (module.eval(); {setting}; in training mode within bound): "
                        f"{leaf.describe()}", case=case,
                        expected=f"{leaf.expected!r} (float64 oracle, eval mode)", got=repr(leaf.got),
                        where=leaf.where, broken=leaf.ratio > BROKEN_FACTOR,
                        details={"ratio": leaf.ratio, "mode": "eval", "setting": setting})
        return judged


GATE = Oracle
