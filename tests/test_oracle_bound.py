"""The oracle bound at the ends of a dtype's range: an overflow to Inf from within the bound, the floor at
subnormal magnitudes, and the magnitude of the terms behind a result: a cancellation to an exact 0 and a
partial sum past the largest value (kgate/oracle.py, measure and TermMagnitudes)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from kgate import gates as registry
from kgate.backward import BackwardSubject
from kgate.oracle import TermMagnitudes, Terms, measure, overflow_threshold
from tests.gate_harness import check, subject_for

CATALOGUE = Path(__file__).resolve().parent.parent / "gates"

F32 = torch.float32
MAX = float(torch.finfo(F32).max)
STEP = float(torch.finfo(F32).smallest_normal) * float(torch.finfo(F32).eps)  # the smallest subnormal


def judge(kernel, reference, oracle, dtype=F32, terms=None):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return measure(t(kernel).to(dtype), t(reference).to(dtype), t(oracle), path="out", factor=8, ulps=4, atol=0,
                   terms=terms)


def _catalogue(gate, name):
    spec = importlib.util.spec_from_file_location(f"catalogue_{gate}_{name}_bound", CATALOGUE / gate / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- an overflow to Inf of the right sign, where the bound reaches past the largest finite value -----------

def test_an_inf_of_the_oracles_sign_is_within_a_bound_that_reaches_past_the_largest_value():
    """A reference with no correct digit near the top of float32 (off by 1e38): the bound (about 8e38) reaches
    past float32's largest value from the truth (-2e38), so a kernel whose sum overflowed to -Inf is within it."""
    leaf = judge([-math.inf, 1e37], [-1e38, 1e37], [-2e38, 1e37])
    assert leaf.bound > MAX and leaf.overflows == 1
    assert leaf.passed, leaf.describe()
    assert leaf.err == overflow_threshold(F32) - 2e38 and leaf.index == [0]
    assert "1 Inf output(s) of the oracle's sign counted as overflows" in leaf.describe()


def test_an_inf_where_the_truth_is_moderate_fails_whatever_the_bound():
    """The same bound past float32's range, but the Inf where the truth is 1: the leaf's bound taken at the
    element's own magnitude (1 x (1 + bound / scale)) is nowhere near the overflow threshold."""
    leaf = judge([-2e38, math.inf], [-1e38, 1.0], [-2e38, 1.0])
    assert leaf.bound > MAX and leaf.overflows == 0
    assert not leaf.passed and leaf.err == math.inf and leaf.index == [1], leaf.describe()


def test_an_inf_of_the_wrong_sign_or_a_nan_fails():
    for got in ([math.inf, 1e37], [math.nan, 1e37]):
        leaf = judge(got, [-1e38, 1e37], [-2e38, 1e37])
        assert not leaf.passed and leaf.err == math.inf and leaf.overflows == 0, (got, leaf.describe())


def test_an_inf_where_the_bound_stays_inside_the_range_fails():
    """A sum that overflows in the kernel's order where the truth (-9.2e37) and an accurate reference are in
    range: the bound (a few ulps) does not reach past the largest value."""
    leaf = judge([-math.inf, 1e37], [-9.2e37, 1e37], [-9.2e37, 1e37])
    assert not leaf.passed and leaf.err == math.inf, leaf.describe()


def test_the_overflow_threshold_is_where_rounding_gives_inf():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t, info = overflow_threshold(dtype), torch.finfo(dtype)
        assert math.isinf(float(torch.tensor(t, dtype=torch.float64).to(dtype)))
        below = torch.tensor(t * (1 - info.eps / 4), dtype=torch.float64)  # between the largest value and t
        assert float(info.max) < float(below) and float(below.to(dtype)) == float(info.max)


# --- the floor at subnormal magnitudes ----------------------------------------------------------------------

def test_a_few_subnormal_steps_off_at_subnormal_outputs_is_within_the_floor():
    """Outputs near 6.5e-40 (subnormal in float32), the reference under two steps of the smallest subnormal off,
    the kernel 15 steps (another order of a decaying product): a relative floor gives no room for a step."""
    truth = 6.54469e-40
    leaf = judge([truth - 15 * STEP], [truth + 2 * STEP], [truth])
    assert leaf.floor == 4 * STEP
    assert leaf.passed, leaf.describe()


def test_a_flush_to_zero_at_subnormal_outputs_still_fails():
    truth = 6.54469e-40
    leaf = judge([0.0], [truth + 2 * STEP], [truth])
    assert not leaf.passed and leaf.err == truth, leaf.describe()
    assert leaf.err > 100 * leaf.bound


def test_the_floor_is_relative_above_the_subnormal_range():
    leaf = judge([1.0], [1.0], [1.0])
    assert leaf.floor == 4 * float(torch.finfo(F32).eps)


# --- a cancellation to an exact 0: the floor at the magnitude of the terms ----------------------------------

EPS = float(torch.finfo(F32).eps)


def test_a_residue_of_the_terms_where_the_oracle_is_zero_is_within_the_floor_at_the_terms():
    """Liger's LayerNorm backward over one feature: the exact gradient and torch's are 0, the kernel's is
    rstd x (the rounding of w dy), 7.6e-6 with rstd = 316: without the terms the bound is 0."""
    terms = Terms(magnitude=316.0, partial_sums=1.0)
    assert not judge([7.6e-6], [0.0], [0.0]).passed
    leaf = judge([7.6e-6], [0.0], [0.0], terms=lambda: terms)
    assert leaf.passed and leaf.floor == 4 * EPS * 316 and leaf.terms == 316.0, leaf.describe()


def test_garbage_where_the_oracle_is_zero_still_fails_and_names_the_terms():
    leaf = judge([0.3, 0.0], [0.0, 0.0], [0.0, 0.0], terms=lambda: Terms(316.0, 1.0))
    assert not leaf.passed and leaf.index == [0] and leaf.err == float(torch.tensor(0.3, dtype=F32))
    assert "the floor taken at the magnitude of the terms the oracle's computation combines, 316" in leaf.describe()


def test_the_terms_are_asked_for_only_where_the_bound_is_missed():
    asked = []

    def terms():
        asked.append(1)
        return Terms(316.0, 1.0)

    assert judge([0.0], [0.0], [0.0], terms=terms).passed  # within the bound: not asked
    assert judge([1e-3], [1e-3], [1e-3 * (1 + 1e-7)], terms=terms).passed
    assert not asked
    assert not judge([2.0], [1.0], [1.0], terms=terms).passed  # 1 is far past 4 ulps of 316
    assert asked


def test_a_cancellation_to_a_small_value_is_judged_at_its_terms_and_a_wrong_value_still_fails():
    """A cosine of two nearly orthogonal float32 rows of 4097 values: -0.0016 from products whose magnitudes
    add up to 0.6. The reference rounded luckily (1.2e-10 off float64), another order of summation is 2.9e-9
    off: 25 ulps of the result, a fraction of one of the terms."""
    oracle, reference, kernel = [-0.00162157], [-0.00162157 + 1.24e-10], [-0.00162157 + 2.92e-9]
    assert not judge(kernel, reference, oracle).passed
    leaf = judge(kernel, reference, oracle, terms=lambda: Terms(0.62, 0.62))
    assert leaf.passed and leaf.terms == 0.62, leaf.describe()
    wrong = judge([-0.00162157 * 1.01], reference, oracle, terms=lambda: Terms(0.62, 0.62))
    assert not wrong.passed and "larger than the oracle anywhere in out" in wrong.describe()
    # terms no larger than the result give no room
    assert judge(kernel, reference, oracle, terms=lambda: Terms(0.001, 0.001)).terms is None


def test_terms_past_the_dtypes_range_give_no_floor():
    """Terms no finite computation in float32 forms (a branch of a `where` that float64 alone holds)."""
    leaf = judge([1e30], [0.0], [0.0], terms=lambda: Terms(1e300, 0.0))
    assert not leaf.passed and leaf.terms is None, leaf.describe()


# --- a partial sum past the largest value: non-finite outputs not judged -------------------------------------

def test_an_overflow_where_the_sums_terms_pass_the_range_is_not_judged():
    """FlagGems' sum(dim) near float32's largest value: a partial sum of the kernel's order overflows where the
    exact total (-9.2e37) and the reference are finite; the terms' magnitudes add up past the range."""
    assert not judge([-math.inf, 1e37], [-9.2e37, 1e37], [-9.2e37, 1e37]).passed
    leaf = judge([-math.inf, 1e37], [-9.2e37, 1e37], [-9.2e37, 1e37], terms=lambda: Terms(2e37, 5e39))
    assert leaf.passed and leaf.beyond_range == 1 and leaf.index == [1], leaf.describe()  # the finite one judged
    leaf = judge([math.nan, 1.5e37], [-9.2e37, 1e37], [-9.2e37, 1e37], terms=lambda: Terms(2e37, 5e39))
    assert not leaf.passed and leaf.index == [1] and leaf.beyond_range == 1  # 1.5e37 for 1e37 still fails
    assert "1 non-finite output(s) where the oracle is finite not judged" in leaf.describe()


def test_an_overflow_that_no_order_of_summation_makes_still_fails():
    leaf = judge([-math.inf, 1e37], [-9.2e37, 1e37], [-9.2e37, 1e37], terms=lambda: Terms(2e37, 1e38))
    assert not leaf.passed and leaf.err == math.inf and leaf.beyond_range == 0
    assert "add up to 1e+38, within the dtype's range: no order of summation overflows" in leaf.describe()


# --- the magnitudes followed through a float64 computation -----------------------------------------------------

def _terms(fn, *args):
    recorder = TermMagnitudes()
    with recorder:
        out = fn(*args)
    return recorder.of(out)


def test_the_sums_terms_bound_every_partial_sum_and_statistics_inside_fused_ops_count():
    x = torch.tensor([[3e38, -3e38, 1.0, 2.0]], dtype=torch.float64)
    assert _terms(lambda t: t.sum(-1), x) == Terms(6e38 + 3.0, 6e38 + 3.0)
    assert _terms(lambda t: t.mean(-1), x).partial_sums == 6e38 + 3.0  # the sum before the division
    assert _terms(lambda t: t.cumsum(-1), x).partial_sums == 6e38 + 3.0
    # layer norm forms the mean and the sum of squared deviations (~1.8e77) inside native_layer_norm
    assert _terms(lambda t: F.layer_norm(t, (4,)), x).partial_sums > 1e77
    # magnitudes of a branch a `where` discards count for the values, never as the terms of a sum
    softplus = _terms(F.softplus, torch.tensor([1e3, -1.0], dtype=torch.float64))
    assert softplus.partial_sums == 0.0 and softplus.magnitude == math.inf


def test_a_where_branch_its_condition_never_selects_carries_no_terms():
    """A row rescaled by its maximum, guarded as where(m > 0, m, 1): with every maximum positive the ones are never
    read, and a result scaled by 1e-15 keeps terms of its own size (a kernel that underflows there fails)."""
    m = torch.tensor([1e-15, 2e-15], dtype=torch.float64)
    guarded = _terms(lambda t: torch.where(t > 0, t, torch.ones_like(t)) * 3.0, m)
    assert math.isclose(guarded.magnitude, 6e-15)
    assert _terms(lambda t: torch.where(t > 1.5e-15, t, torch.ones_like(t)), m).magnitude == 1.0  # a 1 is read


def test_a_means_terms_are_in_its_own_units_and_its_partial_sums_in_the_sums():
    """A global mean of 16,384 equal values: its result's terms are those values (the partial sums, 16,384 times
    larger, are divided before they reach it), so a float32 mean 2e-4 off on constant inputs gets no floor of
    the sum's size; a variance's terms are its own values, its sum of squares its partial sum."""
    x = torch.full((1, 2, 128, 128), 0.0145, dtype=torch.float64)
    mean = _terms(lambda t: t.mean(dim=[2, 3]), x)
    assert math.isclose(mean.magnitude, 0.0145) and math.isclose(mean.partial_sums, 0.0145 * 16384)
    y = torch.randn(4, 4097, dtype=torch.float64)
    var = _terms(lambda t: t.var(-1), y)
    assert var.magnitude == float(y.var(-1).max()) and var.partial_sums > 4000 * var.magnitude


def test_the_terms_of_a_zero_gradient_are_those_its_computation_multiplies():
    """Over one feature the textbook layer norm backward rstd (w dy - mean(w dy) - ...) is 0: its terms are w dy
    (dy = 1 here) times rstd = 1/sqrt(eps), not the zero result, nor rstd times x_hat's own terms (x_hat is 0);
    a gradient made by zeros_like reads no values."""
    ln = _catalogue("oracle", "correct")
    x, w, b = (t.double().requires_grad_(True) for t in ln.make_one_feature(0, (4, 1)))
    recorder = TermMagnitudes()
    with recorder, torch.enable_grad():
        dx, _, _ = torch.autograd.grad(ln.layer_norm_reference(x, w, b), (x, w, b), torch.ones(4, 1, dtype=torch.float64))
        unused = torch.zeros_like(w)
    assert torch.equal(dx, torch.zeros_like(dx))
    rstd = float(1 / torch.tensor(ln.LN_EPS, dtype=torch.float64).sqrt())
    assert math.isclose(recorder.of(dx).magnitude, rstd * float(w.detach().abs().max()), rel_tol=1e-12)
    assert recorder.of(unused) == Terms(0.0, 0.0)


# --- the classes on whole kernels: the catalogue's one-feature layer norm and a one-class cross-entropy -------

def _oracle_backward(kernel, module, shape):
    subject = BackwardSubject(subject_for(kernel, module.layer_norm_reference, module.make_one_feature,
                                          backward=True, shapes=[shape]))
    return registry.get("oracle").check(subject)


def test_a_layer_norm_backward_over_one_feature_passes_with_its_rounding_residue():
    correct = _catalogue("oracle", "correct")
    result = _oracle_backward(correct.layer_norm_fused, correct, [8, 1])
    assert result.verdict == "pass", result.message
    dx = [e for e in result.evidence if e["path"] == "out[0]"]
    assert dx and dx[0]["err"] > 0 and dx[0]["terms"] is not None and dx[0]["expected"] == 0.0


def test_a_layer_norm_backward_with_a_bfloat16_mean_still_fails_over_one_feature():
    correct, violating = _catalogue("oracle", "correct"), _catalogue("oracle", "violating")
    result = _oracle_backward(violating.layer_norm_half_precision_mean, correct, [8, 1])
    assert result.verdict == "fail" and "out[0]" in result.where, result.message
    assert "the floor taken at the magnitude of the terms" in result.message
    assert "kgate run kgate.yaml -k k --gate 'oracle[backward]'" in result.repro


def _one_class_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (16, 1), generator=gen, dtype=torch.float64) * 2
    return x.to(dtype=dtype, device=device), torch.zeros(x.shape[0], dtype=torch.long, device=device)


def _smoothed_reference(x, y):
    return F.cross_entropy(x, y, label_smoothing=0.1)


def _smoothed_loss(lse_dtype):
    """Liger's label-smoothed cross-entropy: lse - (1 - e) x_y - (e / C) sum(x), in float32 (lse rounded through
    `lse_dtype`). Over one class the exact loss is 0, and the three terms (of the order of x) cancel."""
    def kernel(x, y):
        xf = x.float()
        lse = torch.logsumexp(xf, -1).to(lse_dtype).float()
        picked = xf.gather(-1, y[:, None])[:, 0]
        loss = lse - 0.9 * picked - (0.1 / x.shape[-1]) * xf.sum(-1)
        return loss.mean().to(x.dtype)
    return kernel


def test_a_label_smoothed_loss_over_one_class_passes_with_its_rounding_residue():
    result = check("oracle", _smoothed_loss(torch.float32), _smoothed_reference, _one_class_inputs)
    assert result.verdict == "pass", result.message
    assert result.evidence[0]["err"] > 0 and result.evidence[0]["terms"] is not None, result.evidence


def test_a_label_smoothed_loss_with_a_bfloat16_logsumexp_still_fails_over_one_class():
    result = check("oracle", _smoothed_loss(torch.bfloat16), _smoothed_reference, _one_class_inputs)
    assert result.verdict == "fail" and "the floor taken at the magnitude of the terms" in result.message, \
        result.message


def test_an_underflowed_exponential_carries_no_terms_into_a_product():
    """exp(-1e6) is 0 with no residue: its argument is not a term of the result, and 0 x k has no terms either
    (a kernel that clamps the exponent returns garbage there, which must still fail)."""
    g = torch.tensor([-1e6, -2e6], dtype=torch.float64)
    k = torch.tensor([1.5, -2.0], dtype=torch.float64)
    assert _terms(lambda a, b: torch.exp(a.cumsum(-1)) * b, g, k) == Terms(0.0, 3e6)


def test_an_integer_output_may_select_as_the_reference_does_where_its_dtype_ties_what_float64_does_not():
    """Indices of a top-1 over scores near 1.6e7: float32 rounds 1.6e7 + 0.1, + 0.3 and + 0.2 to one value, so
    the reference (and a kernel in float32) takes the first, where float64 tells the second is larger. The
    kernel may equal either truth at each element; one that equals neither (the last of three tied) fails."""
    scores64 = torch.tensor([[1.6e7 + 0.1, 1.6e7 + 0.3, 1.6e7 + 0.2]], dtype=torch.float64)
    oracle = scores64.argmax(-1)
    reference = scores64.float().argmax(-1)
    assert int(oracle) == 1 and int(reference) == 0
    like_reference = measure(reference.clone(), reference, oracle, path="out", factor=8, ulps=0, atol=0)
    assert like_reference.passed and like_reference.exact
    neither = measure(torch.tensor([2]), reference, oracle, path="out", factor=8, ulps=0, atol=0)
    assert not neither.passed and "exact match required" in neither.describe()
    # without the reference, the oracle alone decides
    assert not measure(reference.clone(), None, oracle, path="out", factor=8, ulps=0, atol=0).passed


def test_a_half_precision_result_that_cancels_is_owed_the_precision_of_float32_sums():
    """A float16 row sum of 1.0 from terms adding up to 1000: torch keeps the partial sums in float32, so the
    terms' floor is float32's (4.9e-4), not float16's (3.9): a float16 running total 0.5 off still fails."""
    terms = lambda: Terms(1000.0, 1000.0)  # noqa: E731
    leaf = judge([1.5], [1.0], [1.0], dtype=torch.float16, terms=terms)
    assert not leaf.passed and leaf.terms == 1000.0 and leaf.floor < 1e-3, leaf.describe()
    assert judge([1.0 + 2e-4], [1.0], [1.0], terms=terms).passed  # float32: within 4 ulps of the terms


def test_a_selections_indices_tie_where_the_values_they_select_are_equal():
    """argmax over a dimension (keepdim False) and over the flattened values; an index out of range is no tie."""
    from kgate.oracle import Selection

    values = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], dtype=torch.float64)
    by_row = Selection(values, 1, keepdim=False)
    assert by_row.ties(torch.tensor([2, 2]), torch.tensor([1, 0])).tolist() == [True, True]
    assert by_row.ties(torch.tensor([0, 1]), torch.tensor([1, 0])).tolist() == [False, False]
    assert by_row.ties(torch.tensor([3, 0]), torch.tensor([1, 0])) is None
    flat = Selection(values, None)
    assert flat.ties(torch.tensor(2), torch.tensor(1)).tolist() is True
    recorder = TermMagnitudes()
    with recorder:
        chosen = (values * 2.0).argmax(dim=1).clone()
        own = values.argmax(dim=1)
        ranked = values.topk(2, dim=1).indices
    assert recorder.of(chosen).selection is not None  # carried through the copy
    # argmax documents the first of equal values: on values given as they are, ties are its own rule, not rounding
    assert recorder.of(own) is None and recorder.of(ranked).selection is not None


def test_a_sensitivity_given_as_a_callable_is_asked_only_where_the_bound_without_it_is_missed():
    oracle = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    reference = oracle.float()
    asked = []

    def moves() -> float:
        asked.append(1)
        return 1e-3

    kw = dict(path="out", factor=2.0, ulps=2.0, atol=0.0)
    # within the bound without it: not asked, and the leaf records the bound without it
    near = measure(oracle.float(), reference, oracle, sensitivity=moves, **kw)
    assert near.passed and asked == [] and near.sensitivity == 0.0
    # missed without it, within it: asked once, the same leaf as with the value given
    off = (oracle + 1e-3).float()
    lazy = measure(off, reference, oracle, sensitivity=moves, **kw)
    eager = measure(off, reference, oracle, sensitivity=1e-3, **kw)
    assert asked == [1] and lazy.passed and lazy == eager
    # missed with it too: the same failure either way
    far = (oracle + 1.0).float()
    assert measure(far, reference, oracle, sensitivity=moves, **kw) == measure(far, reference, oracle,
                                                                             sensitivity=1e-3, **kw)
    assert not measure(far, reference, oracle, sensitivity=1e-3, **kw).passed
    # a non-finite output: asked first, since the bound decides which Inf rounds up from within it
    asked.clear()
    inf = torch.tensor([1.0, math.inf, 3.0])
    assert measure(inf, reference, oracle, sensitivity=moves, **kw) == measure(inf, reference, oracle,
                                                                             sensitivity=1e-3, **kw)
    assert asked == [1]


def test_the_oracle_runs_without_cudnn_on_a_gpu_unless_asked_and_puts_it_back(monkeypatch):
    from kgate.oracle import ORACLE_CUDNN_ENV, oracle_call

    before = torch.backends.cudnn.enabled
    seen = []
    for value, device in (("0", "cuda"), ("0", "cpu"), ("1", "cuda"), (None, "cuda")):
        if value is None:
            monkeypatch.delenv(ORACLE_CUDNN_ENV, raising=False)
        else:
            monkeypatch.setenv(ORACLE_CUDNN_ENV, value)
        with oracle_call(torch.device(device)):  # (no device work: the flag alone)
            seen.append(torch.backends.cudnn.enabled)
        assert torch.backends.cudnn.enabled == before
    assert seen == [False, before, before, False]  # (0 or unset: without; 1: as it was; the CPU: as it was)
