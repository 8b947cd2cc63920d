"""shapes gate: the catalogue's controls, generated edge shapes, skips, and the shrunk counterexample."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from kgate import gates as registry
from kgate.gates.shapes import edge_shapes, largest_prime_at_most
from tests.gate_harness import check, subject_for

CATALOGUE = Path(__file__).resolve().parent.parent / "gates" / "shapes"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"catalogue_shapes_{name}", CATALOGUE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


correct, violating = _load("correct"), _load("violating")
DECLARED = [[4, 256], [16, 1024]]


def run(kernel, **kw):
    kw.setdefault("shapes", DECLARED)
    return check("shapes", kernel, correct.reference, correct.make_inputs, **kw)


def test_correct_control_passes_declared_and_generated_shapes():
    result = run(correct.softmax_rows, dtypes=["float32", "bfloat16"])
    assert result.verdict == "pass", result.message
    assert "2 declared" in result.message and result.evidence
    generated = [tuple(s) for s in result.details["generated"]]
    assert (1, 1) in generated and (0, 256) in generated and any(4097 in s for s in generated)


def test_tail_dropping_kernel_fails_at_the_smallest_shape():
    assert check("oracle", violating.softmax_block128, correct.reference, correct.make_inputs,
                 shapes=DECLARED).verdict == "pass"  # right on the declared multiples of 128
    result = run(violating.softmax_block128)
    assert result.verdict == "fail" and not result.tolerance_free
    assert result.case["shape"] == [1, 1] and "--shape 1,1" in result.repro
    assert result.message.startswith("shape (1, 1) (every size 1): max abs error")


def test_squeeze_kernel_fails_on_a_size_one_dimension():
    result = run(violating.softmax_squeeze_rows)
    assert result.verdict == "fail"
    assert 1 in result.case["shape"], result.message


def test_single_block_kernel_is_shrunk_to_one_past_the_block():
    def one_block(x):
        out = correct.softmax_rows(x[..., :1024])
        return torch.cat([out, torch.zeros_like(x[..., 1024:])], dim=-1)

    result = run(one_block, shapes=[[2, 512]])
    assert result.verdict == "fail"
    assert result.case["shape"] == [1, 1025], result.message
    assert "larger than one block" in result.details["why"] and result.message.startswith("shape (1, 1025) (shrunk from (1, 4097), dim 1 larger")


def test_kernel_raising_on_an_odd_size_fails_as_a_crash():
    def even_only(x):
        if x.shape[-1] % 2:
            raise ValueError("n must be even")
        return correct.softmax_rows(x)

    result = run(even_only)
    assert result.verdict == "fail" and result.tolerance_free and result.broken
    assert "kernel raised ValueError: n must be even" in result.message
    assert result.case["shape"][-1] % 2 == 1


def test_shapes_the_reference_rejects_are_skipped_not_failed():
    def even_reference(x):
        if x.shape[-1] % 2:
            raise ValueError("odd widths are outside the contract")
        return torch.softmax(x, -1)

    result = check("shapes", correct.softmax_rows, even_reference, correct.make_inputs, shapes=DECLARED)
    assert result.verdict == "pass", result.message
    assert "the reference or factory rejects" in result.message and result.details["rejected"]


def test_factory_without_shape_is_skipped_with_the_reason():
    result = check("shapes", correct.softmax_rows, correct.reference, lambda seed: correct.make_inputs(seed))
    assert result.verdict == "skip" and "takes no `shape`" in result.message


def test_declared_inputs_of_fixed_shapes_are_skipped_naming_the_key():
    from kgate.manifest import ArgSpec

    result = check("shapes", correct.softmax_rows, correct.reference, [ArgSpec(shape=[4, 8])])
    assert result.verdict == "skip" and "fixed `shape:`" in result.message, result.message
    swept = check("shapes", correct.softmax_rows, correct.reference, [ArgSpec()], shapes=[[4, 8]])
    assert swept.verdict == "pass", swept.message  # an input without its own shape follows the sweep


def test_default_shape_is_derived_when_the_factory_takes_shape_but_none_is_declared():
    result = check("shapes", violating.softmax_block128, correct.reference, correct.make_inputs)
    assert result.verdict == "fail" and result.details["found_at"] != [16, 1024]


def test_edge_shapes_are_capped_deduplicated_and_derived():
    shapes = edge_shapes([(7, 1000)], cap=65536)
    assert len(shapes) == len({s for s, _ in shapes}) <= 20
    assert all(s[0] * s[1] <= 65536 for s, _ in shapes)
    kinds = {why for _, why in shapes}
    assert "every size 1" in kinds and "every size prime" in kinds and "empty (size 0 in dim 0)" in kinds
    assert ((7, 997), "every size prime") in shapes and largest_prime_at_most(1000) == 997


@pytest.mark.parametrize("gate", registry.GATE_NAMES)
def test_correct_control_passes_every_gate(gate):
    subject = subject_for(correct.softmax_rows, correct.reference, correct.make_inputs, shapes=DECLARED)
    result = registry.get(gate).check(subject)
    assert result.verdict in ("pass", "skip"), f"{gate}: {result.message}"


def test_slow_kernel_gets_a_shorter_sweep_not_a_timeout():
    def slow(x):
        time.sleep(0.05)
        return correct.softmax_rows(x)

    result = run(slow, limits={"timeout": 0.4})
    assert result.verdict == "pass" and "stopped after" in result.message
    assert "half the gate's 0.4 s time limit" in result.message


def _refuses_empty(x):
    if x.numel() == 0:
        raise RuntimeError("CUDA error: invalid argument (a grid of 0 blocks)")
    return correct.softmax_rows(x)


def test_a_kernel_failing_only_on_empty_inputs_fails_marked_empty_only():
    result = run(_refuses_empty)
    assert result.verdict == "fail", result.message
    assert result.details["empty_only"] is True and 0 in result.details["smallest"]
    assert "fails only on empty inputs" in result.message


def test_a_failure_on_real_data_is_not_shrunk_to_an_empty_shape():
    def tail_dropping_and_refuses_empty(x):
        out = _refuses_empty(x)
        if x.shape[-1] % 2:
            out = out.clone()
            out[..., -1] = 0.0
        return out

    result = run(tail_dropping_and_refuses_empty)
    assert result.verdict == "fail", result.message
    assert result.details["empty_only"] is False and 0 not in result.details["smallest"]
    assert "only on empty" not in result.message


def test_empty_shapes_come_last_in_the_sweep():
    shapes = edge_shapes([(7, 1000), (3, 50)], cap=65536)
    kinds = [why for _, why in shapes]
    first_empty = kinds.index("empty (size 0 in dim 0)")
    assert all(k == "empty (size 0 in dim 0)" for k in kinds[first_empty:])
    assert {s for s, why in shapes if why.startswith("empty")} == {(0, 1000), (0, 50)}


def test_a_generated_shape_whose_inputs_are_too_large_is_skipped_before_anything_runs_on_them():
    """A shape of free size parameters (KernelBench's batch size: (10,)) has few elements itself, so the
    sweep's cap on a shape's elements lets 4097 through, while its inputs hold 4097 rows: too large, and
    skipped, but only after the reference and the float64 oracle had run on them (MobileNetV2 at batch 4097
    took 22 GB on a CPU). Now the inputs are sized before anything runs on them."""
    seen = []

    def make_rows(seed, shape=(10,), dtype=torch.float32, device="cpu"):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(shape[0], 2000, generator=gen, dtype=dtype).to(device),)

    def reference(x):
        seen.append(x.shape[0])
        return x * 2

    result = check("shapes", lambda x: x * 2, reference, make_rows, shapes=[[10]])
    assert result.verdict == "pass", result.message
    assert "4097" in " ".join(result.details["too_large"]) and "too large for the sweep" in result.message
    assert 4097 not in seen and 10 in seen  # the reference (and the oracle, a copy of it) never ran on them


def _running_max(x):
    return torch.cummax(x, dim=-1).values


def _running_max_in_blocks(x, block=2048):
    """A running maximum in blocks of 2048, each block's scan started from the carry of the one before;
    the carry is taken with torch.maximum, but a NaN carry is dropped by a fmax-style merge."""
    out, carry = [], None
    for j in range(0, x.shape[-1], block):
        part = torch.cummax(x[..., j:j + block], dim=-1).values
        if carry is not None:
            part = torch.fmax(part, carry.unsqueeze(-1))
        out.append(part)
        carry = part[..., -1]
    return torch.cat(out, dim=-1)


def _running_max_rows(seed, shape=(4, 64), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g).to(dtype),)


def test_a_nan_that_stops_at_a_block_boundary_is_seen_on_the_long_shape():
    """A blocked running maximum whose carry drops a NaN: right on every row of one block, so special_values at
    the declared shapes passes; on the generated row of 4097 a NaN in the first element reaches the second
    block only in the reference."""
    bad = check("shapes", _running_max_in_blocks, _running_max, _running_max_rows, shapes=[[4, 64]])
    assert bad.verdict == "fail" and bad.tolerance_free, bad.message
    assert "4097" in bad.message and "give NaN" in bad.message, bad.message
    assert check("special_values", _running_max_in_blocks, _running_max, _running_max_rows,
                 shapes=[[4, 64]]).verdict == "pass"
    assert check("shapes", _running_max, _running_max, _running_max_rows, shapes=[[4, 64]]).verdict == "pass"


def _shuffle(x):
    return torch.nn.functional.pixel_shuffle(x, 2)


def _shuffle_fast_1x1(x):
    """pixel_shuffle through a view where the image is 1 x 1 (the reference returns fresh memory)."""
    if x.shape[-2:] == (1, 1):
        return x.view(x.shape[0], x.shape[1] // 4, 2, 2)
    return torch.nn.functional.pixel_shuffle(x, 2)


def _images(seed, shape=(2, 8, 6, 6), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g).to(dtype),)


def test_a_fast_path_for_a_1x1_image_is_met_by_two_dims_of_size_1_at_once():
    """Channels must stay a multiple of 4, so 'every size 1' is rejected by the reference; a 1 x 1 image needs
    two dimensions at 1 with the others kept, where the view aliases the input."""
    from kgate.gates.shapes import edge_shapes

    assert ((2, 8, 1, 1), "size 1 in dims 2 and 3") in edge_shapes([(2, 8, 6, 6)], 1 << 13)
    bad = check("shapes", _shuffle_fast_1x1, _shuffle, _images, shapes=[[2, 8, 6, 6]])
    assert bad.verdict == "fail" and "alias" in bad.message, bad.message
    assert check("shapes", _shuffle, _shuffle, _images, shapes=[[2, 8, 6, 6]]).verdict == "pass"
