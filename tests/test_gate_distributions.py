"""distributions gate: oracle bound on redrawn value distributions, shrunk to the fewest drawn values."""

from __future__ import annotations

import importlib.util
import math
import re
import time
from pathlib import Path

import pytest
import torch

from kgate import gates as registry
from kgate import search
from kgate.gates.distributions import (
    BOOLEAN_FAMILIES,
    DISTRIBUTIONS,
    FLOATING_FAMILIES,
    FRESH_SEEDS,
    INTEGER_FAMILIES,
    SORTED_FAMILIES,
    WEIGHT_FAMILIES,
    aligned,
    argument_probes,
    transform,
)
from tests.domain_support import decayed_keys, decayed_keys_reference, keys_and_gates
from tests.gate_harness import catalogue, check, normal_inputs, subject_for

CATALOGUE = Path(__file__).resolve().parent.parent / "gates" / "distributions"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"catalogue_distributions_{name}", CATALOGUE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


correct, violating = _load("correct"), _load("violating")


def run(kernel, reference, **kw):
    return check("distributions", kernel, reference, correct.make_inputs, **kw)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("kernel", "reference"), [(correct.silu, correct.silu_reference),
                                                    (correct.softplus, correct.softplus_reference)])
def test_correct_controls_pass(kernel, reference, dtype):
    result = run(kernel, reference, dtypes=[dtype])
    assert result.verdict == "pass", result.message
    assert f"{len(DISTRIBUTIONS)} distributions" in result.message and result.evidence


def test_flushing_subnormals_fails_on_the_subnormal_distribution():
    assert check("oracle", violating.silu_flush_subnormals, correct.silu_reference,
                 correct.make_inputs).verdict == "pass"
    result = run(violating.silu_flush_subnormals, correct.silu_reference)
    assert result.verdict == "fail" and "distribution 'subnormal'" in result.message
    assert result.details["kind"] == "oracle" and not result.tolerance_free


def test_clamping_kernel_fails_on_huge_values_shrunk_to_one_value():
    result = run(violating.softplus_clamped, correct.softplus_reference)
    assert result.verdict == "fail" and "distribution 'huge'" in result.message
    assert "shrunk to 1 of 2048 values from it" in result.message and "argument 0 at [" in result.message


def test_unguarded_exp_gives_nan_where_the_oracle_is_finite():
    def softmax_ref(x):
        return torch.softmax(x, -1)

    def softmax_unguarded(x):
        z = torch.exp(x)
        return z / z.sum(-1, keepdim=True)

    result = run(softmax_unguarded, softmax_ref)
    assert result.verdict == "fail" and result.broken and "got nan" in result.message


def test_kernel_failing_on_the_factory_inputs_is_reported_as_such():
    result = run(lambda x: correct.silu(x) + 1e-3, correct.silu_reference)
    assert result.verdict == "fail" and result.message.startswith("the factory's inputs (seed 0)")


def test_fresh_seed_failure_reproduces_with_its_seed():
    def wrong_for_one_seed(x):
        return correct.silu(x) * (1.01 if float(x[0, 0]) == float(correct.make_inputs(FRESH_SEEDS[0])[0][0, 0])
                                  else 1.0)

    result = run(wrong_for_one_seed, correct.silu_reference)
    assert result.verdict == "fail" and f"fresh seed (seed {FRESH_SEEDS[0]})" in result.message
    assert f"--seed {FRESH_SEEDS[0]}" in result.repro


def test_reference_rejecting_a_distribution_skips_it():
    def positive_only_reference(x):
        if (x <= 0).any():
            raise ValueError("log of a non-positive value")
        return torch.log(x)

    def positive_inputs(seed, shape=None, dtype=torch.float32):
        return (torch.rand(shape or (4, 16), generator=torch.Generator().manual_seed(seed)).to(dtype) + 0.5,)

    result = check("distributions", torch.log, positive_only_reference, positive_inputs)
    assert result.verdict == "pass" and "the reference rejects" in result.message


def test_distribution_rejected_on_all_arguments_is_judged_one_argument_at_a_time():
    # The keys must stay normalised and g <= 0: every distribution on both at once is outside the
    # domain; zeros, all-negative, huge, tiny and subnormal values of g alone are inside.
    result = check("distributions", decayed_keys, decayed_keys_reference, keys_and_gates)
    assert result.verdict == "pass", result.message
    # every probe is counted once: judged (the factory's inputs, fresh seeds, one-argument families the
    # reference accepts, search transforms inside the domain, permuted copies of each argument) or skipped
    counts = re.search(r"oracle bound held on (\d+) probe.*affine search: (\d+) transform\(s\) \((\d+) outside the "
                       r"reference domain\).*; (\d+) floating-input probe.*skipped (\d+) the reference rejects",
                       result.message)
    assert counts, result.message
    judged, tries, outside, copies, skipped = map(int, counts.groups())
    # permuted copies of gates <= 0 stay in the domain; the keys', on the family's grid of 1/16, are no longer
    # normalised: rejected, and counted among the skipped
    assert copies == 1
    assert judged == 1 + len(FRESH_SEEDS) + (2 * len(DISTRIBUTIONS) - (skipped - 1)) + (tries - outside) + copies
    assert "one argument at a time where the reference rejects all at once: zeros, constant" in result.message
    assert "zeros on argument 0 (" in result.message and "zeros on argument 1 (" not in result.message


def test_failure_on_a_per_argument_probe_names_the_argument_and_shrinks_within_it():
    def clamped_decay(k, g):  # exact while the cumulated gate stays above -60, as on the factory's inputs
        return torch.exp(torch.cumsum(g, dim=-1).clamp(min=-60)).unsqueeze(-1) * k

    assert check("oracle", clamped_decay, decayed_keys_reference, keys_and_gates).verdict == "pass"
    result = check("distributions", clamped_decay, decayed_keys_reference, keys_and_gates)
    # (not on 'huge': there the truth is 0 throughout, and exp(-60) is far below an ulp of the usual output)
    assert result.verdict == "fail" and result.message.startswith("distribution 'offset below zero'"), result.message
    assert "on argument 1 alone, the others as the factory made them" in result.message
    assert result.details["argument"] == 1
    assert "of 64 values from it" in result.message and "argument 1 at [" in result.message
    assert "argument 0 at [" not in result.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_each_distribution_is_finite_and_in_dtype(name, dtype):
    x = torch.randn(64, 64, dtype=torch.float64).to(dtype)
    (y,) = transform((x,), name, seed=3)
    assert y.dtype == dtype and y.shape == x.shape and torch.isfinite(y).all()
    tiny = torch.finfo(dtype).tiny
    if name == "subnormal":
        assert (y.abs() < tiny).all() and (y != 0).any()
    if name == "all-negative":
        assert (y < 0).all()


@pytest.mark.parametrize("gate", registry.GATE_NAMES)
def test_correct_control_passes_every_gate(gate):
    subject = subject_for(correct.softplus, correct.softplus_reference, correct.make_inputs)
    result = registry.get(gate).check(subject)
    assert result.verdict in ("pass", "skip"), f"{gate}: {result.message}"


# --- degenerate inputs: the floor from the output's usual magnitude ------------------------------------

def tripled(x):
    return x * 3


def residual_when_zero(size):
    """x * 3, but off by `size` where every input is zero: the residue a normalization's float32 mean leaves
    on a constant input (an ulp, divided by sqrt(eps)), where the exact answer and the reference are 0."""
    return lambda x: x * 3 + (size if not x.any() else 0.0)


def test_on_zeros_an_error_below_an_ulp_of_the_usual_output_is_no_finding():
    """On zeros the exact output is 0 and the reference exact, so the bound's floor would be 0: a kernel
    off by 1e-7 there (a fraction of an ulp of its usual outputs, up to about 20) would fail."""
    result = run(residual_when_zero(1e-7), tripled, dtypes=["float32"])
    assert result.verdict == "pass", result.message


def test_an_output_that_a_distribution_makes_zero_throughout_has_its_floor_at_the_usual_magnitude():
    """A decay gradient formed by an identity: exact 0 where every exp(g) underflowed (the 'huge' log gates), and
    a kernel whose terms leave a residue of 1e-7 of the usual size there passes; a residue of 1e-3 fails."""

    def decay_reference(x, g):
        return (torch.exp(g) * x).sum(dim=-1)

    def residue(size):
        def kernel(x, g):  # a residue where every decay of the row underflows, in float64 too
            out = (torch.exp(g) * x).sum(dim=-1)
            return torch.where((g < -1e3).all(dim=-1), torch.full_like(out, size), out)
        return kernel

    def decays(seed, shape=None, dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(8, 32, generator=gen).to(dtype), -torch.rand(8, 32, generator=gen).to(dtype))

    assert check("distributions", residue(1e-7), decay_reference, decays).verdict == "pass"
    bad = check("distributions", residue(1e-3), decay_reference, decays)
    assert bad.verdict == "fail", bad.message


def test_on_zeros_a_real_error_still_fails(monkeypatch):
    def nan_when_constant(x):  # 0/0 where every value is equal
        return x * 3 + (x - x.mean()) / x.std() * 0

    result = run(residual_when_zero(1e-3), tripled, dtypes=["float32"])
    assert result.verdict == "fail" and "distribution 'zeros'" in result.message, result.message
    result = run(nan_when_constant, tripled, dtypes=["float32"])
    assert result.verdict == "fail" and "distribution 'zeros'" in result.message, result.message
    # and without the floor from the usual magnitude, the 1e-7 offset fails on zeros (the case this is for)
    from kgate.gates import distributions

    monkeypatch.setattr(distributions, "FLOOR_FROM_FACTORY", ())

    class NoFloor(distributions.AtZero):  # nor the floor of an output that is 0 throughout
        def __init__(self, usual):
            super().__init__()

    monkeypatch.setattr(distributions, "AtZero", NoFloor)
    result = run(residual_when_zero(1e-7), tripled, dtypes=["float32"])
    assert result.verdict == "fail" and "distribution 'zeros'" in result.message, result.message


# --- offsets and the affine search ---------------------------------------------------------------------

@pytest.mark.parametrize("kernel", [correct.variance_two_pass, correct.variance_welford])
def test_stable_variances_pass_under_a_large_common_offset(kernel):
    result = run(kernel, correct.variance_reference)
    assert result.verdict == "pass", result.message
    tries = search.RANDOM_TRIES + len(search.sweep(correct.make_inputs(0), [0])) + search.CLIMB_TRIES
    assert f"affine search: {tries} transform(s)" in result.message


def test_one_pass_variance_fails_on_the_common_offset():
    assert check("oracle", violating.variance_one_pass, correct.variance_reference,
                 correct.make_inputs).verdict == "pass"
    result = run(violating.variance_one_pass, correct.variance_reference)
    assert result.verdict == "fail" and result.message.startswith("distribution 'offset above zero'"), result.message
    assert result.details["ratio"] > 2


def test_running_max_from_zero_fails_on_rows_far_below_zero():
    assert run(correct.logsumexp_online, correct.logsumexp_reference).verdict == "pass"
    result = run(violating.logsumexp_max_from_zero, correct.logsumexp_reference)
    assert result.verdict == "fail" and result.message.startswith("distribution 'offset below zero'"), result.message
    assert "got -inf" in result.message and result.broken


def logsumexp_sentinel(x, block=64):
    """A running maximum started at the finite sentinel -1e4: wrong only on rows below about -1e4, which
    no fixed family reaches (the offset family lies about 2000 below zero)."""
    m = torch.full(x.shape[:-1], -1e4, dtype=x.dtype)
    s = torch.zeros_like(m)
    for k0 in range(0, x.shape[-1], block):
        chunk = x[..., k0:k0 + block]
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        s = s * torch.exp(m - m_new) + torch.exp(chunk - m_new.unsqueeze(-1)).sum(dim=-1)
        m = m_new
    return m + torch.log(s)


def test_the_affine_search_finds_what_no_family_reaches_and_names_the_transform():
    result = run(logsumexp_sentinel, correct.logsumexp_reference)
    assert result.verdict == "fail" and result.message.startswith("search: argument 0 scaled by 10^"), result.message
    assert "x its spread (the seeded affine search's try" in result.message and result.broken
    # the transform the message names reproduces the failure
    match = re.match(r"search: argument 0 scaled by 10\^(\S+) and shifted by (\S+) x its spread", result.message)
    (x,) = search.apply(correct.make_inputs(0), search.Transform(((0, search.Affine(float(match[1]),
                                                                                     float(match[2]))),)))
    assert torch.isneginf(logsumexp_sentinel(x)).any() and torch.isfinite(correct.logsumexp_reference(x)).all()


def test_the_search_is_seeded_and_stops_at_the_first_failure():
    args = (torch.randn(4, 8), torch.randn(4, 8))
    seen: list[list[tuple]] = [[], []]
    for record in seen:
        search.search(args, [0, 1], 7, lambda inputs, r=record: r.append(tuple(inputs)) or (0.0, None, False),
                      seconds=60)
    assert len(seen[0]) == search.RANDOM_TRIES + len(search.sweep(args, [0, 1])) + search.CLIMB_TRIES
    assert all(torch.equal(a, b) for p, q in zip(*seen) for a, b in zip(p, q))
    found = search.search(args, [0, 1], 7, lambda inputs: (1.0, "bad", True), seconds=60)
    assert found.tries == 1 and found.failure is not None and found.failure[2] == "bad"


def _normalised(x):  # x / (|x| + eps), as an Adagrad step from a zero state divides a gradient by its own size
    return x / (x.abs() + 1e-10)


def _normalised_rsqrt(x):  # x / sqrt(x^2 + eps^2): the same except where |x| is within ~3 decades of eps
    w = x.double()  # wide inside: no overflow or underflow of its own, only the constant's other place
    return (w * torch.rsqrt(w * w + 1e-20)).to(x.dtype)


def _normalised_fused(x):  # correct, computed otherwise: a reciprocal of the sum, then a product
    return x * torch.reciprocal(x.abs() + 1e-10)


def test_the_sweep_covers_every_third_decade_the_dtype_holds_nearest_first_jointly_then_alone():
    args = (torch.randn(4, 8), torch.randn(4, 8))
    swept = search.sweep(args, [0, 1])
    joint = [t for t in swept if len(t.parts) == 2]
    decades = [t.parts[0][1].log_scale for t in joint]
    assert decades[:4] == [-6, 6, -9, 9] and min(decades) == -36 and max(decades) == 36
    assert sorted(decades) == [k for k in range(-36, 37, 3) if abs(k) > 3]
    assert all(a.offset == 0 for t in swept for _, a in t.parts)
    assert [t.argument for t in swept[len(joint):]] == [0] * len(joint) + [1] * len(joint)
    assert search.sweep((torch.randn(4).half(),), [0]) == []  # float16's decades are the drawn range's


def test_a_constant_that_matters_only_far_from_unit_scale_is_found_by_the_sweep():
    # no fixed family reaches |x| ~ 1e-10: 'tiny' is far below it, 'decades' far above
    result = run(_normalised_rsqrt, _normalised)
    assert result.verdict == "fail", result.message
    match = re.match(r"search: argument 0 scaled by 10\^(-\S+) \(", result.message)
    assert match and -13 <= float(match[1]) <= -5, result.message
    (x,) = search.apply(correct.make_inputs(0), search.Transform(((0, search.Affine(float(match[1]), 0.0)),)))
    err = (_normalised_rsqrt(x).double() - _normalised(x.double())).abs().max()
    assert err > 1e-3


def test_the_same_step_computed_otherwise_passes_every_swept_decade():
    result = run(_normalised_fused, _normalised)
    assert result.verdict == "pass", result.message


# --- integer inputs: repeated values, one value ------------------------------------------------------------

def _segments(seed, shape=None, dtype=torch.float32):
    """16 rows of values and a distinct segment index for each (a permutation): no index repeats here."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(16, 4, generator=gen, dtype=torch.float64).to(dtype), torch.randperm(32, generator=gen)[:16])


def _segment_sum(values, index):
    return torch.zeros(32, values.shape[1], dtype=values.dtype).index_add_(0, index, values)


def _stored(values, index):  # a scatter store: right while no index repeats
    out = torch.zeros(32, values.shape[1], dtype=values.dtype)
    out[index] = values
    return out


def test_integer_repeats_catch_a_store_where_the_sum_must_add():
    result = check("distributions", _stored, _segment_sum, _segments)
    assert result.verdict == "fail", result.message
    assert "integer argument 1 as 'integer repeats'" in result.message and result.details["argument"] == 1


def test_integer_probes_pass_an_adding_scatter():
    result = check("distributions", _segment_sum, _segment_sum, _segments)
    assert result.verdict == "pass", result.message
    assert "3 integer- or boolean-input probe(s)" in result.message


def test_a_tree_sum_that_overflows_a_partial_sum_near_the_largest_value_passes():
    """Near float32's largest value a pairwise tree's partial sum overflows in rows whose exact total (and the
    reference, summed in float64) is finite: the terms of the row sums add up past the range, so those
    non-finite outputs are not judged, and the count is in the evidence."""
    result = check("distributions", correct.row_sum_tree, correct.row_sum_reference, correct.make_rows)
    assert result.verdict == "pass", result.message
    assert any(e.get("beyond_range") for e in result.evidence), "no row overflowed: the control tests nothing"


def test_a_sum_that_overflows_where_no_order_of_summation_does_still_fails():
    result = check("distributions", violating.row_sum_prescaled, correct.row_sum_reference, correct.make_rows)
    assert result.verdict == "fail" and result.details["distribution"].startswith("distribution 'huge'"), \
        result.message
    assert "within the dtype's range: no order of summation overflows" in result.message


def _masked_mean_ref(x, mask):
    total = torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype)).sum(dim=1)
    return total / mask.sum(dim=1, keepdim=True).to(x.dtype)


def _masked_mean_clamped(x, mask):
    total = torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype)).sum(dim=1)
    return total / mask.sum(dim=1, keepdim=True).clamp(min=1).to(x.dtype)


def _masked_inputs(seed, shape=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 17, (6,), generator=g)
    return torch.randn(6, 16, 4, generator=g).to(dtype), torch.arange(16).unsqueeze(0) < lengths.unsqueeze(1)


def test_a_mask_that_selects_nothing_is_drawn_and_a_finite_value_where_both_give_nan_fails():
    """A masked mean whose count is clamped at 1 gives 0 for a row with nothing selected, where the reference
    and the oracle give 0/0 = NaN: the random masks always select something, so only the boolean family
    'mask all false' shows it, and only the NaN rule judges it (the bound measures finite elements)."""
    bad = check("distributions", _masked_mean_clamped, _masked_mean_ref, _masked_inputs)
    assert bad.verdict == "fail" and bad.tolerance_free, bad.message
    assert "'mask all false'" in bad.message and "give NaN" in bad.message, bad.message
    good = check("distributions", _masked_mean_ref, _masked_mean_ref, _masked_inputs)
    assert good.verdict == "pass" and "boolean-input probe" in good.message, good.message


def test_nan_lost_finds_a_finite_value_only_where_oracle_and_reference_both_give_nan():
    from kgate.shrink import nan_lost

    nan = float("nan")
    ref, truth = torch.tensor([nan, 1.0, nan]), torch.tensor([nan, nan, 2.0], dtype=torch.float64)
    assert nan_lost(torch.tensor([nan, 0.0, 0.0]), ref, truth) is None  # NaN where both are: kept
    assert nan_lost(torch.tensor([0.5, 0.0, 0.0]), ref, truth) == ("out", (0,), 0.5, 1)


def _angle_ref(y, x):
    return torch.atan2(y, x)


def _angle_by_octant(y, x):
    """atan2 from atan(y/x) by the signs of x and y tested with < 0: a -0.0 taken as +0.0."""
    base = torch.atan(y / x)
    turn = torch.where(y < 0, -math.pi, math.pi)
    out = torch.where(x < 0, base + turn, base)
    zero_x = torch.where(y < 0, -math.pi / 2, torch.where(y > 0, math.pi / 2, 0.0))
    return torch.where(x == 0, zero_x.to(base.dtype), out)


def _two_rows(seed, shape=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 64, generator=g).to(dtype), torch.randn(8, 64, generator=g).to(dtype)


def test_signed_zeros_tell_an_angle_that_ignores_the_sign_of_zero():
    """atan2(-0.0, x < 0) is -pi and atan2(+-0.0, -0.0) is +-pi: an angle built from `< 0` tests agrees on
    every random input and on +0.0, and is 2*pi off on the signed-zeros distribution."""
    bad = check("distributions", _angle_by_octant, _angle_ref, _two_rows)
    assert bad.verdict == "fail" and "'signed zeros'" in bad.message, bad.message
    assert check("distributions", torch.atan2, _angle_ref, _two_rows).verdict == "pass"


# --- integer magnitudes and sentinels ------------------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "family"), [(violating.hashed_embedding_float_bucket, "past float32's integers"),
                                                (violating.hashed_embedding_int32, "past int32"),
                                                (violating.hashed_embedding_fmod, "negated"),
                                                (violating.hashed_embedding_float64_bucket,
                                                 "past float64's integers")])
def test_integer_magnitudes_catch_a_hashed_embedding_bucketed_wrong(kernel, family):
    """Ids below 50000 are exact in float32, float64 and int32 and never negative: each wrong bucket agrees with the
    reference's torch.remainder on the factory's ids, and fails on the family that reaches past its range."""
    assert check("oracle", kernel, correct.hashed_embedding_reference, correct.make_ids).verdict == "pass"
    result = check("distributions", kernel, correct.hashed_embedding_reference, correct.make_ids)
    assert result.verdict == "fail" and result.details["argument"] == 1, result.message
    assert result.message.startswith(f"integer argument 1 as {family!r}"), result.message
    if family == "negated":  # index_select raises on a negative bucket, where the reference gives a row
        assert "kernel raised IndexError" in result.message


@pytest.mark.parametrize("kernel", [correct.hashed_embedding, correct.hashed_embedding_floor_divide])
def test_an_int64_bucket_passes_every_integer_family(kernel):
    result = check("distributions", kernel, correct.hashed_embedding_reference, correct.make_ids)
    assert result.verdict == "pass" and "rejects" not in result.message, result.message
    assert f"{len(INTEGER_FAMILIES)} integer- or boolean-input probe(s)" in result.message


def test_positions_through_float16_fail_past_2048_and_float32_positions_pass_past_int32():
    """Rotary embedding: positions below 2048 are exact in float16. Past 2^24 and 2^31 the float32 reference
    rounds the positions itself; the bound takes its error, so a kernel that converts them as it does passes."""
    result = check("distributions", violating.rotary_float16_positions, correct.rotary_reference, correct.make_rotary)
    assert result.verdict == "fail" and "as \"past float16's integers\"" in result.message, result.message
    good = check("distributions", correct.rotary, correct.rotary_reference, correct.make_rotary)
    assert good.verdict == "pass" and "rejects" not in good.message, good.message
    # consecutive positions are sorted: repeated boundaries apply (one long segment is the positions themselves)
    assert f"{len(INTEGER_FAMILIES) + 1} integer- or boolean-input probe(s)" in good.message


def test_ignored_targets_catch_smoothing_summed_over_ignored_rows():
    """cross_entropy(ignore_index=-100, label_smoothing=0.1): the factory ignores no target; the sentinel -100
    does, and -1 and the targets past the classes are outside the reference's domain (skipped)."""
    result = check("distributions", violating.smoothed_cross_entropy_unmasked,
                   correct.smoothed_cross_entropy_reference, correct.make_logits)
    assert result.verdict == "fail" and "as 'sentinel -100'" in result.message, result.message
    good = check("distributions", correct.smoothed_cross_entropy, correct.smoothed_cross_entropy_reference,
                 correct.make_logits)
    assert good.verdict == "pass", good.message
    # judged: repeats, one value, -100; skipped: the six families that leave [0, 10) other than for -100
    assert "4 integer- or boolean-input probe(s)" in good.message and "skipped 6 the reference rejects" in good.message
    assert "past float16's integers on argument 1" in good.message, good.message


def test_a_divisor_cached_per_shape_is_caught_at_the_same_shape():
    """The count of non-ignored targets kept from the first call (the factory's inputs) is wrong once the same
    kernel instance is called, at the same shape, with targets set to -100."""
    result = check("distributions", violating.SmoothedCrossEntropyCachedCount(),
                   correct.smoothed_cross_entropy_reference, correct.make_logits)
    assert result.verdict == "fail" and "as 'sentinel -100'" in result.message, result.message


@pytest.mark.parametrize(("dtype", "absent"), [(torch.int64, set()),
                                               (torch.int32, {"past int32", "past float64's integers"}),
                                               (torch.int16, {"past float32's integers", "past int32",
                                                              "past float64's integers"}),
                                               (torch.uint8, set(INTEGER_FAMILIES) - {"integer repeats",
                                                                                      "integer one value",
                                                                                      "integer consecutive"})])
def test_integer_families_apply_where_the_dtype_holds_their_values(dtype, absent):
    ids = torch.randint(0, 200, (4, 16), generator=torch.Generator().manual_seed(1)).to(dtype)
    probes = {name: probe[0] for name, _, probe in argument_probes((ids,), seed=0)}
    assert set(probes) == set(INTEGER_FAMILIES) - absent
    for values in probes.values():
        assert values.dtype == dtype and values.shape == ids.shape and not torch.equal(values, ids)
    if "past int32" in probes:
        assert int(probes["past int32"].min()) > 2**31 and int(probes["past int32"].max()) <= 2**31 + 200
    if "negated" in probes:
        assert torch.equal(probes["negated"], -ids.long() - 1)
    for sentinel in (-1, -100):
        if f"sentinel {sentinel}" in probes:
            hit = probes[f"sentinel {sentinel}"] == sentinel
            assert 0 < hit.sum() < ids.numel() and torch.equal(probes[f"sentinel {sentinel}"][~hit], ids[~hit])


def test_on_a_device_values_past_the_arguments_range_reach_the_reference_only_inside_its_host_domain(monkeypatch):
    """Off the CPU an index out of range is a device-side assert that loses the CUDA context: there a family that
    leaves the argument's own range is first asked of the float64 oracle on the host, and one it rejects never
    reaches the reference."""
    from kgate.gates import distributions

    seen = []

    def plain_embedding(table, ids):  # ids must lie in [0, 1000)
        if table.dtype == torch.float32:
            seen.append((int(ids.min()), int(ids.max())))
        return torch.nn.functional.embedding(ids, table)

    def ids_in_range(seed, shape=None, dtype=torch.float32, device="cpu"):
        table, ids = correct.make_ids(seed, shape, dtype, device)
        return table, ids.remainder(1000)

    monkeypatch.setattr(distributions, "_asserts_on_device", lambda subject: True)
    result = check("distributions", plain_embedding, plain_embedding, ids_in_range)
    assert result.verdict == "pass" and "past float16's integers on argument 1" in result.message, result.message
    assert seen and all(0 <= lo and hi < 1000 for lo, hi in seen)
    monkeypatch.setattr(distributions, "_asserts_on_device", lambda subject: False)
    seen.clear()
    assert check("distributions", plain_embedding, plain_embedding, ids_in_range).verdict == "pass"
    assert any(lo < 0 for lo, hi in seen)  # on the CPU the reference itself raises on them


# --- permuted copies ------------------------------------------------------------------------------------------

def test_permuted_copies_catch_a_gram_deduped_by_a_permutation_invariant_checksum():
    result = check("distributions", violating.gram_dedup_by_checksum, correct.gram_reference, correct.make_channels)
    assert result.verdict == "fail" and result.details["argument"] == 0, result.message
    assert result.message.startswith("floating argument 0 as 'permuted copies'"), result.message
    good = check("distributions", correct.gram, correct.gram_reference, correct.make_channels)
    assert good.verdict == "pass" and "1 floating-input probe(s)" in good.message, good.message


@pytest.mark.parametrize("shape", [(4, 3, 64), (3, 1, 5, 2), (2, 7)])
def test_permuted_copies_are_entry_zero_reordered_along_the_next_dimension_of_more_than_one(shape):
    x = torch.round(torch.randn(shape) * 16) / 16  # (the family puts the values on a grid of 1/16 first)
    y = FLOATING_FAMILIES["permuted copies"][1](x, torch.Generator().manual_seed(0))
    dim = next(d for d in range(1, len(shape)) if shape[d] > 1)
    assert y.shape == x.shape and torch.equal(y[0], x[0])
    assert torch.equal(y.sum(tuple(range(1, len(shape)))), y[:1].sum(tuple(range(1, len(shape)))).expand(shape[0]))
    for entry in y[1:]:
        assert not torch.equal(entry, x[0])
        assert torch.equal(entry.sort(dim - 1).values, x[0].sort(dim - 1).values)  # the same slices, reordered
    assert FLOATING_FAMILIES["permuted copies"][1](torch.randn(1, 8), torch.Generator()) is None
    assert FLOATING_FAMILIES["permuted copies"][1](torch.randn(8), torch.Generator()) is None


# --- mask structures -----------------------------------------------------------------------------------------

def test_left_padded_masks_catch_a_kernel_that_assumes_right_padding():
    """The factory's masks are right-padded; a kernel that skips the mask where every row's last key is valid is
    right on them and on 'mask all true', and wrong on left padding and on holes."""
    result = check("distributions", violating.masked_softmax_assumes_right_padding, correct.masked_softmax_reference,
                   correct.make_attention)
    assert result.verdict == "fail" and "boolean argument 1 as 'left padding'" in result.message, result.message
    good = check("distributions", correct.masked_softmax, correct.masked_softmax_reference, correct.make_attention)
    assert good.verdict == "pass" and f"{len(BOOLEAN_FAMILIES)} integer- or boolean-input" in good.message, \
        good.message


def test_holes_alone_catch_a_kernel_that_assumes_right_padding(monkeypatch):
    from kgate.gates import distributions

    monkeypatch.setattr(distributions, "BOOLEAN_FAMILIES", {"holes": BOOLEAN_FAMILIES["holes"]})
    result = check("distributions", violating.masked_softmax_assumes_right_padding, correct.masked_softmax_reference,
                   correct.make_attention)
    assert result.verdict == "fail" and "boolean argument 1 as 'holes'" in result.message, result.message


def test_mask_structures_along_the_last_dimension():
    mask = torch.ones(64, 2, 12, dtype=torch.bool)
    left, right, holes = (BOOLEAN_FAMILIES[name][1](mask, torch.Generator().manual_seed(0))
                          for name in ("left padding", "right padding", "holes"))
    for m in (left, right, holes):
        assert m.shape == mask.shape and m.any(-1).all() and not m.all()
    count = left.sum(-1, keepdim=True)
    assert torch.equal(left, torch.arange(12) >= 12 - count)  # leading False, then True
    assert torch.equal(right, torch.arange(12) < right.sum(-1, keepdim=True))  # True, then trailing False
    assert holes[..., 0].all() and holes[..., -1].all() and not holes.all()
    assert BOOLEAN_FAMILIES["holes"][1](torch.ones(4, 2, dtype=torch.bool), torch.Generator()) is None


def test_rounding_ties_catch_halves_rounded_away_from_zero_judged_without_the_input_sensitivity(monkeypatch):
    result = check("distributions", violating.fake_quant_round_half_away, correct.fake_quant_reference,
                   correct.make_activations)
    assert result.verdict == "fail" and "'rounding ties'" in result.message, result.message
    passed = check("distributions", correct.fake_quant_codes, correct.fake_quant_reference, correct.make_activations)
    assert passed.verdict == "pass", passed.message
    from kgate.gates import distributions

    # with the input sensitivity as the least reference error, a tie's step (an ulp flips it) excuses any rule
    monkeypatch.setattr(distributions, "EXACT_INPUTS", ())
    assert check("distributions", violating.fake_quant_round_half_away, correct.fake_quant_reference,
                 correct.make_activations).verdict == "pass"


def test_rounding_ties_are_exact_halves_with_each_rows_absmax_127():
    ties = transform((torch.randn(4, 9),), "rounding ties", 3)[0]
    assert torch.equal(ties.abs().amax(-1), torch.full((4,), 127.0))
    assert torch.equal(ties[:, 1:] - ties[:, 1:].floor(), torch.full((4, 8), 0.5))


# --- sorted boundaries ------------------------------------------------------------------------------------------

def test_repeated_boundaries_catch_segment_markers_set_by_a_store():
    """cu_seqlens of distinct boundaries mark every segment start once, by a store or an add alike; a repeated
    boundary (an empty segment in the middle) is marked once by the store, and every later row lands a segment
    early. Every other integer family leaves the reference's domain (sorted, from 0 to the row count)."""
    assert check("oracle", violating.segment_sums_marker_store, correct.segment_sums_reference,
                 correct.make_ragged).verdict == "pass"
    result = check("distributions", violating.segment_sums_marker_store, correct.segment_sums_reference,
                   correct.make_ragged)
    assert result.verdict == "fail" and result.details["argument"] == 1, result.message
    assert result.message.startswith("integer argument 1 as 'repeated boundaries'"), result.message


@pytest.mark.parametrize("kernel", [correct.segment_sums_search, correct.segment_sums_marker_scan])
def test_segments_found_by_search_or_added_markers_pass_the_sorted_families(kernel):
    result = check("distributions", kernel, correct.segment_sums_reference, correct.make_ragged)
    assert result.verdict == "pass", result.message
    assert f"{len(SORTED_FAMILIES)} integer- or boolean-input probe(s)" in result.message, result.message


@pytest.mark.parametrize("family", ["one long segment last", "one long segment first"])
def test_one_long_segment_catches_segments_padded_to_a_multiple_of_the_mean_length(monkeypatch, family):
    """Evenly spread segments (4 to 12 rows) fit a slab 8 times their mean length wide; the one long segment,
    last or first, does not, and the rows past the width are dropped."""
    from kgate.gates import distributions

    assert check("oracle", violating.segment_sums_padded, correct.segment_sums_reference,
                 correct.make_ragged).verdict == "pass"
    monkeypatch.setattr(distributions, "SORTED_FAMILIES", {family: SORTED_FAMILIES[family]})
    result = check("distributions", violating.segment_sums_padded, correct.segment_sums_reference,
                   correct.make_ragged)
    assert result.verdict == "fail" and result.message.startswith(f"integer argument 1 as {family!r}"), \
        result.message


def test_sorted_families_keep_the_rows_sorted_and_their_ends():
    offsets = torch.tensor([[0, 3, 7, 12, 20, 21, 30, 40], [0, 5, 6, 8, 10, 11, 13, 14]])
    made = {name: make(offsets, torch.Generator().manual_seed(0)) for name, (_, make) in SORTED_FAMILIES.items()}
    for values in made.values():
        assert values.dtype == offsets.dtype and values.shape == offsets.shape
        assert (values.diff() >= 0).all() and not torch.equal(values, offsets)
        assert torch.equal(values[:, [0, -1]], offsets[:, [0, -1]])
    repeated = made["repeated boundaries"]
    assert ((repeated[:, 1:-1].diff() == 0) & (repeated[:, 1:-2] == repeated[:, :-3])).any(-1).all()  # 2 in a row
    assert torch.equal(made["one long segment last"][0], torch.tensor([0, 1, 2, 3, 4, 5, 6, 40]))
    assert torch.equal(made["one long segment first"][0], torch.tensor([0, 34, 35, 36, 37, 38, 39, 40]))
    # segments of 1 where the range allows them, else of 0
    tight = SORTED_FAMILIES["one long segment last"][1](torch.tensor([0, 1, 2, 3, 3]), torch.Generator())
    assert torch.equal(tight, torch.tensor([0, 0, 0, 0, 3]))
    for name, (_, make) in SORTED_FAMILIES.items():  # unsorted, or fewer than 3 along the last dimension: none
        assert make(torch.tensor([0, 5, 3, 9]), torch.Generator()) is None, name
        assert make(torch.tensor([[0, 5], [1, 9]]), torch.Generator()) is None, name


# --- fractional weights -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(WEIGHT_FAMILIES))
def test_fractional_weights_catch_weights_binarized_as_a_mask(monkeypatch, family):
    """Float weights of 0 and 1: a weighted mean that takes them for a mask (w.bool()) agrees on them, and on
    every distribution that scales them alike; fractional weights tell it from the reference."""
    from kgate.gates import distributions

    assert check("oracle", violating.weighted_mean_binarized, correct.weighted_mean_reference,
                 correct.make_weighted).verdict == "pass"
    monkeypatch.setattr(distributions, "WEIGHT_FAMILIES", {family: WEIGHT_FAMILIES[family]})
    result = check("distributions", violating.weighted_mean_binarized, correct.weighted_mean_reference,
                   correct.make_weighted)
    assert result.verdict == "fail" and result.details["argument"] == 1, result.message
    assert result.message.startswith(f"floating argument 1 as {family!r}"), result.message


def test_weights_multiplied_in_pass_the_weight_families():
    result = check("distributions", correct.weighted_mean_bmm, correct.weighted_mean_reference, correct.make_weighted)
    assert result.verdict == "pass", result.message
    # the weight families on the weights, and permuted copies of both arguments
    assert f"{len(WEIGHT_FAMILIES) + 2} floating-input probe(s)" in result.message, result.message


def test_weight_families_apply_to_values_of_0_and_1_only():
    w = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.bfloat16)
    fractional, uniform = (make(w, torch.Generator().manual_seed(0)) for _, make in WEIGHT_FAMILIES.values())
    for values in (fractional, uniform):
        assert values.dtype == w.dtype and values.shape == w.shape and (values >= 0).all() and (values <= 1).all()
    assert torch.equal(fractional == 0, w == 0) and (fractional < 1).any()
    for _, make in WEIGHT_FAMILIES.values():
        assert make(torch.tensor([0.0, 0.5, 1.0]), torch.Generator()) is None
        assert make(torch.zeros(4), torch.Generator()) is None


# --- the module's parameters at other magnitudes ----------------------------------------------------------------

class _Gated(torch.nn.Module):
    """x * sigmoid(-a) per channel, a learned decay built from 1 to 5."""

    def __init__(self):
        super().__init__()
        self.decay = torch.nn.Parameter(torch.linspace(1.0, 5.0, 16))

    def forward(self, x):
        return x * torch.sigmoid(-self.decay)


class _GatedOneMinus(_Gated):
    """1 - sigmoid(a): the same while the decay is small, exactly 0 once it passes 17."""

    def forward(self, x):
        return x * (1.0 - torch.sigmoid(self.decay))


_channels = normal_inputs((8, 16))


def test_a_gate_that_cancels_once_a_learned_decay_grows_fails_at_ten_times_its_parameters():
    result = check("distributions", _GatedOneMinus(), _Gated(), _channels)
    assert result.verdict == "fail", result.message
    assert "the module's parameters at another magnitude: the kernel's decay (the reference's decay) multiplied " \
        "by 10" in result.message, result.message
    # at the magnitude it was built with it is within the bound everywhere else
    assert check("oracle", _GatedOneMinus(), _Gated(), _channels).verdict == "pass"


def test_the_gate_written_without_cancellation_passes_every_parameter_magnitude():
    kernel = _Gated()
    result = check("distributions", kernel, _Gated(), _channels)
    assert result.verdict == "pass", result.message
    assert "6 probe(s) of the module's parameters scaled" in result.message
    assert torch.equal(kernel.decay.detach(), torch.linspace(1.0, 5.0, 16))  # put back


class _Contrastive(torch.nn.Module):
    """A symmetric contrastive loss of paired rows with a learned inverse temperature, clamped at 100: cross
    entropy of the cosine logits both ways, through log-softmax (shifted by the row maximum)."""

    def __init__(self):
        super().__init__()
        self.log_scale = torch.nn.Parameter(torch.tensor(2.0))

    def logits(self, a, b):
        a = a / a.norm(dim=-1, keepdim=True)
        b = b / b.norm(dim=-1, keepdim=True)
        return self.log_scale.exp().clamp(max=100.0) * a @ b.t()

    def forward(self, a, b):
        logits = self.logits(a, b)
        diagonal = logits.diagonal()
        return 0.5 * ((torch.logsumexp(logits, 1) - diagonal).mean() + (torch.logsumexp(logits, 0) - diagonal).mean())


class _ContrastiveSharedExp(_Contrastive):
    """One exp() of the logits for both directions, no maximum taken first: safe while scale x cosine < 88,
    infinite once the scale reaches the clamp and a pair's cosine passes 0.887."""

    def forward(self, a, b):
        logits = self.logits(a, b)
        e = logits.exp()
        diagonal = logits.diagonal()
        return 0.5 * ((e.sum(1).log() - diagonal).mean() + (e.sum(0).log() - diagonal).mean())


def _pairs(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(shape or (16, 32), generator=gen, dtype=torch.float64)
    b = 0.5 * a + torch.randn(a.shape, generator=gen, dtype=torch.float64)
    return a.to(dtype), b.to(dtype)


def test_an_unshifted_exp_fails_at_a_larger_learned_scale_on_aligned_pairs():
    """The drawn pairs have cosines near 0.45: 100 x 0.45 does not overflow; equal pairs (cosine 1) do."""
    result = check("distributions", _ContrastiveSharedExp(), _Contrastive(), _pairs)
    assert result.verdict == "fail", result.message
    assert "multiplied by 10, alike in kernel and reference, on the case's inputs with those of one shape made " \
        "equal" in result.message, result.message
    assert check("oracle", _ContrastiveSharedExp(), _Contrastive(), _pairs).verdict == "pass"


def test_a_shifted_contrastive_loss_passes_every_scale_on_aligned_pairs_too():
    result = check("distributions", _Contrastive(), _Contrastive(), _pairs)
    assert result.verdict == "pass", result.message
    assert "12 probe(s) of the module's parameters scaled" in result.message, result.message


def test_aligned_inputs_copy_the_first_of_each_shape_and_dtype():
    a, b, c = torch.randn(4, 3), torch.randn(4, 3), torch.randn(2)
    out = aligned((a, b, c, torch.randn(4, 3).double(), 5))
    assert torch.equal(out[1], a) and out[1] is not a and out[2] is c and out[4] == 5
    assert aligned((a, c)) is None


def test_consecutive_integers_run_in_order_from_the_smallest_and_wrap_within_the_arguments_range():
    _, make = INTEGER_FAMILIES["integer consecutive"]
    ids = torch.tensor([[7, 3, 9], [4, 4, 5]])
    assert make(ids, torch.Generator()).tolist() == [[3, 4, 5], [6, 7, 8]]
    assert make(torch.tensor([2, 9, 4, 3, 2, 5, 6, 8, 7, 3]), torch.Generator()).tolist() == \
        [2, 3, 4, 5, 6, 7, 8, 9, 2, 3]  # past its largest, from its smallest again
    assert make(torch.tensor([4, 4]), torch.Generator()) is None and make(torch.tensor([1]), torch.Generator()) is None


def test_an_embedding_that_serves_a_run_of_ids_as_a_view_of_its_table_fails_and_a_copy_passes():
    violating, correct = catalogue("distributions", "violating"), catalogue("distributions", "correct")
    result = check("distributions", violating.TokenTableRunView(), correct.TokenTable(), correct.make_tokens)
    assert result.verdict == "fail" and "'integer consecutive'" in result.message and \
        "shares memory with the kernel's 'table'" in result.message, result.message
    result = check("distributions", correct.TokenTableRunCopy(), correct.TokenTable(), correct.make_tokens)
    assert result.verdict == "pass", result.message


class _SignStep(torch.nn.Module):
    """A Lion-style step as a module: p -= lr sign(0.9 m + 0.1 g), then m = 0.99 m + 0.01 g; returns a copy of p."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(64, generator=torch.Generator().manual_seed(6)))
        self.register_buffer("m", torch.zeros(64))

    @staticmethod
    def sign(c):
        return torch.sign(c)

    def forward(self, g):
        with torch.no_grad():
            self.p.sub_(0.02 * self.sign(self.m * 0.9 + g * 0.1))
            self.m.mul_(0.99).add_(g, alpha=0.01)
            return self.p.detach().clone()


class _SignStepCopysign(_SignStep):
    """sign as copysign(1, c): +-1 where c is +-0, so zero gradients on a zero momentum still move p by lr."""

    @staticmethod
    def sign(c):
        return torch.copysign(torch.ones_like(c), c)


def _grads(seed, shape=None, dtype=torch.float32):
    return (torch.randn(shape or (64,), generator=torch.Generator().manual_seed(seed)).to(dtype),)


@pytest.mark.parametrize("kernel, verdict", [(_SignStepCopysign, "fail"), (_SignStep, "pass")])
def test_a_stateful_module_is_drawn_again_from_its_buffers_as_built(kernel, verdict):
    """Called once before the subject is made (as an audit's standard test calls it), the momentum is no longer 0;
    from the buffers as built, zero gradients meet a zero momentum, where copysign steps and sign does not."""
    modules = [kernel(), _SignStep()]
    for module in modules:
        module(_grads(9)[0])
    subject = subject_for(modules[0], modules[1], _grads)
    subject.buffers_as_built({id(b): torch.zeros_like(b) for m in modules for b in m.buffers()})
    result = registry.get("distributions").check(subject)
    assert result.verdict == verdict, result.message
    if verdict == "fail":
        assert "'zeros' (all zeros), from the module's buffers as built" in result.message, result.message


def _router(x):
    """The two experts of highest softmax probability per token."""
    return torch.softmax(x, dim=-1).topk(2, dim=-1).indices


def _router_by_logits(x):
    """The same ranking on the raw logits (softmax is monotone): exact, where the probabilities of logits 1e-20
    apart round to one value in float32 and in float64 alike."""
    return x.topk(2, dim=-1).indices


def _router_lowest(x):
    return (-x).topk(2, dim=-1).indices


def _logits(seed, shape=None, dtype=torch.float32):
    return (torch.randn(shape or (16, 8), generator=torch.Generator().manual_seed(seed)).to(dtype),)


def test_indices_the_oracles_own_float64_computation_ties_pass_and_a_wrong_selection_still_fails():
    """At tiny logits the reference's and the oracle's probabilities tie and they pick by position; the kernel that
    ranks the logits picks among the tied, which is as right (`Selection.ties`). Picking the lowest is not."""
    result = check("distributions", _router_by_logits, _router, _logits)
    assert result.verdict == "pass", result.message
    result = check("distributions", _router_lowest, _router, _logits)
    assert result.verdict == "fail", result.message


class _SmoothL1(torch.nn.Module):
    """A smooth L1 of the residual with a learned beta (quadratic below beta, linear above)."""

    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        d = x.abs()
        return torch.where(d < self.beta, 0.5 * d * d / self.beta, d - 0.5 * self.beta)


class _SmoothL1Branchless(_SmoothL1):
    """m (|d| - m / 2) / beta with m = min(|d|, beta): the same for beta > 0, 0/0 = NaN at beta = 0 (plain L1)."""

    def forward(self, x):
        d = x.abs()
        m = torch.minimum(d, self.beta)
        return m * (d - 0.5 * m) / self.beta


def test_a_learned_beta_of_zero_is_judged_and_a_formula_that_divides_by_it_fails():
    residuals = normal_inputs((8, 32))
    result = check("distributions", _SmoothL1Branchless(), _SmoothL1(), residuals)
    assert result.verdict == "fail" and "multiplied by 0," in result.message, result.message
    assert check("distributions", _SmoothL1(), _SmoothL1(), residuals).verdict == "pass"


def test_a_slow_kernel_passes_on_the_probes_before_the_deadline_and_says_what_it_left():
    """The worker sets a search deadline of half the gate's time limit; a kernel slow enough to reach it in the
    drawn distributions (a DenseNet whose float64 oracle takes seconds a probe) passes on the probes it had, and
    the message names those not judged, instead of a timeout that loses the verdict."""
    def slow(x):
        time.sleep(0.05)
        return correct.silu(x)

    subject = subject_for(slow, correct.silu_reference, correct.make_inputs)
    subject.deadline = time.monotonic() + 0.4
    started = time.monotonic()
    result = registry.get("distributions").check(subject)
    assert result.verdict == "pass", result.message
    assert "stopped at the search deadline" in result.message and "the drawn distributions from" in result.message
    assert result.details["cut"] and time.monotonic() - started < 10, result.details
