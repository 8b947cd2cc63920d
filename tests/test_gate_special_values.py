"""special_values gate: special values injected at the start, middle and end of the data, one at a time."""

from __future__ import annotations

import pytest
import torch

from kgate import gates as registry
from kgate.gates.special_values import RANDOM_POSITIONS, positions
from tests.gate_harness import catalogue, check, normal_inputs, subject_for


def rows(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (5, 33), generator=gen, dtype=torch.float64) * 3).to(dtype),)


# Seed 2 on (5, 33): the one seeded position the gate used to inject at is [0, 3], in the first half of row
# 0 and away from its first element, so every kernel below passed the gate.
SHAPE, SEED = [5, 33], 2


def _row_sum(x):
    return x.sum(-1)


def nansum_on_the_tail(x):
    """A row sum whose second half is reduced with nansum (a 'safe' tail loop): a NaN there is dropped."""
    half = x.shape[-1] // 2
    return x[..., :half].sum(-1) + torch.nansum(x[..., half:], -1)


def nansum_on_the_first_block(x):
    """The first element of each row taken through nan_to_num (a peeled first iteration)."""
    return torch.nan_to_num(x[..., :1], nan=0.0).sum(-1) + x[..., 1:].sum(-1)


def nansum_in_the_middle(x):
    """The middle third of each row (a middle tile) reduced with nansum."""
    a, b = x.shape[-1] // 3, 2 * x.shape[-1] // 3
    return x[..., :a].sum(-1) + torch.nansum(x[..., a:b], -1) + x[..., b:].sum(-1)


def clamps_the_first_block(x):
    """+-Inf clamped to a large finite number in each row's first element only."""
    return x[..., :1].clamp(-1e30, 1e30).sum(-1) + x[..., 1:].sum(-1)


def nansum_on_the_flat_tail(x):
    """A full reduction whose last quarter (the last blocks of a grid-stride loop) drops NaN."""
    flat = x.reshape(-1)
    q = 3 * flat.numel() // 4
    return flat[:q].sum() + torch.nansum(flat[q:])


def nansum_on_the_last_rows(x):
    """A column sum (reduction over dim 0) whose second half of rows is reduced with nansum."""
    half = x.shape[0] // 2
    return x[:half].sum(0) + torch.nansum(x[half:], 0)


@pytest.mark.parametrize(("kernel", "reference", "position", "value"), [
    (nansum_on_the_tail, _row_sum, "[4, 32] (last element)", "NaN"),
    (nansum_on_the_first_block, _row_sum, "[0, 0] (first element)", "NaN"),
    (nansum_in_the_middle, _row_sum, "[2, 16] (centre)", "NaN"),
    (clamps_the_first_block, _row_sum, "[0, 0] (first element)", "+Inf"),
    (nansum_on_the_flat_tail, lambda x: x.sum(), "[4, 32] (last element)", "NaN"),
    (nansum_on_the_last_rows, lambda x: x.sum(0), "[4, 32] (last element)", "NaN"),
])
def test_special_values_mishandled_on_one_part_of_a_reduction_fail(kernel, reference, position, value):
    result = check("special_values", kernel, reference, rows, shapes=[SHAPE], seeds=[SEED])
    assert result.verdict == "fail", result.message
    assert result.expected == value and result.got.startswith("finite")
    assert f"after {value} injected into argument 0 at {position}" in result.message
    assert result.details["probe"].startswith(f"{value} injected into argument 0 at {position}")


@pytest.mark.parametrize(("kernel", "reference", "make_inputs"), [
    (lambda x: x.sum(-1), lambda x: x.sum(-1), rows),
    (lambda x: x.sum(), lambda x: x.sum(), rows),
    (lambda x: x.sum(0), lambda x: x.sum(0), rows),
    (lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True),
     lambda x: torch.softmax(x, -1), rows),
    (lambda x: torch.cumsum(x, -1), lambda x: torch.cumsum(x, -1), rows),
    (lambda q, k: (q.double() @ k.double()).float(), lambda q, k: q @ k,
     lambda seed, shape=None, dtype=torch.float32: (rows(seed, (4, 8))[0], rows(seed + 1, (8, 6))[0])),
])
@pytest.mark.parametrize("seed", [0, SEED])
def test_correct_kernels_pass_every_position(kernel, reference, make_inputs, seed):
    result = check("special_values", kernel, reference, make_inputs, seeds=[seed])
    assert result.verdict == "pass", result.message
    assert "at the last, first, centre, second and second-to-last elements" in result.message


def test_positions_cover_the_ends_and_middle_of_every_dimension():
    got = positions((5, 33, 8), torch.Generator().manual_seed(0))
    named = dict((name, index) for name, index in got if name != "seeded position")
    assert named == {"last element": (4, 32, 7), "first element": (0, 0, 0), "centre": (2, 16, 4),
                     "second element along every dimension": (1, 1, 1),
                     "second-to-last element along every dimension": (3, 31, 6)}
    seeded = [index for name, index in got if name == "seeded position"]
    assert 1 <= len(seeded) <= RANDOM_POSITIONS and len({i for _, i in got}) == len(got)
    assert got == positions((5, 33, 8), torch.Generator().manual_seed(0))  # seeded: the same every run
    assert positions((1,), torch.Generator().manual_seed(0)) == [("last element", (0,))]
    assert positions((), torch.Generator().manual_seed(0)) == [("last element", ())]


def test_probes_inject_one_special_value_each():
    gate = registry.get("special_values")
    (x,) = rows(0)
    probes = list(gate.probes((x,), 0)) + list(gate.probes((x,), 0, later=True))
    injected = [(label, probe) for label, probe, value, _ in probes if value is not None and "injected" in label]
    assert len(injected) == 3 * len(positions(tuple(x.shape), torch.Generator().manual_seed(0)))
    for label, (probe,) in injected:
        assert int((~torch.isfinite(probe)).sum()) == 1, label
        assert torch.equal(torch.where(torch.isfinite(probe), probe, x), x)
    # whole lines: the last row, the last column and all of x, each value filling exactly that line
    lines = [(label, probe, site) for label, probe, value, site in probes if value is not None and "filling" in label]
    assert [label.split(" (")[0] for label, _, _ in lines] == [
        "NaN filling argument 0 at [:, 32]", "+Inf filling argument 0 at [:, 32]", "-Inf filling argument 0 at [:, 32]",
        "NaN filling argument 0 at [4, :]", "+Inf filling argument 0 at [4, :]", "-Inf filling argument 0 at [4, :]",
        "NaN filling argument 0 at [:, :]"]
    for label, (probe,), (_, index) in lines:
        assert int((~torch.isfinite(probe)).sum()) == x[index].numel(), label
        assert torch.equal(torch.where(torch.isfinite(probe), probe, x), x)
    # the overflow probe and the two subnormal probes, in the first round
    assert [v for _, _, v, _ in gate.probes((x,), 0)] == ["NaN", "+Inf", "-Inf", None, None, None]


def test_a_spent_search_budget_ends_the_later_rounds_only_and_says_so():
    """The first round (the last element of every input, the overflow and subnormal probes) always runs; the
    whole lines and the other positions
    only while the search budget lasts, and the pass message names the probe it stopped before."""
    def spent(kernel):
        subject = subject_for(kernel, _row_sum, rows, shapes=[SHAPE], seeds=[SEED])
        subject.out_of_time = lambda: True
        return registry.get("special_values").check(subject)

    assert spent(nansum_on_the_tail).verdict == "fail"
    cut = spent(nansum_on_the_first_block)
    assert cut.verdict == "pass" and "NaN/Inf pattern matched the oracle in 6 probe(s)" in cut.message
    assert "ran out before the probe NaN filling argument 0 at [:, 32] (the whole line" in cut.message
    assert cut.details["cut"].startswith("NaN filling argument 0 at [:, 32]")


def test_nan_and_inf_reaching_every_row_through_a_matmul_still_match():
    """A special value in one of b's rows reaches every output row of a @ b: positions along the reduced
    dimension (first, centre, last) of both operands, judged one at a time."""
    def mats(seed, shape=None, dtype=torch.float32):
        return rows(seed, (6, 40))[0], rows(seed + 1, (40, 5))[0]

    result = check("special_values", lambda a, b: a @ b, lambda a, b: a @ b, mats)
    assert result.verdict == "pass", result.message
    masked = check("special_values", lambda a, b: torch.nan_to_num(a @ b, nan=0.0), lambda a, b: a @ b, mats)
    assert masked.verdict == "fail" and masked.expected == "NaN" and masked.got.startswith("finite")


# --- whole lines of special values; subnormal results --------------------------------------------------

sv_correct, sv_violating = catalogue("special_values", "correct"), catalogue("special_values", "violating")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_mean_that_gives_zero_for_an_all_nan_row_fails_on_the_whole_row(dtype):
    result = check("special_values", sv_violating.row_mean_empty_rows_zero, sv_correct.reference_row_mean,
                   sv_correct.make_inputs, dtypes=[dtype])
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "the oracle gives NaN, the kernel gives 0.0" in result.message
    assert "NaN filling argument 0 at [5, :] (the whole line along dimension 1" in result.message
    assert result.where == "out[5]" and "--gate special_values" in result.repro


def test_a_column_reduction_meets_its_all_nan_line_along_dimension_0():
    def column_max_ignoring_empty(x):  # a max over dim 0 that writes -inf for a column with no number
        out = torch.where(torch.isnan(x), -torch.inf, x).amax(dim=0)
        return torch.where(torch.isnan(x).any(dim=0) & ~torch.isnan(x).all(dim=0), torch.nan, out)

    result = check("special_values", column_max_ignoring_empty, lambda x: x.amax(dim=0), sv_correct.make_inputs)
    assert result.verdict == "fail" and "at [:, 39] (the whole line along dimension 0" in result.message, \
        result.message


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_correct_row_mean_and_scaling_pass_lines_and_subnormals(dtype):
    for kernel, reference in ((sv_correct.row_mean_blocked, sv_correct.reference_row_mean),
                              (sv_correct.scale, sv_correct.reference_scale)):
        result = check("special_values", kernel, reference, sv_correct.make_inputs, dtypes=[dtype])
        assert result.verdict == "pass", result.message
        assert "subnormal results kept where the reference keeps them" in result.message


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_flushing_subnormal_results_fails_tolerance_free(dtype):
    assert check("oracle", sv_violating.scale_flush_subnormals, sv_correct.reference_scale,
                 sv_correct.make_inputs, dtypes=[dtype]).verdict == "pass"
    result = check("special_values", sv_violating.scale_flush_subnormals, sv_correct.reference_scale,
                   sv_correct.make_inputs, dtypes=[dtype])
    assert result.verdict == "fail" and result.tolerance_free and result.details["subnormal"], result.message
    assert "the kernel flushes it to zero" in result.message and "inputs scaled to subnormal magnitudes" in result.message
    assert float(result.got) == 0.0 and "the subnormal the reference keeps" in result.expected


def test_a_kernel_that_keeps_subnormals_the_reference_flushes_fails():
    def flushing_reference(x):  # a reference built with FTZ: subnormal results are 0
        out = x * 0.75
        return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)

    result = check("special_values", sv_correct.scale, flushing_reference, sv_correct.make_inputs)
    assert result.verdict == "fail" and "the kernel keeps a subnormal" in result.message, result.message


def test_a_kept_subnormal_the_reference_flushes_only_on_its_device_passes_and_a_flush_on_the_cpu_too_fails(
        monkeypatch):
    """torch's CUDA bfloat16 cumsum gives 0 where the oracle, its CPU path and FlagGems' kernel keep the subnormal
    sum of subnormal inputs (a field run on an H100): a 0 the reference gives on its device alone is that device's path, not
    the op's flush. Emulated here, the kernel on the CPU: the reference flushes, its evaluation on the host
    (Subject.reference_on_cpu, asked where the kernel runs on another device) keeps the subnormal. A
    reference that flushes on the host as well keeps the contract: the kernel must flush."""
    from kgate.subject import Subject

    def flushing_reference(x):
        out = x * 0.75
        return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)

    monkeypatch.setattr(Subject, "reference_on_cpu", lambda self, args: sv_correct.scale(*args))
    result = check("special_values", sv_correct.scale, flushing_reference, sv_correct.make_inputs)
    assert result.verdict == "pass", result.message
    monkeypatch.setattr(Subject, "reference_on_cpu", lambda self, args: flushing_reference(*args))
    result = check("special_values", sv_correct.scale, flushing_reference, sv_correct.make_inputs)
    assert result.verdict == "fail" and "the kernel keeps a subnormal" in result.message, result.message
    # a kernel that flushes where the reference keeps still fails, whatever the host says
    monkeypatch.setattr(Subject, "reference_on_cpu", lambda self, args: flushing_reference(*args))
    result = check("special_values", flushing_reference, sv_correct.scale, sv_correct.make_inputs)
    assert result.verdict == "fail" and "the kernel flushes it to zero" in result.message, result.message


def test_the_reference_on_the_cpu_is_asked_only_where_the_kernel_runs_elsewhere():
    from tests.gate_harness import subject_for

    subject = subject_for(sv_correct.scale, sv_correct.reference_scale, sv_correct.make_inputs)
    assert subject.reference_on_cpu(subject.inputs(subject.cases[0])) is None  # on the CPU already


def test_a_module_reference_runs_on_the_cpu_as_a_copy_made_once_within_its_cap(monkeypatch):
    """Off the CPU a module reference (a KernelBench Model) is asked on the CPU through a copy of itself: CUDA's
    float atomics behind index_add_ flush the subnormals they add, torch's CPU path keeps them, and a kernel
    keeping them departs from no contract (a correct segment mean failed so on an H100)."""
    import kgate.subject as subject_module
    from tests.gate_harness import subject_for

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((1,), 3.0))

        def forward(self, x):
            return x * self.weight

    subject = subject_for(Scale(), Scale(), sv_correct.make_inputs)
    args = subject.inputs(subject.cases[0])
    monkeypatch.setattr(subject, "device", torch.device("meta"))  # the kernel "elsewhere": only the type is read
    out = subject.reference_on_cpu(args)
    assert out.device.type == "cpu" and torch.equal(out, args[0] * 3.0)
    first = subject._cpu_reference
    subject.reference_on_cpu(args)
    assert subject._cpu_reference is first  # made once
    monkeypatch.setattr(subject_module, "CPU_COPY_ELEMENTS", 0)
    other = subject_for(Scale(), Scale(), sv_correct.make_inputs)
    monkeypatch.setattr(other, "device", torch.device("meta"))
    assert other.reference_on_cpu(args) is None  # past the cap: no copy


def test_subnormal_products_are_judged_too():
    def product(x, y):
        return x * y

    def product_ftz(x, y):
        out = x * y
        return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)

    def pair(seed, shape=None, dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(4, 16, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))

    assert check("special_values", product, product, pair).verdict == "pass"
    result = check("special_values", product_ftz, product, pair)
    assert result.verdict == "fail" and "products are subnormal" in result.message, result.message


def _scaled_product(a, b):
    """A product scaled up, computed in the inputs' dtype: on inputs scaled so that products are subnormal, a * b
    falls below bfloat16's smallest subnormal (9.2e-41) where the oracle's a * b * 1000 is a clearly subnormal
    result (as Llama's RMSNorm reference: `weight * y` in bfloat16, its backward's dy * weight, then rstd)."""
    return (a * b) * 1000.0


def _scaled_product_in_float32(a, b):
    """The same in float32, rounded once to the dtype (Liger's RMSNorm backward multiplies so)."""
    return ((a.float() * b.float()) * 1000.0).to(a.dtype)


def _bf16_pair(seed, shape=None, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(4, 64, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))


def test_a_bfloat16_reference_zero_that_float32_keeps_is_rounding_not_a_flush(monkeypatch):
    """The reference rounds a * b to 0 in bfloat16 where the kernel, multiplying in float32, keeps the subnormal
    result the oracle has. float32 has bfloat16's smallest normal: a flush would give 0 there too, and the
    reference on its inputs widened to float32 keeps the result, so the 0 is bfloat16's rounding: pass. Without
    the widened evaluation the same pair fails (the premise), and a reference that flushes its results fails
    the kernel still, widened or not."""
    from kgate.subject import Subject

    result = check("special_values", _scaled_product_in_float32, _scaled_product, _bf16_pair, dtypes=["bfloat16"])
    assert result.verdict == "pass", result.message
    monkeypatch.setattr(Subject, "reference_widened", lambda self, args: None)
    before = check("special_values", _scaled_product_in_float32, _scaled_product, _bf16_pair, dtypes=["bfloat16"])
    assert before.verdict == "fail" and "the kernel keeps a subnormal" in before.message, before.message
    monkeypatch.undo()

    def flushing(a, b):  # an FTZ reference: subnormal results are 0, in bfloat16 and in float32 alike
        out = _scaled_product_in_float32(a, b)
        return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)

    flushed = check("special_values", _scaled_product_in_float32, flushing, _bf16_pair, dtypes=["bfloat16"])
    assert flushed.verdict == "fail" and "the kernel keeps a subnormal" in flushed.message, flushed.message


def _underflowing_product(a, b):
    """a * b through an intermediate that float16 quantises in its subnormal range: on inputs scaled so that
    products are subnormal (peak 7e-3), b / 512 is a float16 subnormal and a * (b / 512) rounds to a multiple of
    its smallest subnormal (6e-8), 0 for some elements, before the scaling by 512 brings it back to the oracle's
    clearly subnormal a * b (as the float16 `dy * weight` of Llama's RMSNorm backward before rstd)."""
    return (a * (b / 512)) * 512


def _product_in_float32(a, b):
    return (a.float() * b.float()).to(a.dtype)


def _f16_pair(seed, shape=None, dtype=torch.float16):
    """Two inputs that peak at the same elements (products near the top of float16's subnormal range)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(8, 256, generator=gen, dtype=torch.float64)
    return a.to(dtype), (a * (1 + 0.01 * torch.randn(8, 256, generator=gen, dtype=torch.float64))).to(dtype)


def test_a_reference_that_keeps_subnormal_results_does_not_flush_its_zeros():
    """The float16 reference gives 0 for some clearly subnormal results (an intermediate rounded in float16's
    subnormal range) and keeps the others: a reference that keeps subnormal results of an output does not flush,
    so a kernel keeping every one passes. The premise (the reference's zeros where the oracle is clearly
    subnormal, beside kept ones) is checked on the probe's scaling; a reference that flushes every subnormal
    result fails the same kernel."""
    import math

    tiny = torch.finfo(torch.float16).tiny
    a, b = (t.double() / t.double().abs().max() * math.sqrt(tiny) * 0.9 for t in _f16_pair(0))
    a, b = a.half(), b.half()
    oracle, ref = (a.double() * b.double()).half(), _underflowing_product(a, b)
    clearly = (oracle.abs() >= tiny / 16) & (oracle.abs() < tiny)
    assert (clearly & (ref == 0)).any() and (clearly & (ref != 0) & (ref.abs() < tiny)).any()

    result = check("special_values", _product_in_float32, _underflowing_product, _f16_pair, dtypes=["float16"])
    assert result.verdict == "pass", result.message

    def flushing(a, b):  # an FTZ reference: every subnormal result is 0
        out = _underflowing_product(a, b)
        return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)

    flushed = check("special_values", _product_in_float32, flushing, _f16_pair, dtypes=["float16"])
    assert flushed.verdict == "fail" and "the kernel keeps a subnormal" in flushed.message, flushed.message


def test_the_widened_reference_is_asked_only_for_bfloat16_arguments():
    subject = subject_for(_scaled_product, _scaled_product, _bf16_pair, dtypes=["float32"])
    assert subject.reference_widened(subject.inputs(subject.cases[0])) is None
    subject = subject_for(_scaled_product, _scaled_product, _bf16_pair, dtypes=["bfloat16"])
    widened = subject.reference_widened(subject.inputs(subject.cases[0]))
    assert widened.dtype == torch.float32


# --- a reference whose special-value semantics differ by device ------------------------------------------

def _rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _nan_rows_on_the_device(reference):
    """The float64 oracle of `reference` with another device's semantics: every row holding a non-finite input
    all NaN (as torch's CUDA rms_norm, whose Welford update turns an Inf into NaN for its row)."""
    def on_device(x):
        out = reference(x)
        return torch.where((~torch.isfinite(x)).any(-1, keepdim=True), torch.nan, out)
    return on_device


def device_dependent(kernel, reference, device_reference):
    """A subject whose oracle runs on a (pretended) CUDA device with `device_reference`'s semantics, and on the
    CPU with `reference`'s: the subject's `oracle(args, device)` hook evaluates each."""
    subject = subject_for(kernel, reference, rows, shapes=[SHAPE], seeds=[SEED])
    plain = subject.oracle
    subject.oracle_device = torch.device("cuda")
    device_oracle = subject_for(kernel, device_reference, rows).oracle

    def oracle(args, device=None):
        if device is not None and device.type == "cpu":
            return plain(args, device)
        return device_oracle(args, torch.device("cpu"))

    subject.oracle = oracle
    return subject


def test_a_class_the_reference_gives_on_the_cpu_passes_where_its_device_evaluation_differs():
    """RMSNorm with one +Inf in a row: the formula (the kernel, torch on the CPU) gives 0 at the finite elements,
    the device's oracle NaN for the whole row. Either evaluation of the reference is the op's behaviour."""
    subject = device_dependent(_rms_norm, _rms_norm, _nan_rows_on_the_device(_rms_norm))
    result = registry.get("special_values").check(subject)
    assert result.verdict == "pass", result.message
    assert "output(s) of the class the reference gives on the CPU where its float64 evaluation on cuda" in \
        result.message
    assert result.details["devices"] and all(d["outputs"] > 0 for d in result.details["devices"])
    # without the CPU evaluation (the oracle on the CPU already), the device's classes alone fail the kernel
    alone = check("special_values", _rms_norm, _nan_rows_on_the_device(_rms_norm), rows, shapes=[SHAPE],
                  seeds=[SEED])
    assert alone.verdict == "fail" and "the oracle gives NaN, the kernel gives -0.0" in alone.message


def test_a_nan_dropped_where_every_evaluation_gives_nan_still_fails():
    """amax that ignores NaN: the reference gives NaN on the device and on the CPU alike."""
    def amax(x):
        return x.amax(-1)

    def amax_dropping_nan(x):
        return torch.where(torch.isnan(x), -torch.inf, x).amax(-1)

    subject = device_dependent(amax_dropping_nan, amax, amax)
    result = registry.get("special_values").check(subject)
    assert result.verdict == "fail" and result.expected == "NaN" and result.got.startswith("finite"), result.message
    assert "the oracle gives NaN (on the CPU too), the kernel gives" in result.message


def test_a_class_neither_evaluation_gives_still_fails():
    """RMSNorm that zeroes the non-finite results: at the Inf element the CPU's oracle gives NaN, the device's
    NaN too; the kernel's 0 matches neither."""
    def rms_norm_nan_to_num(x):
        return torch.nan_to_num(_rms_norm(x), nan=0.0)

    subject = device_dependent(rms_norm_nan_to_num, _rms_norm, _nan_rows_on_the_device(_rms_norm))
    result = registry.get("special_values").check(subject)
    assert result.verdict == "fail" and "(on the CPU too)" in result.message, result.message
    assert "--gate special_values" in result.repro


# --- a reference's 0 from rounding is not a flush ------------------------------------------------------------

def _half_rows(seed, shape=None, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (4, 300), generator=gen, dtype=torch.float64).to(dtype),)


def _cumsum_float32(x):
    """A prefix sum that adds in float32 and rounds once to the dtype (FlagGems' cumsum for half inputs)."""
    return torch.cumsum(x.float(), -1).to(x.dtype)


def test_a_reference_zero_from_rounding_is_not_a_flush(monkeypatch):
    """On inputs scaled so that products are subnormal, the reference (running sum in float16) gives 0 where the
    truth is a clearly subnormal 4c; the kernel, adding in float32, keeps it as the oracle does. Moving every
    input by an ulp moves the oracle there by more than the result (the ones are 1000 times larger): the 0 is
    the computation's rounding, not a flush."""
    result = check("special_values", sv_correct.sum_float32, sv_correct.reference_sum_in_dtype, sv_correct.make_inputs_cancelling,
                   dtypes=["float16"])
    assert result.verdict == "pass", result.message
    # the premise: read as a flush without the criterion
    from kgate.gates import special_values

    monkeypatch.setattr(special_values, "oracle_moves", lambda *_, **__: {})
    before = check("special_values", sv_correct.sum_float32, sv_correct.reference_sum_in_dtype, sv_correct.make_inputs_cancelling,
                   dtypes=["float16"])
    assert before.verdict == "fail" and "the kernel keeps a subnormal" in before.message, before.message


def test_a_flush_of_a_determined_subnormal_result_still_fails_in_a_prefix_sum():
    """The same kernel against a reference that adds in float32 and flushes subnormal results (FTZ): on
    subnormal inputs the first prefix sums are the inputs themselves, which an ulp of the inputs moves by a
    fraction of an ulp: a 0 there is a flush, and keeping the subnormal differs from it."""
    def cumsum_ftz(x):
        out = _cumsum_float32(x)
        return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)

    result = check("special_values", _cumsum_float32, cumsum_ftz, _half_rows, dtypes=["float16"])
    assert result.verdict == "fail" and "the kernel keeps a subnormal" in result.message, result.message
    assert "inputs scaled to subnormal magnitudes" in result.message and result.details["subnormal"]


def test_a_class_the_reference_itself_gives_in_the_kernels_dtype_passes():
    """sigmoid's backward with an Inf cotangent where sigmoid rounds to 1.0: the float64 oracle keeps s(1 - s) > 0
    and gives Inf, the reference's own formula in bfloat16 gives Inf * 0 = NaN, and so does the kernel."""
    result = check("special_values", sv_correct.sigmoid_backward, sv_correct.reference_sigmoid_backward,
                   sv_correct.make_inputs_saturated, dtypes=("bfloat16",))
    assert result.verdict == "pass", result.message
    assert "the class the reference itself gives in the kernel's dtype" in result.message
    assert result.details["rounded"] and all(r["outputs"] > 0 for r in result.details["rounded"])


def test_a_class_neither_the_oracle_nor_the_reference_in_its_dtype_gives_still_fails():
    """The same backward with its non-finite results zeroed: the oracle gives Inf, the reference NaN, the
    kernel 0."""
    result = check("special_values", sv_violating.sigmoid_backward_zeroing_nonfinite, sv_correct.reference_sigmoid_backward,
                   sv_correct.make_inputs_saturated, dtypes=("bfloat16",))
    assert result.verdict == "fail", result.message
    assert "the kernel gives 0.0" in result.message


# --- integer outputs ---------------------------------------------------------------------------------------------

def test_an_integer_output_that_skips_nan_fails_and_one_that_keeps_torchs_rules_passes():
    """argmax is an int64 output: no class to compare, its value is what a NaN changes (torch returns the NaN's
    index). Skipping NaN in the comparison gives another index: a failure naming the two indices."""
    wrong = check("special_values", sv_violating.row_argmax_skips_nan, sv_correct.reference_row_argmax,
                  sv_correct.make_inputs)
    assert wrong.verdict == "fail" and "the oracle gives" in wrong.message and "int64 output differ" in wrong.message
    assert "NaN injected" in wrong.message
    right = check("special_values", sv_correct.row_argmax_blocked, sv_correct.reference_row_argmax,
                  sv_correct.make_inputs)
    assert right.verdict == "pass", right.message


def test_an_integer_output_the_reference_gives_in_the_kernels_dtype_passes():
    """argmax(x + 1000) in float16: the row's two largest inputs, 2 and the next float16 above it, round to one
    value once 1000 is added (float16's spacing there is 0.5), so the reference in float16 returns the first
    index, where the float64 oracle tells them apart and returns the second. The kernel that computes as its
    reference does is not blamed for the oracle's index."""
    def make_near_ties(seed, shape=None, dtype=torch.float32, device="cpu"):
        gen = torch.Generator().manual_seed(seed)
        base = 0.1 * torch.randn(8, 32, generator=gen, dtype=torch.float64)
        base[:, 5] = 2.0
        base[:, 20] = 2.001953125  # the next float16 above 2
        return (base.to(dtype=dtype, device=device),)

    def shifted_argmax(x):
        return torch.argmax(x + 1000, dim=-1)

    result = check("special_values", shifted_argmax, shifted_argmax, make_near_ties, dtypes=("float16",))
    assert result.verdict == "pass", result.message


def test_a_nan_in_the_wrong_bin_is_a_finite_value_of_the_wrong_size():
    """A bin lookup that sends NaN to the first bin where torch's bucketize sends it past the last: finite in
    both, so the classes agree; the moved output is 1e6 bounds off, and fails (not tolerance-free)."""
    correct, violating = catalogue("special_values", "correct"), catalogue("special_values", "violating")
    bad = check("special_values", violating.binned_nan_first, correct.reference_binned, correct.make_inputs)
    assert bad.verdict == "fail" and not bad.tolerance_free and "finite where the oracle is finite" in bad.message
    good = check("special_values", correct.binned_by_counting, correct.reference_binned, correct.make_inputs)
    assert good.verdict == "pass", good.message


def _tf32(t):
    """`t` with a float32's mantissa cut to TF32's 10 bits (the products of cuDNN's default float32 path)."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32) if t.dtype == torch.float32 else t


def _shift_by_row_nansum(x):
    return x + _tf32(torch.nansum(x, -1, keepdim=True))


def _reference_spreading_nan_over_rows(x):
    """As the kernel, but in float32 a NaN spreads over its whole row (a tile, as cuDNN's transposed convolution
    spreads one), where the float64 oracle keeps it in its element."""
    y = _shift_by_row_nansum(x)
    return torch.where(torch.isnan(x).any(-1, keepdim=True), float("nan"), y) if x.dtype != torch.float64 else y


def test_a_reference_that_spreads_a_nan_wider_than_the_oracle_keeps_its_own_error_in_the_bound():
    """The outputs an injected NaN moves in the oracle are judged against the reference's own error where the
    reference is finite: where its NaN covers them, the bound would be its floor alone, and a kernel with the
    reference's own TF32 error would fail (an exactly-correct candidate did, on an H100)."""
    def make(seed, shape=None, dtype=torch.float32, device="cpu"):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(8, 64, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)

    result = check("special_values", _shift_by_row_nansum, _reference_spreading_nan_over_rows, make)
    assert result.verdict == "pass", result.message


def test_an_inf_beside_an_edge_shows_an_interpolation_that_replicates_the_edge(monkeypatch):
    from kgate.gates import special_values

    # (a whole line of Inf shows it too: left out, so that the single values are what is tested)
    monkeypatch.setattr(special_values.SpecialValues, "lines",
                        staticmethod(lambda args, floats, structured=False: iter(())))
    monkeypatch.setattr(special_values, "unread_lines", lambda *args: [])
    result = check("special_values", sv_violating.upsample_edge_replicated, sv_correct.reference_upsample,
                   sv_correct.make_signal)
    assert result.verdict == "fail" and "second" in result.message, result.message
    assert check("special_values", sv_correct.upsample_taps, sv_correct.reference_upsample,
                 sv_correct.make_signal).verdict == "pass"

    def without_neighbours(shape, gen):
        return [(n, i) for n, i in positions(shape, gen) if not n.startswith("second")]

    monkeypatch.setattr(special_values, "positions", without_neighbours)
    monkeypatch.setattr(special_values, "RANDOM_POSITIONS", 0)
    assert check("special_values", sv_violating.upsample_edge_replicated, sv_correct.reference_upsample,
                 sv_correct.make_signal).verdict == "pass"


def test_positions_include_the_edges_neighbours():
    named = dict((n, i) for n, i in positions((4, 5, 1), torch.Generator().manual_seed(0)))
    assert named["second element along every dimension"] == (1, 1, 0)
    assert named["second-to-last element along every dimension"] == (2, 3, 0)


def test_a_kernel_that_skips_zero_weight_groups_fails_once_the_weights_are_pruned(monkeypatch):
    result = check("special_values", sv_violating.GroupedLinearSkipsZeroGroups(), sv_correct.GroupedLinear(),
                   sv_correct.make_grouped)
    assert result.verdict == "fail" and "zeroed alike in kernel and reference (pruned)" in result.message, \
        result.message
    correct = sv_correct.GroupedLinearBmm()
    passed = check("special_values", correct, sv_correct.GroupedLinear(), sv_correct.make_grouped)
    assert passed.verdict == "pass", passed.message
    assert bool(correct.weight[:2].any())  # the weights are put back after
    from kgate.gates import special_values

    monkeypatch.setattr(special_values.SpecialValues, "pruned", lambda self, subject, *found: (None, 0))
    assert check("special_values", sv_violating.GroupedLinearSkipsZeroGroups(), sv_correct.GroupedLinear(),
                 sv_correct.make_grouped).verdict == "pass"


def test_a_column_all_minus_inf_taken_for_an_empty_one_fails_and_a_blocked_max_passes():
    """-Inf fills the line through the last element along every dimension, not only the last: a column maximum
    that reads "still -Inf" as "no row seen" writes 0 where the reference gives -Inf."""
    bad = check("special_values", sv_violating.column_max_empty_as_zero, sv_correct.reference_column_max,
                sv_correct.make_inputs)
    assert bad.verdict == "fail" and "-Inf filling argument 0 at [:, 39]" in bad.message, bad.message
    good = check("special_values", sv_correct.column_max_blocked, sv_correct.reference_column_max,
                 sv_correct.make_inputs)
    assert good.verdict == "pass", good.message


def test_nan_in_a_row_the_reference_does_not_read_must_not_reach_the_output(monkeypatch):
    """Padding rows (ignore_index) that the reference never reads: its gradient there is exactly 0, and NaN fills
    such a row. A kernel that weights the padding rows' losses by 0 gives 0 x NaN = NaN; one that selects the
    valid rows first passes. Without the unread lines, the first passes too."""
    from kgate.gates import special_values as sv

    bad = check("special_values", sv_violating.cross_entropy_masked_by_weight, sv_correct.reference_cross_entropy,
                sv_correct.make_logits)
    assert bad.verdict == "fail" and "a line the reference does not read" in bad.message, bad.message
    good = check("special_values", sv_correct.cross_entropy_valid_rows, sv_correct.reference_cross_entropy,
                 sv_correct.make_logits)
    assert good.verdict == "pass" and "lines the reference does not read" in good.message, good.message
    subject = subject_for(sv_violating.cross_entropy_masked_by_weight, sv_correct.reference_cross_entropy,
                          sv_correct.make_logits)
    args = subject.baseline(subject.cases[0]).args
    lines = sv.unread_lines(subject, args, [0], 0)
    ignored = set((args[1] == -100).nonzero().flatten().tolist())
    assert lines and all(index[0] in ignored for _, index in lines), (lines, ignored)
    monkeypatch.setattr(sv, "unread_lines", lambda *a: [])
    assert check("special_values", sv_violating.cross_entropy_masked_by_weight, sv_correct.reference_cross_entropy,
                 sv_correct.make_logits).verdict == "pass"


def test_a_reference_without_a_gradient_has_no_unread_lines():
    from kgate.gates import special_values as sv

    subject = subject_for(sv_correct.row_argmax_blocked, sv_correct.reference_row_argmax, sv_correct.make_inputs)
    args = subject.baseline(subject.cases[0]).args
    assert sv.unread_lines(subject, args, [0], 0) == []


# --- the same value in every input at once ----------------------------------------------------------------------

_pairs = normal_inputs((5, 33), count=2, scale=3.0)


def _log_add_exp_shifted(a, b):
    """hi + log1p(exp(lo - hi)): right for one infinite operand, NaN for two equal ones (-inf - -inf, inf - inf)."""
    hi, lo = torch.maximum(a, b), torch.minimum(a, b)
    return hi + torch.log1p(torch.exp(lo - hi))


def _log_add_exp_guarded(a, b):
    hi, lo = torch.maximum(a, b), torch.minimum(a, b)
    return torch.where(hi == lo, hi + 0.6931471805599453, hi + torch.log1p(torch.exp(lo - hi)))


def test_a_formula_wrong_only_for_two_infinite_operands_fails_on_the_joint_injection():
    result = check("special_values", _log_add_exp_shifted, torch.logaddexp, _pairs)
    assert result.verdict == "fail", result.message
    assert "injected into arguments 0, 1 at once" in result.message and result.got.startswith("NaN"), result.message


def test_the_guarded_formula_passes_every_joint_injection():
    result = check("special_values", _log_add_exp_guarded, torch.logaddexp, _pairs)
    assert result.verdict == "pass", result.message

