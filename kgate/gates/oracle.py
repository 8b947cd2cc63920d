"""oracle: agreement with the float64 oracle within the bound calibrated from the reference's own
error in the kernel's dtype (formula in kgate/oracle.py). Judged on every case of the sweep, and where
kernel and reference are `nn.Module`s built in training mode, again in eval mode (`module.eval()`, as
inference calls them) on the first case of each shape and dtype, and on a second draw of the first case's
inputs (a state carried from one eval-mode call to the next: a streaming cache): both modules' buffers as built and
their equal buffers and, where they hold a normalization layer (BatchNorm, InstanceNorm), their equal parameters
moved alike by an optimizer-style step (as built, a BatchNorm's weight is 1, its bias 0, its running mean 0 and
its running variance 1, and a class-weight buffer all ones, which hide a wrong formula), then moved again for a
second round (an inference fold computed once and kept is stale there). A BatchNorm that always normalises with the batch's statistics, an
inference path of its own with a wrong formula, or a cached fold, is right in training mode only."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.batchnorm import _NormBase

from kgate.compare import clone_tree, flatten, structure
from kgate.gates.base import Gate, GateResult
from kgate.gates.isolation import parameter_classes
from kgate.inputs import Case
from kgate.manifest import Tolerance
from kgate.oracle import BROKEN_FACTOR, LeafError, Terms, measure
from kgate.subject import ModuleState, Subject, UserCodeError, unless_rejected

EVAL_SEED = 7727  # seeds the steps of the parameters and buffers before the eval-mode rounds
EVAL_DRAW_SEED = 7741  # the eval-mode probe's second draw of the first case's inputs
EVAL_ROUNDS = 2  # eval-mode rounds where the state is stepped: the second finds a fold kept from the first


@dataclass
class Incomparable:
    """The kernel's output cannot be measured against the oracle (structure or shape differs)."""

    message: str
    expected: str | None = None
    got: str | None = None


def measure_outputs(out: Any, reference: Any, oracle: Any, tol: Tolerance,
                    scales: dict[str, float] | None = None,
                    sensitivity: dict[str, float] | Callable[[], dict[str, float]] | None = None,
                    terms: Callable[[], dict[str, Terms]] | None = None) -> Incomparable | list[LeafError]:
    """The oracle gate's judgement of one output tree: one LeafError per tensor leaf, or why none.

    Shared by every gate that judges against the oracle bound (shapes, layouts, distributions, ...).
    `scales` (output path -> magnitude) raises the magnitude each leaf's floor is taken of; `sensitivity`
    (output path -> the oracle's change when the inputs move by an ulp) the least reference error, or a callable
    that gives it, called at most once and only where a leaf needs it (`measure`); `terms`
    (`Subject.terms` on the inputs: output path -> the magnitudes of the terms the oracle's computation
    combines) is called at most once, and only where a leaf misses the bound otherwise (`measure`)."""
    if structure(out) != structure(oracle):
        return Incomparable("output structure differs from the reference's: cannot compare",
                            expected=structure(oracle), got=structure(out))
    refs = dict(flatten(reference))
    oracles = dict(flatten(oracle))
    leaves = []
    known: list[dict[str, Terms]] = []

    moves: list[dict[str, float]] = []

    def moved(path: str) -> float:
        if not moves:
            moves.append(sensitivity() if callable(sensitivity) else {})
        return moves[0].get(path, 0.0)

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
                              sensitivity=(lambda path=path: moved(path)) if callable(sensitivity)
                              else (sensitivity or {}).get(path, 0.0),
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
            failed, sequence = self.state_sequence(subject, subject.first_seed_cases()[0], evidence)
            if failed is not None:
                return failed
            note += sequence
            return self.passed(f"within bound in {len(subject.cases)} case(s); worst {ratio:.2g} x bound "
                               f"({leaf.path}, {case.label()}){note}", evidence=evidence)
        return self.failed(subject, leaf.describe(), case=case, expected=f"{leaf.expected!r} (float64 oracle)",
                           got=repr(leaf.got), where=leaf.where, broken=ratio > BROKEN_FACTOR, evidence=evidence,
                           details={"ratio": ratio})

    def eval_mode(self, subject: Subject, evidence: list) -> tuple[GateResult | None, str]:
        """Kernel and reference modules built in training mode, judged again in eval mode on the first case of
        each shape and dtype, from their buffers as built (the gates call the two unequally often, and a
        BatchNorm's running statistics follow its calls), everything put back after. Their equal buffers and,
        where a normalization layer is, their equal parameters (isolation's `ParameterClass`; a running mean's
        zeros get noise) are stepped alike before the first round, and again before a second round: an inference fold computed
        once (at construction, or at the first eval-mode call) and kept is stale there. Returns (a failure or
        None, a note for the pass message)."""
        modules = subject.modules()
        if modules is None or not modules[1].training:
            return None, ""
        modes = [(m, m.training) for module in modules for m in module.modules()]
        # the steps: a normalization layer's state as built (weight 1, bias 0, running mean 0, running variance 1)
        # hides a wrong inference formula, and so does any buffer as built (a class-weight buffer of ones hides a
        # loss divided by the count where the weights' sum belongs); without a normalization layer the parameters
        # stay (their changes are the isolation gate's), and only the buffers are saved and stepped (no copy of a
        # large model's weights)
        step = any(isinstance(m, _NormBase) for module in modules for m in module.modules())
        state = ModuleState(subject, modules, parameters=step)
        judged: list[int] = []  # cases judged in each round
        try:
            subject.initial_buffers()
            try:
                classes = [c for c in parameter_classes(*modules) if step or c.kind == "buffer"]
                moved = "parameters and buffers" if any(c.kind == "parameter" for c in classes) else "buffers"
            except Exception:  # noqa: BLE001 - a module's own state_dict hooks may raise: the state as built
                classes, moved = [], ""
            for module in modules:
                module.eval()
            for round_ in range(EVAL_ROUNDS if classes else 1):
                for c in classes:
                    c.apply_step(EVAL_SEED + round_, offset_zeros=True)
                subject.changed_state()
                setting = ("buffers as built" if not classes else
                           f"buffers as built, {moved} stepped alike" if round_ == 0 else
                           f"{moved} stepped alike again after {sum(judged)} eval-mode call(s)")
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
            (f", {len(judged)} rounds ({moved} stepped before each)" if len(judged) > 1 else "")

    def _eval_round(self, subject: Subject, evidence: list, setting: str) -> GateResult | str | int:
        """One round of the eval-mode probe on the first case of each shape and dtype, then on another draw of the
        first (`EVAL_DRAW_SEED`): a second eval-mode call at one shape, which a state carried from one eval-mode
        call to the next (a streaming cache of the last state) gets wrong. A failure, a note (the reference raised:
        not judged in eval mode), or the number of cases judged."""
        judged = 0
        cases = subject.first_seed_cases()
        for n, case in enumerate(cases + [Case(cases[0].shape, cases[0].dtype, EVAL_DRAW_SEED)]):
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
            judged += n < len(cases)  # the second draw is judged, not counted
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


    def state_sequence(self, subject: Subject, case: Case, evidence: list) -> tuple[GateResult | None, str]:
        """A history-dependent module (the reference's forward writes its buffers: `Lockstep.stateful`) judged
        over one seeded sequence of calls, made alike on kernel, reference and float64 oracle from one state
        (`SEQUENCE`): training calls on other draws, on inputs shifted away from the statistics so far and at
        another batch size and on an empty batch (whose running state must come out as the reference's: a merge
        without a guard for no rows poisons it for good), an optimizer-style step of the parameters between
        training calls, eval-mode calls,
        and new values loaded into the floating-point buffers (the counters kept) between two eval-mode calls
        on the same inputs. After every call each output is judged against the oracle within the bound, and
        each floating-point buffer the two modules share (same name, shape and dtype) against the oracle's
        (an integer one, a counter, exactly against the reference's); the reference's buffers are then the
        state the next call starts from. An update that is right on the first step only (a decay taken after
        the counter moved, a merge that leaves out a term that is 0 while the prior count is small, a batch
        size fixed at the first call, an eval-mode pack keyed on the counter) shows within a few calls.
        Everything is put back after. Returns (a failure or None, a note for the pass message)."""
        modules = subject.modules()
        lock = subject.lockstep
        if modules is None or lock is None or not lock.stateful:
            return None, ""
        state = ModuleState(subject, modules)
        modes = [(m, m.training) for module in modules for m in module.modules()]
        trained = modules[1].training
        done: list[str] = []
        calls = 0
        subject.sync_buffers()  # (the classes of equal buffers are found on the state the calls start from)
        try:
            try:
                classes = parameter_classes(*modules)
            except Exception:  # noqa: BLE001 - a module's own state_dict hooks may raise: no steps then
                classes = []
            for label, step in _sequence(subject, case, classes, trained):
                if subject.out_of_time() and done:
                    break
                if isinstance(step, tuple):  # a call on these inputs
                    failed = self._sequence_call(subject, case, step, label, done, evidence)
                    if isinstance(failed, GateResult):
                        return failed, ""
                    if failed is None:  # the reference rejects them: not part of the sequence
                        continue
                    calls += 1
                else:
                    step()
                    subject.changed_state()
                done.append(label)
        finally:
            for m, training in modes:
                m.training = training
            state.close()
        return None, f"; a sequence of {calls} calls on one state ({', '.join(done)}) within bound"

    def _sequence_call(self, subject: Subject, case: Case, args: tuple, label: str, done: list[str],
                       evidence: list) -> GateResult | bool | None:
        """One call of the sequence: a failure, True (judged) or None (the reference rejects the inputs)."""
        lock = subject.lockstep
        assert lock is not None
        outputs = unless_rejected(lambda: (subject.run_reference(clone_tree(args)), subject.oracle(args)))
        if outputs is None:
            return None
        reference, oracle = outputs
        expected_buffers = _buffers(lock.reference, lock.reference_names())
        oracle_buffers = _buffers(subject.oracle_module(), lock.reference_names())
        out = subject.run_kernel(clone_tree(args))
        got_buffers = lock.kernel_buffers()  # under the reference's names
        sequence = ", ".join(done + [label])
        leaves = measure_outputs(out, reference, oracle, subject.tolerance, terms=lambda: subject.terms(args))
        if isinstance(leaves, Incomparable):
            return self.failed(subject, f"after the calls {sequence}: {leaves.message}", case=case,
                               expected=leaves.expected, got=leaves.got, broken=True,
                               details={"sequence": done + [label]})
        tol = subject.tolerance
        for name, t in got_buffers.items():
            if t.is_floating_point() and oracle_buffers is not None and name in oracle_buffers:
                kind = "parameter" if name in lock.written else "buffer"
                leaves.append(measure(t, expected_buffers[name], oracle_buffers[name], path=f"{kind} {name!r}",
                                      factor=tol.factor, ulps=tol.ulps, atol=tol.atol))
        for leaf in leaves:
            evidence.append({"case": case.to_json(), "sequence": done + [label], **leaf.to_json()})
            if not leaf.passed:
                return self.failed(
                    subject, f"over a sequence of calls on one state ({sequence}): after the last, "
                    f"{leaf.describe()}", case=case, expected=f"{leaf.expected!r} (float64 oracle)",
                    got=repr(leaf.got), where=leaf.where, broken=leaf.ratio > BROKEN_FACTOR,
                    details={"ratio": leaf.ratio, "sequence": done + [label]})
        for name, t in got_buffers.items():
            if not t.is_floating_point() and not torch.equal(t, expected_buffers[name]):
                return self.failed(
                    subject, f"over a sequence of calls on one state ({sequence}): the module's buffer {name!r} "
                    f"after the last holds {t.tolist()}, the reference's {expected_buffers[name].tolist()}",
                    case=case, expected=str(expected_buffers[name].tolist()), got=str(t.tolist()), where=name,
                    broken=True, details={"sequence": done + [label]})
        subject.adopt_state()  # the next call starts from the reference's buffers after this one
        return True


SEQUENCE_SEED = 15485863  # seeds the inputs and the steps of the state-sequence probe
SHIFT = 4.0  # the shifted training batch: its floating-point inputs moved by this many spreads (plus one)


def _buffers(module: torch.nn.Module | None, names: list[str]) -> dict[str, torch.Tensor] | None:
    """Copies of `module`'s buffers of `names` (None for no module)."""
    if module is None:
        return None
    own = {**dict(module.named_parameters()), **dict(module.named_buffers())}  # (parameters its forward writes)
    return {n: own[n].detach().clone() for n in names if n in own}


def _shifted(args: tuple) -> tuple:
    """`args` with every floating-point tensor moved by SHIFT times its spread plus one (a batch whose mean is
    far from the statistics so far)."""
    def move(t: torch.Tensor) -> torch.Tensor:
        spread = float(t.double().std()) if t.numel() > 1 else 1.0
        return (t.double() + SHIFT * (spread if math.isfinite(spread) else 1.0) + 1.0).to(t.dtype)
    return tuple(move(a) if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() else
                 clone_tree(a) for a in args)


def _sequence(subject: Subject, case: Case, classes: list, trained: bool) -> Iterator[tuple[str, Any]]:
    """The state-sequence probe's steps, in order: (label, inputs) for a call, (label, action) for a change of
    the modules (`Oracle.state_sequence`)."""
    def inputs(k: int, shape: tuple[int, ...] | None = case.shape) -> tuple:
        return subject.inputs(Case(shape, case.dtype, SEQUENCE_SEED + k))

    def mode(training: bool) -> Callable[[], None]:
        def switch() -> None:
            for module in subject.modules() or ():
                module.train(training)
        return switch

    parameters = [c for c in classes if c.kind == "parameter"]
    buffers = [c for c in classes if c.kind == "buffer"]
    call = "train" if trained else "call"
    yield f"{call} (seed {SEQUENCE_SEED})", inputs(0)
    yield f"{call} on inputs shifted by {SHIFT:g} spreads", _shifted(inputs(1))
    empty = _empty_batch(inputs(1))
    if empty is not None:  # (where the reference rejects it, it is not part of the sequence)
        yield f"{call} on an empty batch (size 0 in dimension 0)", empty
    if parameters:
        yield "an optimizer-style step of the parameters", lambda: [c.apply_step(SEQUENCE_SEED) for c in parameters]
    other = _other_batch(subject, case)
    yield (f"{call} at batch {other[0]}", inputs(2, other)) if other else (f"{call} (seed {SEQUENCE_SEED + 2})",
                                                                          inputs(2))
    yield f"{call} (seed {SEQUENCE_SEED + 3})", inputs(3)
    if trained:
        yield "eval mode", mode(False)
        yield f"eval (seed {SEQUENCE_SEED + 4})", inputs(4)
    if buffers:
        yield "new values loaded into the floating-point buffers (counters kept)", \
            lambda: [c.apply_step(SEQUENCE_SEED + 1, offset_zeros=True) for c in buffers]
        yield (f"eval (seed {SEQUENCE_SEED + 4}) again" if trained else f"call (seed {SEQUENCE_SEED + 4})"), \
            inputs(4)
    if trained:
        yield "training mode", mode(True)
        yield f"train (seed {SEQUENCE_SEED + 5})", inputs(5)
        yield "eval mode", mode(False)
        yield f"eval (seed {SEQUENCE_SEED + 4}) again", inputs(4)


def _empty_batch(args: tuple) -> tuple | None:
    """`args` with every tensor whose dimension 0 has the first tensor's size sliced to none of it (a batch of no
    rows: a data loader's last, a filtered batch); None where no tensor has a dimension or the batch is already
    empty. A merge of batch statistics that has no guard for it takes a mean of nothing (NaN) with weight 0
    into its running state, and every later call is NaN."""
    sized = [a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0]
    if not sized or sized[0].shape[0] == 0:
        return None
    batch = sized[0].shape[0]
    return tuple(a[:0].clone() if isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch else a
                 for a in args)


def _other_batch(subject: Subject, case: Case) -> tuple[int, ...] | None:
    """The case's shape with another size in dimension 0 (about half, and odd), where the factory makes inputs
    of it; None where the case has no shape or the factory refuses."""
    if not case.shape or case.shape[0] < 2:
        return None
    shape = (case.shape[0] // 2 + 1,) + tuple(case.shape[1:])
    try:
        subject.inputs(Case(shape, case.dtype, SEQUENCE_SEED))
    except UserCodeError:
        return None
    return shape


GATE = Oracle
