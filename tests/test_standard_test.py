"""The standard-test replica against KernelBench's rules (its eval module's run_and_check_correctness):
seeds, 5 trials, shape check first, allclose at atol=rtol=1e-2, stop at the first exception."""

from __future__ import annotations

import torch
import torch.nn as nn

from kgate import standard_test as st


class Ref(nn.Module):
    def forward(self, x):
        return torch.tanh(x)


class Offset(nn.Module):
    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    def forward(self, x):
        return torch.tanh(x) + self.offset


def _inputs():
    return [torch.randn(16, 16)]


def test_trial_seeds_follow_kernelbench():
    # KernelBench: torch.manual_seed(seed), then one torch.randint(0, 2**32 - 1, (1,)) per trial.
    g = torch.Generator().manual_seed(42)
    expected = [int(torch.randint(0, 2**32 - 1, (1,), generator=g)) for _ in range(5)]
    assert st.trial_seeds(42, 5) == expected
    assert st.trial_seeds(43, 5) != expected


def test_inputs_are_drawn_after_seeding_each_trial():
    seen = []

    def recording_inputs():
        seen.append(torch.initial_seed())
        return [torch.randn(4)]

    st.run(Ref(), Ref(), recording_inputs, "cpu")
    assert seen == st.trial_seeds(42, 5)


def test_tolerance_is_atol_rtol_1e2_and_1e4_is_recorded():
    ok = st.run(Ref(), Offset(0.005), _inputs, "cpu")
    assert ok.verdict == "pass" and ok.trials_passed == 5
    assert ok.accepted_at == {"0.01": True, "0.0001": False}
    bad = st.run(Ref(), Offset(0.05), _inputs, "cpu")
    assert bad.verdict == "fail" and bad.trials_passed == 0
    assert len(bad.max_difference) == 5 and abs(bad.max_difference[0] - 0.05) < 1e-6
    exact = st.run(Ref(), Ref(), _inputs, "cpu")
    assert exact.accepted_at == {"0.01": True, "0.0001": True}


def test_shape_mismatch_rejects_at_once():
    class Flat(nn.Module):
        def forward(self, x):
            return torch.tanh(x).flatten()

    result = st.run(Ref(), Flat(), _inputs, "cpu")
    assert result.verdict == "fail" and "shape mismatch" in result.message and result.trials_passed == 0


def test_exception_is_a_runtime_error_and_stops():
    calls = []

    class Boom(nn.Module):
        def forward(self, x):
            calls.append(1)
            raise RuntimeError("launch failed")

    result = st.run(Ref(), Boom(), _inputs, "cpu")
    assert result.verdict == "error" and "RuntimeError: launch failed" in result.message
    assert len(calls) == 1


def test_an_output_of_another_dtype_is_an_error_of_the_comparison_not_of_the_kernel():
    """torch.allclose raises on a float64 output against a float32 one (KernelBench records it as a runtime
    error too); the message names the comparison, not ModelNew, which returned."""

    class Wider(nn.Module):
        def forward(self, x):
            return torch.tanh(x.double())

    result = st.run(Ref(), Wider(), _inputs, "cpu")
    assert result.verdict == "error" and "the comparison (torch.allclose) raised" in result.message, result.message
    assert "ModelNew raised" in st.run(Ref(), type("Boom", (nn.Module,), {
        "forward": lambda self, x: 1 / 0})(), _inputs, "cpu").message


def test_nan_anywhere_fails_even_where_the_reference_is_nan():
    class NanRef(nn.Module):
        def forward(self, x):
            y = x.clone()
            y[0, 0] = float("nan")
            return y

    # torch.allclose has equal_nan=False: KernelBench rejects even a bit-identical NaN.
    assert st.run(NanRef(), NanRef(), _inputs, "cpu").verdict == "fail"


def test_one_bad_trial_of_five_rejects():
    class SometimesWrong(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return torch.tanh(x) + (1.0 if self.calls == 3 else 0.0)

    result = st.run(Ref(), SometimesWrong(), _inputs, "cpu")
    assert result.verdict == "fail" and result.trials_passed == 4 and "4/5" in result.message


def test_floating_inputs_are_cast_to_the_precision_and_integer_ones_kept():
    seen = []

    class Probe(nn.Module):
        def forward(self, x, labels):
            seen.append((x.dtype, labels.dtype))
            return x

    st.run(Probe(), Probe(), lambda: [torch.randn(3, dtype=torch.float64), torch.randint(0, 4, (3,))], "cpu")
    # KernelBench casts integer inputs too, so a problem with class indices cannot run there; the replica
    # departs from it in that alone
    assert seen and all(d == (torch.float32, torch.int64) for d in seen)
