"""layouts gate: strided inputs must give the contiguous copy's result (bitwise where declared)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kgate import gates as registry
from kgate.gates.layouts import LAYOUTS, fresh_copy, relayout
from tests.gate_harness import check, subject_for

CATALOGUE = Path(__file__).resolve().parent.parent / "gates" / "layouts"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"catalogue_layouts_{name}", CATALOGUE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


correct, violating = _load("correct"), _load("violating")


def run(kernel, reference=None, **kw):
    kw.setdefault("shapes", [[8, 96]])
    return check("layouts", kernel, reference or correct.reference, correct.make_inputs, **kw)


def softmax_ref(x, w):
    return torch.softmax(x, -1) * w


def softmax_torch_ops(x, w):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True) * w


@pytest.mark.parametrize("bitwise", [False, True])
def test_correct_control_passes(bitwise):
    result = run(correct.rms_norm, bitwise_layouts=bitwise, dtypes=["float32", "float16"])
    assert result.verdict == "pass", result.message
    assert result.tolerance_free == bitwise
    assert "bitwise equal" in result.message


def test_kernel_assuming_contiguity_fails_and_names_the_argument():
    result = run(violating.rms_norm_assumes_contiguous)
    assert result.verdict == "fail" and result.broken
    assert result.details["arguments"] in ([0], [1])  # shrunk to one strided argument of two
    assert f"argument {result.details['arguments'][0]} " in result.message
    assert "strides" in result.message and result.repro.startswith("kgate run")


def test_reduction_order_change_passes_by_default_and_fails_when_bitwise_is_declared():
    # On a CPU, torch sums a transposed float32 tensor in another order: last-bit differences only.
    loose = run(softmax_torch_ops, softmax_ref, shapes=[[7, 1000]])
    assert loose.verdict == "pass" and "bitwise equal)" in loose.message
    strict = run(softmax_torch_ops, softmax_ref, shapes=[[7, 1000]], bitwise_layouts=True)
    assert strict.verdict == "fail" and strict.tolerance_free
    assert "differs from the contiguous copy's result" in strict.message


def test_the_reference_runs_once_per_strided_probe():
    """The reference's result on a layout, run to see whether it accepts the layout, is also what a kernel's
    non-bitwise result is measured against: not run a second time (the audit's largest problems spend
    seconds in it)."""
    layouts = []

    def counted(x, w):
        if (not x.is_contiguous() or x.storage_offset()) and 0 not in x.stride():  # (not the broadcast probe)
            layouts.append((x.stride(), x.storage_offset()))
        return softmax_ref(x, w)

    result = run(softmax_torch_ops, counted, shapes=[[7, 1000]])
    assert result.verdict == "pass" and "bitwise equal)" in result.message
    probes = int(result.message.split(" strided probe")[0])
    assert 0 < len(layouts) == len(set(layouts)) == probes


def test_kernel_that_rejects_strided_inputs_fails():
    def contiguous_only(x, w):
        assert x.is_contiguous(), "x must be contiguous"
        return correct.rms_norm(x, w)

    result = run(contiguous_only)
    assert result.verdict == "fail" and "kernel raised AssertionError: x must be contiguous" in result.message
    assert result.details["arguments"] == [0]


def test_layouts_the_reference_rejects_are_skipped():
    def view_reference(x, w):
        return correct.reference(x.view(x.shape), w.view(-1))  # .view refuses some strided inputs

    def flat_reference(x, w):
        x.view(-1)
        return correct.reference(x, w)

    assert run(correct.rms_norm, view_reference).verdict == "pass"
    result = run(correct.rms_norm, flat_reference)
    assert result.verdict == "pass" and "the reference rejects" in result.message


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_each_layout_keeps_values_and_changes_layout(kind):
    t = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    strided = relayout(t, kind)
    assert strided is not None and torch.equal(strided, t)
    assert (strided.stride(), strided.storage_offset()) != (t.stride(), 0)
    copy = fresh_copy(strided)
    assert torch.equal(copy, t) and copy.stride() == strided.stride()
    assert copy.untyped_storage().data_ptr() != strided.untyped_storage().data_ptr()


def test_padding_is_poisoned_so_reading_past_a_view_shows():
    view = relayout(torch.ones(3, 4), "sliced")
    whole = torch.empty(0).set_(view.untyped_storage())
    assert torch.isnan(whole).sum() == whole.numel() - 12


@pytest.mark.parametrize("gate", registry.GATE_NAMES)
def test_correct_control_passes_every_gate(gate):
    subject = subject_for(correct.rms_norm, correct.reference, correct.make_inputs, shapes=[[8, 96]],
                          bitwise_layouts=True)
    result = registry.get(gate).check(subject)
    assert result.verdict in ("pass", "skip"), f"{gate}: {result.message}"


@pytest.mark.parametrize("op", [torch.sum, torch.mean])
def test_a_kernel_equal_to_its_reference_passes_whatever_the_layout_does_to_rounding(op):
    """A whole-tensor sum over a strided view rounds differently from one over the contiguous copy, for
    PyTorch itself: the bound was calibrated on the contiguous run only, which happened to round well, and
    the reference, judged as its own kernel, failed."""
    def inputs(seed, shape=None, dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype),)

    result = check("layouts", op, op, inputs, shapes=[[33, 64]], seeds=[0])
    assert result.verdict == "pass", result.message


def test_one_tensor_passed_as_two_arguments_shows_a_shortcut_for_aliased_operands():
    lc, lv = _load("correct"), _load("violating")
    result = check("layouts", lv.matmul_gram_when_aliased, lc.matmul_reference, lc.make_pair)
    assert result.verdict == "fail" and "one tensor passed as arguments 0 and 1" in result.message, result.message
    passed = check("layouts", lc.matmul_blocked, lc.matmul_reference, lc.make_pair)
    assert passed.verdict == "pass" and "share memory" in passed.message, passed.message


def test_one_tensor_passed_as_all_three_arguments_shows_a_packed_qkv_shortcut():
    spec = importlib.util.spec_from_file_location("catalogue_shapes_correct_for_layouts",
                                                  Path(__file__).resolve().parent.parent / "gates/shapes/correct.py")
    sc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sc)
    lv = _load("violating")
    result = check("layouts", lv.attention_fused_qkv_when_shared, sc.attention_reference, sc.make_attention_inputs)
    assert result.verdict == "fail" and "one tensor passed as arguments 0, 1, 2" in result.message, result.message
    passed = check("layouts", sc.attention_online, sc.attention_reference, sc.make_attention_inputs)
    assert passed.verdict == "pass", passed.message


def test_a_broadcast_input_shows_an_output_allocated_with_the_inputs_strides():
    lv = _load("violating")
    result = check("layouts", lv.softmax_out_like_input, lambda x: torch.softmax(x, -1),
                   lambda seed, shape=None, dtype=torch.float32: (torch.randn(4, 8, generator=torch.Generator()
                                                                             .manual_seed(seed)),))
    assert result.verdict == "fail" and "broadcast along dimension 0" in result.message, result.message


def test_an_input_written_in_one_layout_only_fails_tolerance_free():
    lc, lv = _load("correct"), _load("violating")
    result = check("layouts", lv.relu_in_place_when_strided, lc.relu_reference, lc.make_row_batch)
    assert result.verdict == "fail" and result.tolerance_free and "was changed by the call" in result.message, \
        result.message
    assert check("layouts", lc.relu_fresh, lc.relu_reference, lc.make_row_batch).verdict == "pass"
