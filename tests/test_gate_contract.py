"""The contract gate beyond the basics of tests/test_gates_core.py: outputs that are views of an input
(allowed exactly where the reference's output is one) and named tuples (a named tuple is a tuple)."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from kgate.compare import overlaps, structure
from tests.gate_harness import catalogue, check

Pair = namedtuple("Pair", ["values", "indices"])
Triple = namedtuple("Triple", ["values", "indices", "extra"])


def matrix(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (6, 10), generator=gen, dtype=torch.float64).to(dtype),)


def two_matrices(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(shape or (6, 10), generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    return a, b


def contract(kernel, reference, make_inputs=matrix, **kw):
    kw.setdefault("shapes", [[6, 10], [1, 7]])
    return check("contract", kernel, reference, make_inputs, **kw)


# --- aliasing: a view where the reference returns one ---------------------------------------------------

def flat(x):
    return x.reshape(-1)


def transposed(x):
    return x.transpose(0, 1)


def head(x):
    return x[..., :3]


def rows_first_and_second(x):
    return x[0], x[-1]


@pytest.mark.parametrize("view", [flat, transposed, head, rows_first_and_second, lambda x: x],
                         ids=["reshape", "transpose", "slice", "tuple-of-views", "identity"])
def test_view_of_input_passes_where_the_reference_returns_the_same_view(view):
    result = contract(view, view)
    assert result.verdict == "pass", result.message


def test_fresh_output_passes_where_the_reference_returns_a_view():
    assert contract(lambda x: x.reshape(-1).clone(), flat).verdict == "pass"


@pytest.mark.parametrize(("kernel", "reference", "where"), [
    (flat, lambda x: x.reshape(-1).clone(), "out"),               # the reference copies
    (lambda x: x, lambda x: x.clamp(-100.0, 100.0), "out"),        # a fast path returning the input
    (lambda x: (x[0], x[-1]), lambda x: (x[0], x[-1].clone()), "out[1]"),  # one leaf of two
])
def test_view_of_input_fails_where_the_reference_returns_fresh_memory(kernel, reference, where):
    result = contract(kernel, reference)
    assert result.verdict == "fail", result.message
    assert "aliases input argument 0" in result.message and result.where == where
    assert result.tolerance_free and result.broken


def test_view_of_another_input_than_the_reference_views_fails():
    result = contract(lambda a, b: b.reshape(-1), lambda a, b: a.reshape(-1), two_matrices)
    assert result.verdict == "fail" and "aliases input argument 1" in result.message
    assert "argument 0" in result.expected


def test_reference_runs_on_its_own_copy_of_the_inputs():
    kernel_args, reference_args = [], []

    def kernel(x):
        kernel_args.append(x)
        return x.reshape(-1)

    def reference(x):
        reference_args.append(x)
        return x.reshape(-1)

    assert contract(kernel, reference, shapes=[[6, 10]]).verdict == "pass"
    assert not any(overlaps(k, r) for k in kernel_args for r in reference_args)


# --- named tuples --------------------------------------------------------------------------------------

def row_max(x):
    return torch.max(x, dim=-1)  # torch.return_types.max


def row_max_plain(x):
    return tuple(torch.max(x, dim=-1))


def row_max_named(x):
    return Pair(*torch.max(x, dim=-1))


@pytest.mark.parametrize(("kernel", "reference"), [
    (row_max, row_max_plain), (row_max_named, row_max_plain), (row_max_named, row_max), (row_max, row_max),
], ids=["return_types-vs-plain", "namedtuple-vs-plain", "namedtuple-vs-return_types", "return_types-vs-itself"])
def test_a_named_tuple_is_a_tuple(kernel, reference):
    result = contract(kernel, reference)
    assert result.verdict == "pass", result.message


Other = namedtuple("Other", ["value", "index"])


@pytest.mark.parametrize(("kernel", "reference"), [
    (row_max_plain, row_max), (row_max_plain, row_max_named), (lambda x: Other(*torch.max(x, dim=-1)), row_max),
], ids=["plain-vs-return_types", "plain-vs-namedtuple", "other-fields-vs-return_types"])
def test_a_named_tuple_reference_needs_its_field_names(kernel, reference):
    """Where the reference returns a named tuple, callers read `out.values`: a plain tuple breaks them."""
    result = contract(kernel, reference)
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "named tuple with fields values, indices" in result.message, result.message


@pytest.mark.parametrize("gate", ["oracle", "special_values"])
def test_named_tuple_reference_is_comparable_with_its_oracle(gate):
    # the float64 oracle is rebuilt as a plain tuple: a kernel returning what the reference returns
    # (torch.return_types.max) must still be measured against it
    result = check(gate, row_max, row_max, matrix, shapes=[[6, 10]])
    assert result.verdict == "pass", result.message


@pytest.mark.parametrize(("kernel", "reference"), [
    (lambda x: Triple(*torch.max(x, dim=-1), x.sum(-1)), row_max_plain),   # longer
    (lambda x: torch.max(x, dim=-1).values, row_max),                       # a tensor, not a tuple
    (row_max, lambda x: torch.max(x, dim=-1).values),                       # a tuple, not a tensor
    (lambda x: {"values": torch.max(x, dim=-1).values, "indices": torch.max(x, dim=-1).indices}, row_max),
    (lambda x: tuple(reversed(torch.max(x, dim=-1))), row_max),             # same length, other order
    (lambda x: list(torch.max(x, dim=-1)), row_max),                        # a list, not a tuple
])
def test_different_structures_still_fail(kernel, reference):
    result = contract(kernel, reference)
    assert result.verdict == "fail", result.message
    assert result.tolerance_free


def test_structure_reads_named_tuples_as_tuples():
    x = torch.zeros(2, 3)
    assert structure(torch.max(x, dim=-1)) == structure(tuple(torch.max(x, dim=-1))) == "tuple(Tensor, Tensor)"
    assert structure(Pair(x, [x, None])) == "tuple(Tensor, list(Tensor, NoneType))"
    assert structure([x]) != structure((x,))


# --- layout: strides where the reference's output is dense ----------------------------------------------

def matmul(a, b):
    return a @ b.transpose(0, 1)


def matmul_transposed_result(a, b):
    """The product computed as (b a^T)^T: right values, strides (1, rows) where the reference's are contiguous."""
    return (b @ a.transpose(0, 1)).transpose(0, 1)


def test_transposed_result_where_the_reference_is_contiguous_fails():
    result = contract(matmul_transposed_result, matmul, two_matrices)
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "strides (1, 6)" in result.message and ".view(-1)" in result.message
    assert result.expected == "strides (6, 1) (or padded rows of that order), or contiguous"  # a (6, 6) product
    assert result.where == "out" and "outermost first: (1, 0)" in result.message
    assert result.details == {"strides": [1, 6], "reference_strides": [6, 1]}
    assert "--gate contract" in result.repro


def test_contiguous_result_passes_where_the_reference_is_permuted():
    # strides of a dense reference output are often an accident of its algorithm: contiguous always serves
    assert contract(lambda a, b: matmul_transposed_result(a, b).contiguous(), matmul_transposed_result,
                    two_matrices).verdict == "pass"


def channels_last(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (2, 3, 4, 5), generator=gen, dtype=torch.float64).to(dtype)
    return (x.contiguous(memory_format=torch.channels_last),)


@pytest.mark.parametrize("kernel", [lambda x: x * 2, lambda x: (x * 2).contiguous()], ids=["preserved", "contiguous"])
def test_channels_last_kept_or_contiguous_passes(kernel):
    result = contract(kernel, lambda x: x * 2, channels_last, shapes=[[2, 3, 4, 5]])
    assert result.verdict == "pass", result.message


def test_other_permutation_than_the_references_fails():
    def nhwc_as_nchw_last(x):  # dense, neither contiguous nor the reference's channels-last
        return (x * 2).permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)

    result = contract(nhwc_as_nchw_last, lambda x: x * 2, channels_last, shapes=[[2, 3, 4, 5]])
    assert result.verdict == "fail" and "strides" in result.message


def test_size_one_dimensions_strides_are_ignored():
    def odd_stride(x):  # a size-1 dimension's stride is never used
        return x.sum(0, keepdim=True).as_strided((1, x.shape[1]), (12345, 1))

    assert contract(odd_stride, lambda x: x.sum(0, keepdim=True)).verdict == "pass"


def padded(x):  # rows allocated 8 wider for alignment, the result a slice of them (as tiled kernels return)
    buf = torch.zeros(x.shape[0], x.shape[1] + 8, dtype=x.dtype)
    buf[:, : x.shape[1]] = x * 2
    return buf[:, : x.shape[1]]


def test_padded_rows_keep_the_order_and_pass():
    assert contract(padded, lambda x: x * 2).verdict == "pass"


def test_padded_rows_one_element_wide_pass():
    """Rows of width 1 padded to a tile (strides (16, 1) for shape (n, 1)): the padded allocation's order, its
    only dimension of size > 1 strided by the tile."""
    from kgate.gates.contract import layout_problem

    assert layout_problem(torch.zeros(6, 16)[:, :1], torch.zeros(6, 1)) is None
    spread = torch.zeros(6, 2)[:, :1].t()  # shape (1, 6) with its elements 2 apart: not a padded row
    assert layout_problem(spread, torch.zeros(1, 6)) is not None


def test_elements_spread_apart_fail():
    def every_other(x):  # the innermost dimension no longer has unit stride
        buf = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
        buf[:, ::2] = x * 2
        return buf[:, ::2]

    result = contract(every_other, lambda x: x * 2)
    assert result.verdict == "fail" and "strides (20, 2)" in result.message


def test_non_dense_reference_output_asks_for_no_strides():
    # the reference returns a strided slice (every other column): the kernel's fresh copy is fine
    assert contract(lambda x: x[:, ::2].clone(), lambda x: x[:, ::2]).verdict == "pass"


def test_expanded_output_where_the_reference_is_fresh_fails():
    def row_broadcast(x):  # one row's sum, expanded instead of materialized
        return x.sum(0, keepdim=True).expand(x.shape[0], -1)

    result = contract(row_broadcast, lambda x: x.sum(0, keepdim=True).repeat(x.shape[0], 1))
    assert result.verdict == "fail" and "overlaps itself" in result.message


def test_expanded_output_passes_where_the_reference_expands_too():
    def row_broadcast(x):
        return x.sum(0, keepdim=True).expand(x.shape[0], -1)

    assert contract(row_broadcast, row_broadcast).verdict == "pass"


# --- requires_grad, for kernels that declare backward: true ----------------------------------------------

class _NoAutogradScale(torch.nn.Module):
    """Scales by a parameter through a detached computation: values right, gradients cut."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((10,), 0.5))

    def forward(self, x):
        return (x.detach() * self.w.detach()).clone()


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((10,), 0.5))

    def forward(self, x):
        return x * self.w


def test_output_cut_from_the_graph_fails_when_backward_is_declared():
    result = contract(_NoAutogradScale(), _Scale(), backward=True, shapes=[[6, 10]])
    assert result.verdict == "fail" and "requires_grad=False" in result.message
    assert result.expected == "requires_grad=True"


def test_requires_grad_is_not_judged_without_backward():
    assert contract(_NoAutogradScale(), _Scale(), shapes=[[6, 10]]).verdict == "pass"


def test_output_that_requires_grad_passes_when_backward_is_declared():
    result = contract(_Scale(), _Scale(), backward=True, shapes=[[6, 10]])
    assert result.verdict == "pass" and "requires_grad" in result.message


# --- module buffers the call writes ---------------------------------------------------------------------------

_correct, _violating = catalogue("contract", "correct"), catalogue("contract", "violating")
_BatchNormed, _BatchStatsOnly = _correct.BatchNormTraining, _violating.BatchNormBatchStatsOnly
_FusedBatchNorm = _correct.BatchNormOwnFormula


class _CountsTwice(_BatchNormed):
    def forward(self, x):
        out = self.bn(x)
        self.bn.num_batches_tracked += 1
        return out


def _batch(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(32, 16, generator=gen).to(dtype=dtype, device=device),)


def test_a_module_that_leaves_the_buffers_the_reference_updates_fails():
    """Right output, running statistics never updated (or a counter moved twice): contract fails naming the
    buffer; the oracle sees the output right in training mode (it fails it in eval mode only)."""
    stale = check("contract", _BatchStatsOnly(), _BatchNormed(), _batch)
    assert stale.verdict == "fail" and "'bn.running_mean'" in stale.message and "leaves it as it was" in stale.message
    oracle = check("oracle", _BatchStatsOnly(), _BatchNormed(), _batch)
    assert oracle.verdict == "fail" and oracle.message.startswith("in eval mode"), oracle.message
    twice = check("contract", _CountsTwice(), _BatchNormed(), _batch)
    assert twice.verdict == "fail" and "'bn.num_batches_tracked'" in twice.message and "adds 2" in twice.message


def test_buffers_under_other_names_are_compared_with_the_reference_buffers_they_stand_for():
    """A fused layer holding its BatchNorm under other module names: paired by order and value as built
    (kgate.subject.pair_buffers), its running statistics that it never updates fail as under the reference's
    names; the same layer updating them passes (the oracle catalogue's fused layer)."""
    stale = check("contract", _violating.FusedNormBatchStatsOnly(), _BatchNormed(), _batch)
    assert stale.verdict == "fail" and "'norm.inner.running_mean' (the reference's 'bn.running_mean')" in \
        stale.message, stale.message
    fused = check("contract", catalogue("oracle", "correct").FusedNormLayer(), _BatchNormed(), _batch)
    assert fused.verdict == "pass" and "3 shared module buffer(s)" in fused.message, fused.message


def test_a_module_that_writes_its_buffers_as_the_reference_does_passes():
    result = check("contract", _FusedBatchNorm(), _BatchNormed(), _batch)
    assert result.verdict == "pass" and "3 shared module buffer(s) written as the reference writes them" in \
        result.message, result.message
    plain = check("contract", lambda x: x * 2, lambda x: x * 2, _batch)  # functions: no module state to compare
    assert plain.verdict == "pass" and "module buffer" not in plain.message


class _Totals(torch.nn.Module):
    """Keeps a float64 running total of its inputs (a buffer) and doubles them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(1, dtype=torch.float64))

    def forward(self, x):
        self.total += x.detach().sum().double()
        return x * 2


class _TotalsForgotten(_Totals):
    def forward(self, x):
        return x * 2


def test_module_buffers_are_compared_on_a_case_in_the_modules_own_dtype_only():
    """At another dtype the reference runs as a converted copy whose buffers are not the module's: no case in the
    modules' own dtype, nothing compared (and said); in it, the forgotten update fails."""
    def values(seed, shape=None, dtype=torch.float32, device="cpu"):
        return (torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)).to(dtype=dtype, device=device),)

    other = check("contract", _TotalsForgotten(), _Totals(), values, dtypes=["float32"])
    assert other.verdict == "pass" and "module buffers not compared (no case in the modules' own dtype)" in \
        other.message, other.message
    own = check("contract", _TotalsForgotten(), _Totals(), values, dtypes=["float32", "float64"])
    assert own.verdict == "fail" and "'total'" in own.message, own.message


def test_an_output_that_is_a_view_of_the_modules_parameter_fails():
    result = check("contract", _violating.PositionTableSpanView(), _correct.PositionTable(), _correct.make_ids,
                   shapes=[[1, 6]])
    assert result.verdict == "fail" and "shares memory with the kernel's 'table'" in result.message, result.message
    assert check("contract", _correct.PositionTableIndexed(), _correct.PositionTable(), _correct.make_ids,
                 shapes=[[1, 6]]).verdict == "pass"


def test_a_parameter_changed_by_a_call_fails_and_one_changed_before_the_first_call_is_told_apart():
    from tests.gate_harness import subject_for

    result = check("contract", _violating.ScaledLinearFoldsOnce(), _correct.ScaledLinear(), _correct.make_rows)
    assert result.verdict == "fail" and "parameter 'weight'" in result.message, result.message
    # the fold made before the gate's calls (the audit's standard test): the prints from before it tell
    kernel, reference = _violating.ScaledLinearFoldsOnce(), _correct.ScaledLinear()
    subject = subject_for(kernel, reference, _correct.make_rows)
    subject.run_kernel(_correct.make_rows(5))  # the first call folds
    from kgate import gates as registry

    result = registry.get("contract").check(subject)
    assert result.verdict == "fail" and "than before its first call" in result.message, result.message
    assert check("contract", _correct.ScaledLinearFused(), _correct.ScaledLinear(), _correct.make_rows).verdict \
        == "pass"


def test_parameter_prints_are_taken_a_piece_at_a_time_with_the_same_sums(monkeypatch):
    """A 32768 x 32768 weight is 8.6 GB in float64: the prints convert a piece at a time (a GPU worker's share of
    memory ran out in them, before the standard test, for every problem with such a weight)."""
    import kgate.subject as subject_module

    module = torch.nn.Linear(300, 200)
    whole = subject_module.parameter_prints(module)
    monkeypatch.setattr(subject_module, "PRINT_PIECE", 1000)
    pieces = subject_module.parameter_prints(module)
    assert whole.keys() == pieces.keys() == {"weight", "bias"}
    for name in whole:
        assert pieces[name] == pytest.approx(whole[name], rel=1e-12, abs=1e-12)
