"""isolation, the parameters probe: an nn.Module kernel whose parameters change in place between calls (an
optimizer step, load_state_dict) must follow them as its reference does; a cache of a derived weight that
is not refreshed is caught, one refreshed on every change passes. Also through the audit's wrappers."""

from __future__ import annotations

import copy

import pytest
import torch

from kgate import gates as registry
from kgate.gates.isolation import _load_changed, parameter_classes
from kgate.kernelbench import NoGrad
from kgate.oracle import DtypeDispatch
from tests.gate_harness import check, normal_inputs, subject_for


def features(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (5, 12), generator=gen, dtype=torch.float64).to(dtype),)


class Linear(torch.nn.Module):
    def __init__(self, d_in=12, d_out=7):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(torch.randn(d_out, d_in, generator=gen) / d_in ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(d_out, generator=gen))

    def forward(self, x):
        return x @ self.weight.T + self.bias


class CachedByAddress(Linear):
    """Caches the transposed weight and the bias keyed on their data_ptr: stale after any in-place change."""

    def forward(self, x):
        key = (self.weight.data_ptr(), self.bias.data_ptr())
        if getattr(self, "_key", None) != key:
            self._key, self._wt, self._b = key, self.weight.detach().T.contiguous(), self.bias.detach().clone()
        return x @ self._wt + self._b


class CachedWeightOnce(Linear):
    """Transposes the weight once, on the first call; reads the bias fresh every call."""

    def forward(self, x):
        if not hasattr(self, "_wt"):
            self._wt = self.weight.detach().T.contiguous()
        return x @ self._wt + self.bias


class CachedByVersion(Linear):
    """Caches the transposed weight keyed on its address *and* version counter: refreshed on every in-place
    change through autograd's view of the weight (optimizer steps, copy_, load_state_dict bump the version), not
    after a write through .data or by an optimizer's own kernel, which leaves the version."""

    def forward(self, x):
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_key", None) != key:
            self._key, self._wt = key, self.weight.detach().T.contiguous()
        return x @ self._wt + self.bias


class CachedByVersionAndValues(CachedByVersion):
    """The same cache, checked against a copy of the weight it was made from: a write through .data shows."""

    def forward(self, x):
        if getattr(self, "_w", None) is not None and not torch.equal(self._w, self.weight.detach()):
            self._key = None
        self._w = self.weight.detach().clone()
        return super().forward(x)


def isolation(kernel_cls, reference=None, **kw):
    return check("isolation", kernel_cls(), reference or Linear(), features, **kw)


@pytest.mark.parametrize("kernel_cls", [Linear, CachedByVersionAndValues], ids=["plain", "checked-cache"])
def test_kernel_that_follows_its_parameters_passes(kernel_cls):
    result = isolation(kernel_cls)
    assert result.verdict == "pass", result.message
    assert "parameters changed in place 6 way(s) (2 class(es) of equal parameters)" in result.message


def test_cache_keyed_on_the_version_is_stale_after_a_step_through_data():
    """Its output moves after the step (the bias is read afresh) but not to the new result: judged against the
    oracle bound after the change."""
    result = isolation(CachedByVersion)
    assert result.verdict == "fail" and result.details["stale"] is False, result.message
    assert "written through .data (version counters unchanged" in result.message
    assert "misses the oracle bound where it met it before the change" in result.message


def test_cache_keyed_on_data_ptr_is_stale_after_an_optimizer_step():
    result = isolation(CachedByAddress)
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "optimizer-style in-place step of every parameter" in result.message
    assert "previous output bitwise again" in result.message
    assert result.details["stale"] is True and result.details["parameters"] == "step"
    assert "--gate isolation" in result.repro


def test_weight_cached_once_is_caught_at_the_first_change():
    """The weight transposed once, the bias read afresh: the first step already moves the output off the new
    result (not bitwise the previous one: not stale, but beyond the bound)."""
    result = isolation(CachedWeightOnce)
    assert result.verdict == "fail" and result.details["stale"] is False, result.message
    assert result.details["change"] == "an optimizer-style in-place step of every parameter and buffer"


class PackedByWeightVersion(Linear):
    """Packs the transposed weight and the bias into one tile, rebuilt whenever the *weight* changes (its
    address and version counter): a change of the bias alone leaves the tile stale."""

    def forward(self, x):
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_key", None) != key:
            self._key = key
            self._pack = torch.cat((self.weight.detach().T, self.bias.detach().unsqueeze(0)))
        return x @ self._pack[:-1] + self._pack[-1]


def test_a_pack_keyed_on_one_parameter_is_caught_by_changing_another_alone():
    """Restoring the state after a probe moves the weight's version counter: the kernel is called on the
    restored state before the next change, so the bias-alone step meets the tile as the kernel keeps it
    (before, the restore itself made the next call rebuild the tile and the stale bias was never seen)."""
    result = isolation(PackedByWeightVersion)
    assert result.verdict == "fail" and result.details["stale"] is True, result.message
    # (the step of every parameter through .data, which leaves the weight's version, finds it first now)
    assert "bias (the reference's bias) alone" in result.message or "written through .data" in result.message


def test_load_state_dict_changes_both_modules_alike_in_place():
    kernel, reference = CachedByAddress(), Linear()
    addresses = [t.data_ptr() for t in [*kernel.parameters(), *reference.parameters()]]
    _load_changed((kernel, reference), parameter_classes(kernel, reference), seed=5)
    assert [t.data_ptr() for t in [*kernel.parameters(), *reference.parameters()]] == addresses
    assert torch.equal(kernel.weight, reference.weight) and torch.equal(kernel.bias, reference.bias)
    assert not torch.equal(kernel.weight, Linear().weight)


def test_parameters_and_converted_copies_are_restored():
    kernel, reference = CachedByVersionAndValues(), Linear()
    subject = subject_for(kernel, reference, features)
    before = [t.detach().clone() for t in [*kernel.parameters(), *reference.parameters()]]
    oracle = subject.oracle(features(0))  # a float64 copy of the reference is made and kept
    assert registry.get("isolation").check(subject).verdict == "pass"
    after = [t.detach() for t in [*kernel.parameters(), *reference.parameters()]]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(subject.oracle(features(0)), oracle)  # not a copy converted from changed parameters


def test_tensors_held_by_one_side_only_are_left_alone():
    class FusedAtInit(torch.nn.Module):  # holds [weight | bias] fused, as one parameter the reference lacks
        def __init__(self, ref):
            super().__init__()
            self.fused = torch.nn.Parameter(torch.cat([ref.weight.detach(), ref.bias.detach()[:, None]], 1))

        def forward(self, x):
            return x @ self.fused[:, :-1].T + self.fused[:, -1]

    result = check("isolation", FusedAtInit(Linear()), Linear(), features)
    assert result.verdict == "pass" and "parameters not probed" in result.message


@pytest.mark.parametrize(("kernel_cls", "verdict"), [(Linear, "pass"), (CachedByAddress, "fail")])
def test_through_the_audits_wrappers(kernel_cls, verdict):
    # the audit calls ModelNew under torch.no_grad() and its reference through DtypeDispatch
    reference = Linear()
    kernel = kernel_cls()
    kernel.load_state_dict(copy.deepcopy(reference.state_dict()))
    result = check("isolation", NoGrad(kernel), DtypeDispatch(reference), features)
    assert result.verdict == verdict, result.message


def test_a_buffer_is_scaled_not_shifted():
    class Normalize(torch.nn.Module):  # running statistics as persistent buffers, as BatchNorm in eval mode
        def __init__(self):
            super().__init__()
            self.register_buffer("var", torch.ones(12))
            self.register_buffer("mask", (torch.arange(12) % 3 != 0).float())

        def forward(self, x):
            return x / torch.sqrt(self.var + 1e-5) * (self.mask != 0)

    class NormalizeFolded(Normalize):  # folds 1 / sqrt(var) once: stale after load_state_dict
        def forward(self, x):
            if not hasattr(self, "_inv"):
                self._inv = torch.rsqrt(self.var + 1e-5)
            return x * self._inv * (self.mask != 0)

    assert isolation(Normalize, Normalize()).verdict == "pass"
    result = isolation(NormalizeFolded, Normalize())
    assert result.verdict == "fail" and "every parameter and buffer" in result.message


def test_a_large_parameter_is_changed_a_piece_at_a_time(monkeypatch):
    # A weight of billions of elements must not be copied whole into float64 (several copies of a 4 GiB
    # weight took a GPU audit's worker past its 32 GiB host limit): the change is drawn in pieces, and the
    # probe still catches a stale cache and passes a kernel that follows its parameters.
    import kgate.gates.isolation as isolation_module

    monkeypatch.setattr(isolation_module, "STEP_PIECE", 16)
    drawn = []
    real_rand = torch.rand

    def rand(*args, **kwargs):
        out = real_rand(*args, **kwargs)
        drawn.append(out.numel())
        return out

    monkeypatch.setattr(torch, "rand", rand)
    (parameter_class, *_) = parameter_classes(Linear(), Linear())
    change = parameter_class.change(7)
    assert drawn and max(drawn) <= 16 and sum(drawn) == 2 * parameter_class.numel  # factor and noise
    assert change.shape == parameter_class.reference[0][1].shape and change.dtype == torch.float32
    assert torch.equal(change, parameter_class.change(7)) and not torch.equal(change, parameter_class.change(8))
    assert bool((change != 0).all())
    assert isolation(CachedByAddress).verdict == "fail"
    assert isolation(Linear).verdict == "pass"


def test_equal_parameters_of_kernel_and_reference_are_saved_once_and_each_restored():
    # kernel and reference hold equal weights: one saved copy serves both (a model's worth of memory less
    # in an audit's share of a GPU); a tensor of one side that differs gets its own, and each comes back
    from kgate.subject import ModuleState

    kernel, reference = Linear(), Linear()
    with torch.no_grad():
        kernel.bias.add_(1.0)  # differs from the reference's
    subject = subject_for(kernel, reference, features)
    before = [t.detach().clone() for t in [*kernel.parameters(), *reference.parameters()]]
    state = ModuleState(subject, (kernel, reference))
    saved = {id(s) for _, s in state._saved}
    assert len(state._saved) == 4 and len(saved) == 3  # the two weights share one copy, the biases do not
    with torch.no_grad():
        for t in [*kernel.parameters(), *reference.parameters()]:
            t.mul_(3.0)
    state.close()
    after = [t.detach() for t in [*kernel.parameters(), *reference.parameters()]]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_converted_reference_copies_are_given_back_only_while_small(monkeypatch):
    """ModuleState sets the reference's converted copies (the float64 one for the oracle) aside while a probe
    changes the parameters, and gives them back after: only while they are small. A large model's float64 copy
    held through the probe, beside the one made from the changed parameters, outgrew a GPU share; dropped, it
    is made again from the restored parameters, with the same values."""
    from kgate import subject as subject_module
    from kgate.subject import ModuleState

    def probe(limit: int):
        monkeypatch.setattr(subject_module, "KEEP_CONVERTED_BYTES", limit)
        subject = subject_for(Linear(), Linear(), features)
        args = subject.inputs(subject.first_seed_cases()[0])
        first = subject.oracle(args)
        held = [m for d in (subject._dispatch, subject.raw_reference_fn)
                if isinstance(d, subject_module.DtypeDispatch) for m in d._copies.values()]
        assert held, "the oracle made a converted copy"
        state = ModuleState(subject, subject.modules())
        with torch.no_grad():
            for p in subject.modules()[1].parameters():
                p.add_(1.0)
        state.close()
        back = [m for d in (subject._dispatch, subject.raw_reference_fn)
                if isinstance(d, subject_module.DtypeDispatch) for m in d._copies.values()]
        assert torch.equal(subject.oracle(args), first)  # the same oracle either way
        return held, back

    held, back = probe(1 << 28)
    assert [id(m) for m in back] == [id(m) for m in held]  # small: the very copies come back
    held, back = probe(0)
    assert not back  # large: dropped, made again when next asked for


class PackedAtFirstEval(Linear):
    """Transposes the weight on every training-mode call, and in eval mode once, at its first eval-mode call."""

    def forward(self, x):
        if self.training:
            return super().forward(x)
        if getattr(self, "_packed", None) is None:
            self._packed = self.weight.detach().T.contiguous()
        return x @ self._packed + self.bias


def test_a_weight_packed_at_the_first_eval_call_fails_in_eval_mode_and_training_mode_is_left_as_built():
    """Its output moves after a step (the bias is read afresh) but not to the new result: the probe in eval mode
    judges the moved output against the oracle bound. Both modules end in the mode they were built in."""
    kernel, reference = PackedAtFirstEval(), Linear()
    result = check("isolation", kernel, reference, features)
    assert result.verdict == "fail", result.message
    assert "in eval mode" in result.details["change"] and result.details["stale"] is False, result.message
    assert "misses the oracle bound where it met it before the change" in result.message
    assert kernel.training and reference.training
    good = check("isolation", Linear(), Linear(), features)
    assert good.verdict == "pass" and "parameters changed in place 6 way(s)" in good.message, good.message


class PackedPerVersionInEval(Linear):
    """In eval mode, a transposed weight kept under the key (address, version) of weight and bias: refreshed
    after every in-place step (add_ moves the versions), stale after a step written through .data."""

    def forward(self, x):
        if self.training:
            return super().forward(x)
        key = tuple((t.data_ptr(), t._version) for t in (self.weight, self.bias))
        if getattr(self, "_key", None) != key:
            self._key, self._packed = key, (self.weight.detach().T.contiguous(), self.bias.detach().clone())
        weight_t, bias = self._packed
        return x @ weight_t + bias


def test_an_eval_mode_cache_keyed_on_versions_fails_the_eval_mode_step_written_through_data():
    result = check("isolation", PackedPerVersionInEval(), Linear(), features)
    assert result.verdict == "fail", result.message
    assert "in eval mode" in result.details["change"] and ".data" in result.details["change"], result.message
    assert result.details["stale"] is True, result.message


class BiasScaledAsBuilt(Linear):
    """Right only while the bias holds its values as built: adds the bias it was built with (a constant folded
    at construction) scaled by the live bias's mean over the built one's."""

    def __init__(self):
        super().__init__()
        self._built = self.bias.detach().clone()

    def forward(self, x):
        return x @ self.weight.T + self._built * (self.bias.mean() / self._built.mean())


def test_an_output_that_moves_after_a_change_but_misses_the_new_result_fails():
    result = check("isolation", BiasScaledAsBuilt(), Linear(), features)
    assert result.verdict == "fail" and result.details["stale"] is False, result.message
    assert result.details["change"].startswith("an optimizer-style in-place step"), result.details


class _Histogram(torch.nn.Module):
    """Counts of the values in the bins of a sorted edges buffer, by bucketize."""

    def __init__(self):
        super().__init__()
        self.register_buffer("edges", torch.linspace(-3.0, 3.0, 25))

    def forward(self, x):
        v, e = x.reshape(-1), self.edges
        idx = torch.bucketize(v, e, right=True) - 1
        valid = (v >= e[0]) & (v < e[-1])
        return torch.bincount(idx[valid], minlength=e.numel() - 1).to(x.dtype)


class _HistogramSearched(_Histogram):
    """The same counts as differences of two searches of the edges into the sorted values."""

    def forward(self, x):
        s, _ = torch.sort(x.reshape(-1))
        left = torch.searchsorted(s, self.edges, right=False)
        return (left[1:] - left[:-1]).to(x.dtype)


_values = normal_inputs((64, 32))


def test_a_sorted_buffer_stays_sorted_under_every_step_and_a_correct_search_passes():
    """Bin edges stepped element by element would be out of order, where bucketize and a search disagree on
    what no histogram means; a row's common factor keeps them sorted."""
    from kgate.gates.isolation import parameter_classes

    (edges,) = [c for c in parameter_classes(_HistogramSearched(), _Histogram()) if c.kind == "buffer"]
    for seed in range(5):
        stepped = edges.reference[0][1] * edges.change(seed)
        assert bool((stepped[1:] >= stepped[:-1]).all())
    for gate in ("isolation", "oracle"):
        result = check(gate, _HistogramSearched(), _Histogram(), _values)
        assert result.verdict == "pass", (gate, result.message)


class Scaled(Linear):
    """Linear whose output is multiplied by `scale`: a plain float, a tensor attribute or a registered buffer."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "buffer":
            self.register_buffer("scale", torch.tensor(2.0))
        else:
            self.scale = torch.tensor(2.0) if kind == "tensor" else 2.0

    def forward(self, x):
        return super().forward(x) * self.scale


def _float64_copy(dispatch: DtypeDispatch, args: tuple):
    out = dispatch(*args)
    return out, next(iter(dispatch._copies.values()))


@pytest.mark.parametrize("change", ["parameters", "buffer"])
def test_a_converted_copy_is_refreshed_in_place_and_computes_what_a_new_copy_computes(change):
    from kgate.oracle import converted_copy

    model = Scaled("buffer")
    dispatch = DtypeDispatch(model)
    args = (features(0)[0].double(),)
    first, dup = _float64_copy(dispatch, args)
    with torch.no_grad():
        for t in (model.parameters() if change == "parameters" else model.buffers()):
            t.mul_(1.5)
    dispatch.drop_copies()
    second, again = _float64_copy(dispatch, args)
    assert again is dup  # the copy was brought up to the change in place, not made anew
    assert not torch.equal(first, second)
    fresh = converted_copy(model, device=torch.device("cpu"), dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(second, fresh(*args))


@pytest.mark.parametrize("change", ["tensor attribute", "plain attribute", "training flag", "hook", "own dtype"])
def test_a_converted_copy_is_made_anew_where_the_module_holds_more_than_parameters_and_buffers(change):
    model = Scaled("tensor" if change == "tensor attribute" else "float")
    dispatch = DtypeDispatch(model)
    args = (features(0)[0].double(),)
    first, dup = _float64_copy(dispatch, args)
    if change == "tensor attribute":
        model.scale.mul_(3.0)  # in place: the same object, other values, which only a deep copy takes along
    elif change == "plain attribute":
        model.scale = 6.0
    elif change == "training flag":
        model.eval()
    elif change == "hook":
        model.register_forward_hook(lambda module, inputs, out: out * 3.0)
    else:  # the copy's own conversion kept a tensor in float32 (a module that converts itself so): made anew
        dup.bias.data = dup.bias.data.float()
        with torch.no_grad():
            model.weight.mul_(3.0)
            model.bias.mul_(3.0)
    dispatch.drop_copies()
    second, again = _float64_copy(dispatch, args)
    assert again is not dup
    if change == "training flag":
        assert not again.training and torch.equal(first, second)
    else:
        assert torch.allclose(second, first * 3.0)


def test_a_converted_copy_a_module_state_keeps_is_not_refreshed_while_kept():
    """ModuleState gives its converted copies back as they were when it was made: a probe's calls meanwhile get
    a copy of their own, and refreshing the kept one in place would give back the probe's parameters."""
    from kgate.subject import ModuleState

    subject = subject_for(Linear(), Linear(), features)
    args = subject.inputs(subject.first_seed_cases()[0])
    first = subject.oracle(args)
    kept = [m for m in subject._dispatch._copies.values()]
    assert kept, "the oracle made a converted copy"
    state = ModuleState(subject, subject.modules())
    with torch.no_grad():
        for p in subject.modules()[1].parameters():
            p.add_(1.0)
    subject.changed_state()
    during = subject.oracle(args)
    assert not torch.equal(during, first)
    assert all(all(m is not k for k in kept) for m in subject._dispatch._copies.values())
    state.close()
    assert [m for m in subject._dispatch._copies.values()] == kept
    assert torch.equal(subject.oracle(args), first)
    with torch.no_grad():  # once given back, it is refreshed in place again
        for p in subject.modules()[1].parameters():
            p.mul_(2.0)
    subject.changed_state()
    subject.oracle(args)
    assert [m for m in subject._dispatch._copies.values()] == kept
