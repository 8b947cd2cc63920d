"""The contract gate beyond the basics of tests/test_gates_core.py: outputs that are views of an input
(allowed exactly where the reference's output is one) and named tuples (a named tuple is a tuple)."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from kgate.compare import overlaps, structure
from tests.gate_harness import check

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
