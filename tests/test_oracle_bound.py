"""The oracle bound at the ends of a dtype's range: an overflow to Inf from within the bound, and the floor
at subnormal magnitudes (kgate/oracle.py, measure)."""

from __future__ import annotations

import math

import torch

from kgate.oracle import measure, overflow_threshold

F32 = torch.float32
MAX = float(torch.finfo(F32).max)
STEP = float(torch.finfo(F32).smallest_normal) * float(torch.finfo(F32).eps)  # the smallest subnormal


def judge(kernel, reference, oracle, dtype=F32):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return measure(t(kernel).to(dtype), t(reference).to(dtype), t(oracle), path="out", factor=8, ulps=4, atol=0)


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
