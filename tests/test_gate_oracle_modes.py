"""The oracle gate's module probes: `nn.Module` kernels built in training mode are judged in eval mode too,
from both modules' buffers as built and, where a normalization layer is, their equal parameters and buffers
stepped alike, twice (two rounds), and left as they were; history-dependent modules over a sequence of calls on
one state; and every call of kernel, reference and oracle from one state (`kgate.subject.Lockstep`)."""

from __future__ import annotations

import torch
from gate_harness import catalogue, check, normal_inputs, subject_for

from kgate import gates as registry
from kgate.gates import isolation as isolation_gate
from kgate.gates import oracle as oracle_gate

_correct, _violating = catalogue("oracle", "correct"), catalogue("oracle", "violating")
_Reference, _BothModes = _correct.BatchNormReference, _correct.BatchNormBothModes
_BatchStatsAlways = _violating.BatchNormBatchStatsAlways


def test_a_module_right_only_in_training_mode_fails_in_eval_mode():
    result = check("oracle", _BatchStatsAlways(), _Reference(), _correct.make_batch)
    assert result.verdict == "fail", result.message
    assert result.message.startswith("in eval mode") and "in training mode within bound" in result.message
    assert result.details["mode"] == "eval"


def test_a_module_right_in_both_modes_passes_with_its_eval_mode_judged():
    result = check("oracle", _BothModes(), _Reference(), _correct.make_batch)
    assert result.verdict == "pass" and "and in eval mode in 1 case(s), 2 rounds" in result.message, \
        result.message
    assert sum(e.get("mode") == "eval" for e in result.evidence) == 4  # 2 rounds x (1 case + its second draw)


def test_unequal_calls_before_the_probe_do_not_blame_a_correct_module():
    """The gates call kernel and reference unequally often; a BatchNorm's running statistics follow its calls.
    The probe puts both modules' buffers back to their values as built first: without that the kernel's
    statistics (one call fewer) would disagree with the reference's in eval mode."""
    kernel, reference = _BothModes(), _Reference()
    subject = subject_for(kernel, reference, _correct.make_batch)
    for seed in range(3):  # the reference alone, three more calls (its running statistics move)
        reference(*_correct.make_batch(100 + seed))
    assert not torch.equal(kernel.bn.running_mean, reference.bn.running_mean)
    result = registry.get("oracle").check(subject)
    assert result.verdict == "pass", result.message

    kernel, reference = _BothModes(), _Reference()
    subject = subject_for(kernel, reference, _correct.make_batch)
    for seed in range(3):
        reference(*_correct.make_batch(100 + seed))
    subject._initial_buffers = None  # as if the buffers were not put back nor kept in lockstep: it is blamed
    subject.lockstep = None
    assert registry.get("oracle").check(subject).verdict == "fail"


def test_the_probe_leaves_modes_parameters_and_buffers_as_the_calls_left_them(monkeypatch):
    def run(probe: bool):
        torch.manual_seed(0)
        kernel, reference = _BothModes(), _Reference()
        if not probe:
            monkeypatch.setattr(oracle_gate.Oracle, "eval_mode", lambda self, subject, evidence: (None, ""))
        result = check("oracle", kernel, reference, _correct.make_batch)
        monkeypatch.undo()
        return result, kernel, reference

    probed, kernel, reference = run(True)
    plain, kernel0, reference0 = run(False)
    assert probed.verdict == plain.verdict == "pass"
    for after, before in ((kernel, kernel0), (reference, reference0)):
        assert all(m.training for m in after.modules())
        for (name, t), (_, t0) in zip(after.state_dict().items(), before.state_dict().items()):
            assert torch.equal(t, t0), name


def test_a_reference_that_raises_in_eval_mode_leaves_it_unjudged():
    class TrainingOnly(_Reference):
        def forward(self, x):
            if not self.training:
                raise RuntimeError("this model only trains")
            return self.bn(x)

    result = check("oracle", _BothModes(), TrainingOnly(), _correct.make_batch)
    assert result.verdict == "pass" and "not in eval mode (the reference raised there: RuntimeError)" in \
        result.message, result.message


def test_functions_and_modules_built_in_eval_mode_are_not_probed():
    result = check("oracle", lambda x: x * 2, lambda x: x * 2, _correct.make_batch)
    assert result.verdict == "pass" and "eval mode" not in result.message
    kernel, reference = _BatchStatsAlways().eval(), _Reference().eval()
    # built in eval mode: the reference normalises with the running statistics, the kernel with the batch's
    assert check("oracle", kernel, reference, _correct.make_batch).verdict == "fail"
    reference = _Reference().eval()
    both = check("oracle", _BothModes().eval(), reference, _correct.make_batch)
    assert both.verdict == "pass" and "eval mode" not in both.message


def test_parameters_are_stepped_only_where_a_normalization_layer_is():
    """Without a BatchNorm/InstanceNorm the eval-mode probe keeps the parameters (and saves only the buffers):
    a linear layer that caches its weight by address (isolation's business) is right in eval mode too."""
    isolation = catalogue("isolation", "violating"), catalogue("isolation", "correct")
    violating, correct = isolation
    result = check("oracle", violating.linear_cached_by_address, correct.linear_reference, correct.make_features)
    assert result.verdict == "pass" and "and in eval mode in 1 case(s)" in result.message, result.message
    assert "rounds" not in result.message  # one round: nothing stepped, nothing to find again
    failed = check("oracle", _BatchStatsAlways(), _Reference(), _correct.make_batch)
    assert "parameters and buffers stepped alike" in failed.message


def test_a_formula_right_only_while_the_running_mean_is_zero_fails_once_the_buffers_are_stepped(monkeypatch):
    """As built a running mean is 0: an eval formula that mishandles it is right there. The probe moves the
    buffers too (a running mean's zeros get noise); without that, the flawed formula passes."""
    shift_unscaled = _violating.BatchNormEvalShiftUnscaled
    failed = check("oracle", shift_unscaled(), _Reference(), _correct.make_batch)
    assert failed.verdict == "fail" and failed.details["mode"] == "eval", failed.message
    from kgate.gates import isolation

    step = isolation.ParameterClass.apply_step
    monkeypatch.setattr(isolation.ParameterClass, "apply_step",
                        lambda self, seed, offset_zeros=False: step(self, seed, False))
    _no_sequence(monkeypatch)  # (which moves the running mean by its calls)
    assert check("oracle", shift_unscaled(), _Reference(), _correct.make_batch).verdict == "pass"


def test_a_fold_kept_from_the_first_eval_call_fails_in_the_second_round_and_a_versioned_one_passes(monkeypatch):
    kept, versioned = _violating.BatchNormEvalFoldKept, _correct.BatchNormEvalFoldVersioned
    failed = check("oracle", kept(), _Reference(), _correct.make_batch)
    assert failed.verdict == "fail" and "stepped alike again after 1 eval-mode call(s)" in failed.message, \
        failed.message
    assert failed.details["setting"].startswith("parameters and buffers stepped alike again")
    assert check("oracle", versioned(), _Reference(), _correct.make_batch).verdict == "pass"
    monkeypatch.setattr(oracle_gate, "EVAL_ROUNDS", 1)  # one round: the fold is made from the stepped state
    _no_sequence(monkeypatch)  # (whose eval-mode calls after new buffers find the kept fold too)
    assert check("oracle", kept(), _Reference(), _correct.make_batch).verdict == "pass"


def _no_sequence(monkeypatch) -> None:
    monkeypatch.setattr(oracle_gate.Oracle, "state_sequence", lambda self, subject, case, evidence: (None, ""))


def test_zero_buffers_are_offset_only_when_asked_and_other_buffers_are_scaled():
    from kgate.gates.isolation import parameter_classes

    kernel, reference = _Reference(), _Reference()
    classes = {c.reference[0][0]: c for c in parameter_classes(kernel, reference)}
    mean, var = classes["bn.running_mean"], classes["bn.running_var"]
    mean.apply_step(3)
    assert not kernel.bn.running_mean.any()  # scaled, zeros stay zero
    mean.apply_step(3, offset_zeros=True)
    assert kernel.bn.running_mean.abs().max() > 0 and torch.equal(kernel.bn.running_mean, reference.bn.running_mean)
    assert kernel.bn.running_mean.abs().max() < 0.5
    var.apply_step(3, offset_zeros=True)
    assert torch.all((kernel.bn.running_var >= 0.5) & (kernel.bn.running_var < 1.5))
    assert torch.equal(kernel.bn.running_var, reference.bn.running_var)


class _Ema(torch.nn.Module):
    """A linear layer with an exponential moving average of its parameters: each training-mode call folds the live
    parameters into the EMA buffers with the warm-up decay min(0.999, (1 + n) / (10 + n)), n the updates so far;
    eval mode applies the EMA parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 8)
        self.register_buffer("ema_weight", self.linear.weight.detach().clone())
        self.register_buffer("ema_bias", self.linear.bias.detach().clone())
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    def decay(self, n: int) -> float:
        return min(0.999, (1.0 + n) / (10.0 + n))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                d = self.decay(int(self.num_updates))
                self.ema_weight.copy_(d * self.ema_weight + (1.0 - d) * self.linear.weight)
                self.ema_bias.copy_(d * self.ema_bias + (1.0 - d) * self.linear.bias)
                self.num_updates += 1
            return torch.nn.functional.linear(x, self.linear.weight, self.linear.bias)
        return torch.nn.functional.linear(x, self.ema_weight, self.ema_bias)


class _EmaForeach(_Ema):
    """The same EMA with foreach updates (other rounding) and addmm."""

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                d = self.decay(int(self.num_updates))
                emas, live = [self.ema_weight, self.ema_bias], [self.linear.weight, self.linear.bias]
                torch._foreach_mul_(emas, d)
                torch._foreach_add_(emas, live, alpha=1.0 - d)
                self.num_updates += 1
            return torch.addmm(self.linear.bias, x, self.linear.weight.t())
        return torch.addmm(self.ema_bias, x, self.ema_weight.t())


class _EmaCounterFirst(_Ema):
    """The counter advanced before the decay is taken: (2 + n) / (11 + n). The EMA equals the parameters until
    they move, so only a training call after a parameter step shows it."""

    def decay(self, n: int) -> float:
        return super().decay(n + 1)


class _EmaEvalPackByCounter(_Ema):
    """Eval mode's transposed EMA weight packed once per value of the update counter: EMA buffers loaded
    without a training call (a checkpoint at the same step) are not seen."""

    def forward(self, x):
        if self.training:
            return super().forward(x)
        step = int(self.num_updates)
        if getattr(self, "_pack", (None,))[0] != step:
            self._pack = (step, self.ema_weight.t().clone(), self.ema_bias.clone())
        _, w, b = self._pack
        return torch.addmm(b, x, w)


def _rows(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (32, 16), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


def test_a_history_dependent_module_right_in_every_call_passes_the_sequence():
    result = check("oracle", _EmaForeach(), _Ema(), _rows, shapes=[[32, 16]])
    assert result.verdict == "pass" and "a sequence of 9 calls on one state" in result.message, result.message
    assert sum("sequence" in e for e in result.evidence) >= 8


def test_a_decay_taken_after_the_counter_moved_fails_on_the_buffer_after_a_parameter_step():
    result = check("oracle", _EmaCounterFirst(), _Ema(), _rows, shapes=[[32, 16]])
    assert result.verdict == "fail", result.message
    assert result.message.startswith("over a sequence of calls on one state") and "buffer" in result.message
    assert "an optimizer-style step of the parameters" in result.details["sequence"]


def test_an_eval_pack_keyed_on_the_counter_is_stale_after_new_buffers_at_the_same_step():
    """New buffer values at the same counter: the eval-mode probe's buffer step finds the stale pack first; the
    sequence's new values loaded between two eval-mode calls find it too."""
    result = check("oracle", _EmaEvalPackByCounter(), _Ema(), _rows, shapes=[[32, 16]])
    assert result.verdict == "fail" and result.details["mode"] == "eval", result.message
    assert "buffers stepped alike" in result.message
    subject = subject_for(_EmaEvalPackByCounter(), _Ema(), _rows, shapes=[[32, 16]])
    subject.run_reference(_rows(1))  # (a call that writes the buffers: the module is history-dependent)
    failed, _ = oracle_gate.Oracle().state_sequence(subject, subject.cases[0], [])
    assert failed is not None and failed.verdict == "fail", failed
    assert failed.details["sequence"][-2].startswith("new values loaded into the floating-point buffers")


def test_a_merge_right_on_the_first_step_only_fails_over_the_sequence():
    result = check("oracle", _violating.RunningStandardizerPooled(), _correct.RunningStandardizer(),
                   _correct.make_observations, shapes=[[64, 8]])
    assert result.verdict == "fail" and result.message.startswith("over a sequence"), result.message


def test_a_module_whose_forward_writes_no_buffer_gets_no_sequence():
    result = check("oracle", _BothModes(), _Reference(), _correct.make_batch)
    assert "a sequence of" in result.message  # BatchNorm in training mode writes its running statistics
    linear = torch.nn.Linear(16, 4)
    result = check("oracle", linear, linear, _correct.make_batch)
    assert result.verdict == "pass" and "sequence" not in result.message, result.message


def test_the_sequence_leaves_modes_parameters_and_buffers_as_they_were():
    kernel, reference = _EmaForeach(), _Ema()
    subject = subject_for(kernel, reference, _rows, shapes=[[32, 16]])
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in (kernel, reference)]
    subject.run_reference(_rows(1))
    subject.lockstep.state = {k: v.clone() for k, v in subject.lockstep.state.items()}
    saved = {k: v.clone() for k, v in subject.lockstep.state.items()}
    failed, note = oracle_gate.Oracle().state_sequence(subject, subject.cases[0], [])
    assert failed is None and note
    assert all(m.training for m in (kernel, reference))
    for module, state in zip((kernel, reference), before):
        for name, value in module.state_dict().items():
            if "ema" not in name and name != "num_updates":  # (buffers: the calls before moved them)
                assert torch.equal(value, state[name]), name
    assert all(torch.equal(saved[k], v) for k, v in subject.lockstep.state.items())


def test_kernel_reference_and_oracle_each_start_every_call_from_one_state():
    """A correct history-dependent module whose state the earlier probes moved unequally (here: the kernel called
    alone on all-NaN inputs, which poisons its running statistics) is still judged from the reference's state;
    without the lockstep it is blamed."""
    def run(lockstep: bool):
        kernel, reference = _correct.RunningStandardizerWeights(), _correct.RunningStandardizer()
        subject = subject_for(kernel, reference, _correct.make_observations, shapes=[[64, 8]])
        if not lockstep:
            subject.lockstep = None
        subject.run_kernel((torch.full((4, 8), float("nan")),))
        return registry.get("shapes").check(subject)

    assert run(True).verdict == "pass"
    assert run(False).verdict == "fail"


def test_a_state_carried_from_one_eval_mode_call_to_the_next_fails_on_the_second_draw():
    """A module without buffers that, in eval mode, starts each call's running sum from the last call's total (a
    streaming cache for inference over chunks): its first eval-mode call is right, the second draw at the same
    shape is not. Without the second draw the probe passes it."""
    bad = check("oracle", _violating.CumulativeSumStreamingInEval(), _correct.CumulativeSum(),
                _correct.make_observations)
    assert bad.verdict == "fail" and bad.details["mode"] == "eval", bad.message
    good = check("oracle", _correct.CumulativeSum(), _correct.CumulativeSum(), _correct.make_observations)
    assert good.verdict == "pass" and "and in eval mode in 1 case(s)" in good.message, good.message


def test_a_fused_layer_holding_the_batchnorm_under_other_names_is_kept_in_lockstep(monkeypatch):
    """A kernel module that wraps its BatchNorm under other attribute names (a DenseNet rewritten with a fused
    BN-ReLU layer of its own) keeps running statistics that stand for the reference's: paired by order and value,
    they are set to the lockstep state before its calls like the reference's. Paired by name only, they follow
    every call the gate makes of the kernel while the reference's start each call from the state, and the
    sequence's eval-mode call blames a correct kernel."""
    good = check("oracle", _correct.FusedNormLayer(), _Reference(), _correct.make_batch)
    assert good.verdict == "pass" and "a sequence of" in good.message, good.message
    bad = check("oracle", _violating.FusedNormLayerMomentumDoubled(), _Reference(), _correct.make_batch)
    assert bad.verdict == "fail", bad.message

    from kgate import subject as subject_module

    monkeypatch.setattr(subject_module, "pair_buffers",
                        lambda kernel, reference: {n: n for n in reference if n in kernel})
    blamed = check("oracle", _correct.FusedNormLayer(), _Reference(), _correct.make_batch)
    assert blamed.verdict == "fail" and blamed.message.startswith("over a sequence"), blamed.message


def test_buffers_are_paired_by_name_then_by_order_and_value():
    from kgate.subject import pair_buffers

    zeros, ones = torch.zeros(4), torch.ones(4)
    reference = {"a.mean": zeros, "a.var": ones, "b.mean": zeros.clone(), "count": torch.zeros((), dtype=torch.long)}
    # by name where the names agree; the others in order, skipping a cache of the kernel's own (other values)
    kernel = {"count": torch.zeros((), dtype=torch.long), "x.mean": zeros.clone(), "cache": torch.full((4,), 7.0),
              "x.var": ones.clone(), "y.mean": zeros.clone() + 1e-9}
    assert pair_buffers(kernel, reference) == {"count": "count", "x.mean": "a.mean", "x.var": "a.var",
                                               "y.mean": "b.mean"}
    # a reference buffer with no partner in order: none paired by order, the names still are
    assert pair_buffers({"count": torch.zeros((), dtype=torch.long), "x.mean": zeros.clone()}, reference) == \
        {"count": "count"}
    # values far apart (not the same statistics) are not paired
    assert pair_buffers({"x.mean": zeros + 5, "x.var": ones.clone(), "y.mean": zeros.clone(),
                         "count": torch.zeros((), dtype=torch.long)}, reference) == {"count": "count"}


def test_a_formula_right_only_for_buffers_as_built_fails_once_the_buffers_are_stepped(monkeypatch):
    """A class-weight buffer is all ones as built: a weighted mean divided by the sample count is right there. The
    eval-mode probe steps the modules' equal buffers even where no normalization layer is (the parameters stay);
    without the step, the flawed formula passes, and the correct one passes with it."""
    over_count, gathered = _violating.ClassWeightedMeanOverCount, _correct.ClassWeightedMeanGathered
    failed = check("oracle", over_count(), _correct.ClassWeightedMean(), _correct.make_labelled)
    assert failed.verdict == "fail" and failed.details["mode"] == "eval", failed.message
    assert "buffers stepped alike" in failed.message and "parameters" not in failed.message
    good = check("oracle", gathered(), _correct.ClassWeightedMean(), _correct.make_labelled)
    assert good.verdict == "pass" and "2 rounds (buffers stepped before each)" in good.message, good.message
    monkeypatch.setattr(oracle_gate, "parameter_classes",
                        lambda *modules: [c for c in isolation_gate.parameter_classes(*modules) if c.kind != "buffer"])
    assert check("oracle", over_count(), _correct.ClassWeightedMean(), _correct.make_labelled).verdict == "pass"


# --- an empty batch in the sequence of calls ------------------------------------------------------------------------

class _Standardizer(torch.nn.Module):
    """Running mean and sum of squared deviations merged batch by batch (Chan's update), the batch standardised
    by the running statistics; an empty batch leaves them as they were."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("m2", torch.zeros(8))

    def merge(self, x):
        n_b = float(x.shape[0])
        if n_b == 0:
            return
        self._merge(x, n_b)

    def _merge(self, x, n_b):
        mean_b = x.mean(0)
        m2_b = ((x - mean_b) ** 2).sum(0)
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean.add_(delta * n_b / n)
        self.m2.add_(m2_b + delta * delta * self.count * n_b / n)
        self.count.copy_(n)

    def forward(self, x):
        with torch.no_grad():
            self.merge(x)
        var = self.m2 / self.count.clamp_min(1.0)
        return (x - self.mean) / torch.sqrt(var + 1e-5)


class _StandardizerUnguarded(_Standardizer):
    """The merge without the guard: an empty batch's mean is NaN, weighted by 0, and NaN * 0 is NaN for good."""

    def merge(self, x):
        self._merge(x, float(x.shape[0]))


_batches = normal_inputs((16, 8))


def test_a_running_merge_poisoned_by_an_empty_batch_fails_the_sequence_and_the_guarded_one_passes():
    result = check("oracle", _StandardizerUnguarded(), _Standardizer(), _batches)
    assert result.verdict == "fail", result.message
    assert "an empty batch (size 0 in dimension 0)" in result.message, result.message
    good = check("oracle", _Standardizer(), _Standardizer(), _batches)
    assert good.verdict == "pass" and "on an empty batch" in good.message, good.message
