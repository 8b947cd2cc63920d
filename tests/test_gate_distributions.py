"""distributions gate: oracle bound on redrawn value distributions, shrunk to the fewest drawn values."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kgate import gates as registry
from kgate.gates.distributions import DISTRIBUTIONS, FRESH_SEEDS, transform
from tests.domain_support import decayed_keys, decayed_keys_reference, keys_and_gates
from tests.gate_harness import check, subject_for

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
    assert f"oracle bound held on {len(FRESH_SEEDS) + 1 + 5} probe(s)" in result.message
    assert "one argument at a time where the reference rejects all at once: zeros, constant" in result.message
    assert "skipped 11 the reference rejects: zeros on argument 0 (" in result.message


def test_failure_on_a_per_argument_probe_names_the_argument_and_shrinks_within_it():
    def clamped_decay(k, g):  # exact while the cumulated gate stays above -60, as on the factory's inputs
        return torch.exp(torch.cumsum(g, dim=-1).clamp(min=-60)).unsqueeze(-1) * k

    assert check("oracle", clamped_decay, decayed_keys_reference, keys_and_gates).verdict == "pass"
    result = check("distributions", clamped_decay, decayed_keys_reference, keys_and_gates)
    assert result.verdict == "fail" and result.message.startswith("distribution 'huge'")
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
    result = run(residual_when_zero(1e-7), tripled, dtypes=["float32"])
    assert result.verdict == "fail" and "distribution 'zeros'" in result.message, result.message
