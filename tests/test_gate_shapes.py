"""shapes gate: the catalogue's controls, generated edge shapes, skips, and the shrunk counterexample."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from kgate import gates as registry
from kgate.gates.shapes import MANY, edge_shapes, largest_prime_at_most, many_shape
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
    assert len(shapes) == len({s for s, _ in shapes}) <= 24
    assert all(s[0] * s[1] <= 65536 for s, why in shapes if "past 65535" not in why)
    assert all(s[0] * s[1] <= 16 * 65537 for s, why in shapes if "past 65535" in why)
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
    assert all(k.startswith("empty (size 0 in dim ") for k in kinds[first_empty:])
    assert [s for s, why in shapes if why.startswith("empty")] == [(0, 1000), (0, 50), (7, 0), (3, 0)]


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


# -- runs of -inf / +inf across block boundaries (shapes of 4097) -----------------------------------------

def test_a_masked_prefix_across_block_boundaries_is_seen_on_the_long_shape():
    """A log-cumsum-exp scanned in blocks of 1024 whose carries are joined by max(a, b) + log1p(exp(-|a - b|)):
    exact on the declared rows of one block (special_values passes there) and on random rows of 4097; a NaN
    in the first or last element is still NaN; -inf filling the first 2049 elements gives NaN where
    torch.logcumsumexp gives -inf."""
    bad = check("shapes", violating.logcumsumexp_blocked_max_join, correct.logcumsumexp_reference,
                correct.make_inputs, shapes=DECLARED)
    assert bad.verdict == "fail" and bad.tolerance_free and bad.broken, bad.message
    assert bad.details["kind"] == "class" and bad.details["value"] == "-inf" and bad.case["shape"] == [1, 4097]
    assert "with -inf filling the first 2049 of 4097 along dim 1 of argument 0" in bad.message
    assert "give -inf, the kernel nan" in bad.message, bad.message
    assert check("special_values", violating.logcumsumexp_blocked_max_join, correct.logcumsumexp_reference,
                 correct.make_inputs, shapes=DECLARED).verdict == "pass"
    good = check("shapes", correct.logcumsumexp_blocked, correct.logcumsumexp_reference, correct.make_inputs,
                 shapes=DECLARED)
    assert good.verdict == "pass", good.message


def _online_softmax(x, guard=False, block=1024):
    """Softmax in one pass over blocks of 1024 (running maximum m, running sum l rescaled by exp(m_old - m_new)).
    Unguarded, a block whose every logit is -inf (a masked prefix) makes exp(-inf - -inf) = NaN."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for j in range(0, x.shape[-1], block):
        part = x[..., j:j + block]
        new = torch.maximum(m, part.amax(-1))
        safe = torch.where(torch.isneginf(new), torch.zeros_like(new), new) if guard else new
        total = total * torch.exp(m - safe) + torch.exp(part - safe.unsqueeze(-1)).sum(-1)
        m = new
    return torch.exp(x - m.unsqueeze(-1)) / total.unsqueeze(-1)


def test_an_online_softmax_whose_fully_masked_block_gives_nan_fails_on_the_long_shape():
    bad = run(_online_softmax)
    assert bad.verdict == "fail" and bad.details["kind"] == "class", bad.message
    assert "-inf filling" in bad.message and "give finite, the kernel nan" in bad.message, bad.message
    good = run(lambda x: _online_softmax(x, guard=True))
    assert good.verdict == "pass", good.message


def test_a_run_mishandled_at_the_declared_shapes_too_is_left_to_special_values(monkeypatch):
    """Blocks of 64: the declared rows of 256 and 1024 span several blocks, so the -inf prefix gives NaN there too:
    the special_values gate's finding (a row of -inf), not one of shapes that only long rows show."""
    monkeypatch.setattr(violating, "SCAN_BLOCK", 64)
    args = (violating.logcumsumexp_blocked_max_join, correct.logcumsumexp_reference, correct.make_inputs)
    assert check("special_values", *args, shapes=DECLARED).verdict == "fail"
    result = check("shapes", *args, shapes=DECLARED)
    assert result.verdict == "pass", result.message


def _scan_with_bias(x, bias):
    return violating.logcumsumexp_blocked_max_join(x + bias)


def _finite_bias_reference(x, bias):
    if not torch.isfinite(bias).all():
        raise ValueError("bias must be finite")
    return torch.logcumsumexp(x + bias, dim=-1)


def _rows_and_bias(seed, shape=(4, 64), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype), (torch.randn(shape[-1], generator=g) / 10).to(dtype)


def test_runs_are_retried_one_input_at_a_time_where_the_reference_rejects_them_all():
    result = check("shapes", _scan_with_bias, _finite_bias_reference, _rows_and_bias, shapes=[[4, 64]])
    assert result.verdict == "fail" and result.details["arguments"] == [0], result.message
    assert "along dim 1 of argument 0 (a masked prefix)" in result.message


def test_class_changed_judges_only_where_the_oracle_and_the_reference_agree():
    from kgate.gates.shapes import class_changed

    inf, nan = float("inf"), float("nan")
    oracle = torch.tensor([1e39, -inf, 2.0, inf], dtype=torch.float64)
    reference = torch.tensor([inf, -inf, 2.0, nan])  # float32: 1e39 overflows; the last is another order's NaN
    assert class_changed(torch.tensor([5.0, -inf, 3.0, 1.0]), reference, oracle) is None
    path, index, got, expected, count = class_changed(torch.tensor([5.0, nan, 3.0, 1.0]), reference, oracle)
    assert (path, index, expected, count) == ("out", (1,), "-inf", 1) and got != got  # NaN
    assert class_changed(torch.tensor([5.0, inf, 3.0, 1.0]), reference, oracle, mode="nonfinite") is None
    assert class_changed(torch.tensor([5.0, 1.0, 3.0, 1.0]), reference, oracle, mode="nonfinite")[3] == "non-finite"
    assert class_changed(torch.tensor([5.0, -inf, nan, 1.0]), reference, oracle)[3] == "finite"
    assert class_changed(torch.tensor([5.0, -inf, nan, 1.0]), reference, oracle, mode="spread") is None


# -- past 8192 (shapes of 16384) --------------------------------------------------------------------------

def test_edge_shapes_past_8192_keep_the_other_dimensions_within_the_cap():
    from kgate.gates.shapes import MAX_GENERATED, MAX_PAST_8192

    shapes = edge_shapes([(4, 256), (16, 1024)], cap=65536)
    past = [s for s, why in shapes if why.startswith("dim ") and "past 8192 (16384)" in why]
    assert past == [(16384, 1), (1, 16384), (4, 16384)]  # (16, 16384) is past the cap: its other dimension 1
    kinds = [why for _, why in shapes]
    first_past = kinds.index("dim 0 past 8192 (16384)")
    assert all(" past " in k or k.startswith("empty") for k in kinds[first_past:])  # after the others
    # the long dimension alone fits a cap below it; at most MAX_PAST_8192 of them, MAX_GENERATED in all
    assert ((1, 16384), "dim 1 past 8192 (16384)") in edge_shapes([(4, 64)], cap=8192)
    many = edge_shapes([(2, 8, 6, 6), (3, 5, 7, 9, 11)], cap=1 << 13)
    assert sum("past 8192" in why for _, why in many) == MAX_PAST_8192 and len(many) <= MAX_GENERATED


def test_a_sampled_absmax_past_8192_fails_on_the_16384_shape():
    """Int8 fake quantisation per row whose absmax comes from x[..., ::4] on rows longer than 8192: right on
    every shape up to 8192 (the declared ones, 4097), clipped on rows of 16384."""
    assert check("oracle", violating.fake_quant_sampled_absmax, correct.fake_quant_reference, correct.make_inputs,
                 shapes=DECLARED).verdict == "pass"
    bad = check("shapes", violating.fake_quant_sampled_absmax, correct.fake_quant_reference, correct.make_inputs,
                shapes=DECLARED)
    assert bad.verdict == "fail" and "past 8192" in bad.details["why"], bad.message
    assert 16384 in bad.details["found_at"] and bad.case["shape"][-1] > 8192, bad.message
    good = check("shapes", correct.fake_quant_rows, correct.fake_quant_reference, correct.make_inputs,
                 shapes=DECLARED)
    assert good.verdict == "pass", good.message


def test_a_split_k_that_drops_a_full_last_slab_fails_at_16384():
    """a @ b over slabs of 8192 whose tail epilogue runs only when K % 8192 != 0: right at K = 4097, 8193 or
    12288, it loses half the sum at K = 16384."""
    declared = [[8, 512, 8], [16, 1024, 16]]
    bad = check("shapes", violating.matmul_split_k_drops_full_tail, correct.matmul_reference,
                correct.make_matmul_inputs, shapes=declared)
    assert bad.verdict == "fail" and bad.broken and bad.case["shape"][1] == 16384, bad.message
    assert "dim 1 past 8192 (16384)" in bad.message
    good = check("shapes", correct.matmul_split_k, correct.matmul_reference, correct.make_matmul_inputs,
                 shapes=declared)
    assert good.verdict == "pass", good.message


def _doubled(x):
    return x * 2


def _doubled_off_past_8192(ulps):
    """x * 2 (exact: the reference's error is 0), every result `ulps` ulps larger in magnitude on rows longer
    than 8192 (float32 bits + ulps)."""
    def kernel(x):
        out = x * 2
        return (out.view(torch.int32) + ulps).view(torch.float32) if x.shape[-1] > 8192 else out
    return kernel


def test_past_8192_an_oracle_miss_counts_only_when_broken():
    """30 ulps off misses the plain bound (4 ulps) by 7.5 times, a long float32 sum's order can do as much: not a
    finding past 8192; 4000 ulps off is broken."""
    marginal = check("shapes", _doubled_off_past_8192(30), _doubled, correct.make_inputs, shapes=DECLARED)
    assert marginal.verdict == "pass", marginal.message
    gross = check("shapes", _doubled_off_past_8192(4000), _doubled, correct.make_inputs, shapes=DECLARED)
    assert gross.verdict == "fail" and gross.broken and "past 8192" in gross.details["why"], gross.message
    assert gross.case["shape"][-1] > 8192, gross.message  # shrunk within the long path


def test_outputs_too_large_past_8192_are_skipped_before_the_oracle_runs(monkeypatch):
    """Sizes that must be powers of two: 4097 is rejected, so nothing predicts 16384, whose outputs (16 features
    per input element, the cap lowered to 2^16 elements: the test stays cheap) are counted after the reference
    and before the float64 oracle, which never runs on them (a Gram matrix at 16384^2, with the real cap)."""
    import kgate.gates.shapes as shapes

    monkeypatch.setattr(shapes, "MIN_OUTPUT_CAP", 1 << 16)
    seen = []

    def features(x):
        seen.append((x.shape[0], x.dtype))
        return x.unsqueeze(-1) * torch.linspace(-1, 1, 16, dtype=x.dtype)

    def make_points(seed, shape=(8,), dtype=torch.float32):
        if shape[0] & (shape[0] - 1):
            raise ValueError("the number of points must be a power of two")
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype),)

    result = check("shapes", features, features, make_points, shapes=[[8]])
    assert result.verdict == "pass", result.message
    assert result.details["outputs_too_large"] == ["(16384,)"], result.message
    assert "reference outputs are too large" in result.message and "(4097,) (inputs factory raised" in result.message
    assert (16384, torch.float32) in seen and (16384, torch.float64) not in seen


def test_a_shape_at_least_as_large_as_one_too_large_is_not_built():
    """Rows of 2000 per element of a free size parameter: at 4097 the inputs are past the cap (built, then
    skipped); at 16384 they are not even built."""
    asked = []

    def make_rows(seed, shape=(10,), dtype=torch.float32):
        asked.append(shape[0])
        return (torch.randn(shape[0], 2000, generator=torch.Generator().manual_seed(seed)).to(dtype),)

    result = check("shapes", lambda x: x * 2, lambda x: x * 2, make_rows, shapes=[[10]])
    assert result.verdict == "pass", result.message
    assert {"(4097,)", "(16384,)"} <= set(result.details["too_large"])
    assert 4097 in asked and 16384 not in asked


def _ranks(x):
    return x.argsort(-1).argsort(-1)


def _ranks_pairwise(x):
    """Each element's rank as the count of smaller elements: an n x n comparison."""
    return (x.unsqueeze(-1) > x.unsqueeze(-2)).sum(-1)


def test_a_shape_past_8192_whose_4097_shape_made_a_quadratic_tensor_is_not_built(monkeypatch):
    """Ranks by pairwise comparison hold 4097^2 booleans at 4097, 2049^2 at 2049: grown alike to 16384 (268
    million comparisons) they pass the cap, so 16384 is skipped before its inputs are built. A kernel that makes
    two values per element (the cap lowered to 2^16: 16 x its 8194 would pass it) grows linearly from 2049, to
    4 x 8194 at 16384, and runs it; ranks by sorting run it."""
    import kgate.gates.shapes as shapes

    monkeypatch.setattr(shapes, "MIN_OUTPUT_CAP", 1 << 16)
    asked = []

    def make_row(seed, shape=(64,), dtype=torch.float32):
        asked.append(shape[0])
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype),)

    costly = check("shapes", _ranks_pairwise, _ranks, make_row, shapes=[[64]])
    assert costly.verdict == "pass" and len(costly.details["too_costly"]) == 3, costly.message
    assert costly.details["too_costly"][0].startswith("(16384,) (~2.68e+08 elements)"), costly.message
    assert costly.details["too_costly"][1].startswith("(65537,) (~4.29e+09 elements)"), costly.message
    assert costly.details["too_costly"][2].startswith("(1048583,)"), costly.message  # past 2^20 input elements
    assert "past 8192 or 65535 whose largest tensor" in costly.message and 16384 not in asked and 65537 not in asked
    for kernel, reference in ((lambda x: torch.stack([x, x], -1).sum(-1), lambda x: x * 2), (_ranks, _ranks)):
        asked.clear()
        cheap = check("shapes", kernel, reference, make_row, shapes=[[64]])
        assert cheap.verdict == "pass" and 16384 in asked, cheap.message
        assert all(s.startswith(("(65537,)", "(1048583,)")) for s in cheap.details["too_costly"]), \
            cheap.message  # 2^4 x 8194 and 2^7 x 8194 elements


# -- untied sizes, past 65535, empty dimensions past the first, the same elements split otherwise ------------

ATTENTION = dict(shapes=[[2, 2]])


def test_untied_sizes_catch_keys_left_out_where_the_queries_are_fewer():
    ok = check("shapes", correct.attention_online, correct.attention_reference, correct.make_attention_inputs,
               **ATTENTION)
    assert ok.verdict == "pass" and "untied-size probe(s) the reference accepts" in ok.message, ok.message
    assert check("oracle", violating.attention_key_blocks_from_queries, correct.attention_reference,
                 correct.make_attention_inputs, **ATTENTION).verdict == "pass"  # as many keys as queries
    bad = check("shapes", violating.attention_key_blocks_from_queries, correct.attention_reference,
                correct.make_attention_inputs, **ATTENTION)
    assert bad.verdict == "fail" and bad.details["kind"] == "oracle", bad.message
    assert bad.details["untied"] == "size 48 halved to 24 in argument 0 dim 2 only (the other arguments' 48 kept)"


def test_untied_sizes_catch_an_output_as_wide_as_the_queries():
    def out_like_queries(q, k, v):
        out = torch.empty_like(q)  # a buffer shaped like the queries, written as wide as the values
        out[..., :v.shape[-1]] = correct.attention_online(q, k, v)
        return out

    bad = check("shapes", out_like_queries, correct.attention_reference, correct.make_attention_inputs, **ATTENTION)
    assert bad.verdict == "fail" and bad.details["kind"] == "contract", bad.message
    assert "size 16 halved to 8 in argument 2 dim 3 only" in bad.details["untied"]


def test_a_kernel_that_raises_on_untied_sizes_is_passed_over():
    def self_attention_only(q, k, v):
        if not q.shape == k.shape == v.shape:
            raise ValueError("q, k and v must have one shape")
        return correct.attention_online(q, k, v)

    result = check("shapes", self_attention_only, correct.attention_reference, correct.make_attention_inputs,
                   **ATTENTION)
    assert result.verdict == "pass" and "of which the kernel raises on (passed over)" in result.message, result.message


def test_untied_probes_halve_a_shared_size_in_one_argument_then_in_all_but_one():
    from kgate.gates.shapes import untied_probes

    a, b, c = torch.randn(4, 6), torch.randn(6, 6), torch.randn(6)
    probes = list(untied_probes((a, b, c, 3)))
    shapes = [tuple(tuple(t.shape) for t in probe[:3]) for _, probe in probes]
    assert shapes[:3] == [((4, 3), (6, 6), (6,)), ((4, 6), (3, 3), (6,)), ((4, 6), (6, 6), (3,))]
    assert ((4, 6), (3, 3), (3,)) in shapes and all(probe[3] == 3 for _, probe in probes)
    assert torch.equal(probes[0][1][0], a[:, :3]) and probes[0][1][0].is_contiguous()  # the first half, copied
    assert list(untied_probes((torch.randn(4, 6),))) == []  # one tensor: nothing ties


def test_rows_past_65535_catch_a_grid_clamped_to_65535_rows():
    ok = check("shapes", correct.row_norm, correct.row_norm_reference, correct.make_rows, shapes=[[256, 8]])
    assert ok.verdict == "pass", ok.message
    bad = check("shapes", violating.row_norm_grid_rows, correct.row_norm_reference, correct.make_rows,
                shapes=[[256, 8]])
    assert bad.verdict == "fail" and bad.details["why"] == "dim 0 past 65535 (65537)", bad.message
    assert bad.case["shape"][0] == 65536  # shrunk to one row past the grid


def test_an_empty_reduction_giving_0_for_log_0_fails_and_one_that_raises_is_passed_over():
    ok = check("shapes", correct.logsumexp_rows, correct.logsumexp_reference, correct.make_rows, shapes=[[256, 8]])
    assert ok.verdict == "pass", ok.message
    bad = check("shapes", violating.logsumexp_rows_empty_zero, correct.logsumexp_reference, correct.make_rows,
                shapes=[[256, 8]])
    assert bad.verdict == "fail" and bad.details["empty_only"] is True and bad.details["kind"] == "inf", bad.message
    assert "give -inf, the kernel 0.0" in bad.message and bad.case["shape"][1] == 0

    def amax_shift(x):
        return (x - x.amax(dim=-1, keepdim=True)).exp().sum(dim=-1).log() + x.amax(dim=-1)  # raises on no column

    raising = check("shapes", amax_shift, correct.logsumexp_reference, correct.make_rows, shapes=[[256, 8]])
    assert raising.verdict == "pass" and "(passed over): (256, 0)" in raising.message, raising.message


def test_a_plan_cached_by_element_count_fails_right_after_the_declared_shape():
    ok = check("shapes", correct.row_sums_planned, correct.row_sum_reference, correct.make_rows, shapes=[[8, 64]])
    assert ok.verdict == "pass", ok.message
    bad = check("shapes", violating.row_sums_planned_by_count, correct.row_sum_reference, correct.make_rows,
                shapes=[[8, 64]])
    assert bad.verdict == "fail" and bad.case["shape"] == [16, 32], bad.message  # not shrunk: a call sequence
    assert "right after a call at the declared (8, 64)" in bad.message


def test_inf_lost_finds_a_finite_value_only_where_oracle_and_reference_agree_on_an_infinity():
    from kgate.shrink import inf_lost

    inf = float("inf")
    truth = torch.tensor([-inf, -inf, inf, 1.0], dtype=torch.float64)
    ref = torch.tensor([-inf, 3.0, inf, 1.0])
    assert inf_lost(torch.tensor([-inf, 0.0, inf, 2.0]), ref, truth) is None  # 0.0 where the reference is finite
    assert inf_lost(torch.tensor([float("nan"), 0.0, -inf, 2.0]), ref, truth) is None  # not finite: special_values'
    assert inf_lost(torch.tensor([-88.5, 0.0, 3.0e38, 2.0]), ref, truth) == ("out", (0,), -88.5, 2, -inf)


def test_an_untied_probe_where_the_reference_and_its_float64_evaluation_disagree_is_passed_over():
    """torch's CPU scaled_dot_product_attention takes values of another length than the keys, and its float32 and
    float64 paths then differ by the outputs' own size: no oracle there, so the probe is passed over."""
    def unchecked(q, k, v):  # float64 reads the values' first rows, float32 their last, where the lengths differ
        w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        n = k.shape[-2]
        return w @ (v[..., :n, :] if q.dtype == torch.float64 else v[..., v.shape[-2] - n:, :])

    result = check("shapes", unchecked, unchecked, correct.make_attention_inputs, **ATTENTION)
    assert result.verdict == "pass", result.message
    assert "passed over where the reference and its float64 evaluation disagree" in result.message


def test_the_shape_past_2_20_input_elements_is_prime_in_every_size_and_within_2_21():
    shape = many_shape((256, 8), 1.0)
    assert shape == (149803, 7)  # 7 = the largest prime <= 8; 149803 the smallest prime past 2^20 / 7
    assert all(largest_prime_at_most(s) == s for s in shape) and MANY < 149803 * 7 <= 2 * MANY
    assert many_shape((4, 16, 16), 8.0) == (787, 13, 13)  # 8 input elements per unit of the shape (channels)
    assert many_shape((), 1.0) is None
    assert many_shape((2, 1 << 22), 1.0) is None  # no size of dimension 0 keeps it within 2^21


def test_a_chunked_path_from_2_20_elements_that_never_writes_its_tail_fails_and_one_that_does_passes():
    violating, correct = _load("violating"), _load("correct")
    result = check("shapes", violating.leaky_relu_chunked_drops_tail, correct.leaky_relu_reference,
                   correct.make_rows, shapes=[(256, 8)])
    assert result.verdict == "fail" and "past 1048576 input elements" in result.message, result.message
    result = check("shapes", correct.leaky_relu_chunked, correct.leaky_relu_reference, correct.make_rows,
                   shapes=[(256, 8)])
    assert result.verdict == "pass", result.message


def test_an_output_handed_out_again_at_a_long_shape_fails_and_a_fresh_one_passes():
    violating, correct = _load("violating"), _load("correct")
    result = check("shapes", violating.row_sums_workspace, correct.row_sums_reference, correct.make_rows,
                   shapes=[(256, 8)])
    assert result.verdict == "fail" and result.details["kind"] == "reused", result.message
    assert "changed when the kernel was called again on other inputs of this shape" in result.message
    result = check("shapes", correct.row_sums_blocked, correct.row_sums_reference, correct.make_rows,
                   shapes=[(256, 8)])
    assert result.verdict == "pass", result.message


def test_a_reference_that_reads_past_its_inputs_is_told_apart_from_one_that_does_not():
    """torch's CPU scaled_dot_product_attention takes values longer than the keys and reads memory it was not
    given; an untied probe there is passed over (`_reads_outside`: inputs placed amid NaN)."""
    from kgate.gates.shapes import _reads_outside

    def shifted(x):  # reads one element past the end of x
        return torch.as_strided(x, (x.numel(),), (1,), x.storage_offset() + 1).clone()

    x = (torch.randn(17)[:16],)  # (a view with one more element behind it in its storage)
    for reference, outside in ((shifted, True), (lambda t: t * 2, False)):
        subject = subject_for(reference, reference, lambda seed, shape=None, dtype=torch.float32: x)
        assert _reads_outside(subject, x, subject.run_reference(x)) is outside
