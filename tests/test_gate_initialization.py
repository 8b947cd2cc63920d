"""initialization: an output element the kernel never writes is caught; a fully written one passes."""

from __future__ import annotations

import pytest
import torch

from kgate.gates.initialization import NAN_BYTE, SENTINEL_BYTE, AllocationHook, Guarded
from tests.gate_harness import check


def rows(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (5, 37), generator=gen, dtype=torch.float64) * 3).to(dtype),)


def ref(x):
    return torch.softmax(x, dim=-1)


def blocks_only(x):
    """torch.empty_like, written in whole blocks of 8 columns: the tail is never written."""
    out = torch.empty_like(x)
    n = x.shape[-1] - x.shape[-1] % 8
    out[..., :n] = torch.softmax(x, dim=-1)[..., :n]
    return out


def every_block(x):
    out = torch.empty_like(x)
    for start in range(0, x.shape[-1], 8):
        out[..., start:start + 8] = torch.softmax(x, dim=-1)[..., start:start + 8]
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_partly_written_empty_fails(dtype):
    result = check("initialization", blocks_only, ref, rows, dtypes=[dtype])
    assert result.verdict == "fail" and result.tolerance_free and result.broken
    assert "depend on what the memory held" in result.message
    assert result.where.startswith("out[") and result.details["unwritten"] == 5 * (37 % 8)
    assert "--gate initialization" in result.repro


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fully_written_empty_passes(dtype):
    result = check("initialization", every_block, ref, rows, dtypes=[dtype])
    assert result.verdict == "pass", result.message
    assert "allocation(s) poisoned" in result.message


def test_every_empty_factory_is_poisoned():
    x = torch.ones(3, 4)
    with AllocationHook(poison=NAN_BYTE) as hook:
        made = [torch.empty(3), torch.empty_like(x), x.new_empty(5), torch.empty_strided((2, 2), (1, 2)),
                torch.empty(2, dtype=torch.int32)]
    assert hook.count == len(made)
    assert all(torch.isnan(t).all() for t in made[:4])
    assert (made[4] == -1).all()  # 0xFF bytes in an int32
    with AllocationHook(poison=SENTINEL_BYTE):
        t = torch.empty(4)
    assert (t == torch.tensor([0xA5A5A5A5], dtype=torch.int64).to(torch.int32).view(torch.float32)).all()


def test_nondeterministic_kernel_judged_by_finiteness():
    # Declared nondeterministic: the two poisons cannot be compared, but NaN where the oracle is finite
    # still shows the unwritten tail.
    result = check("initialization", blocks_only, ref, rows, nondeterministic=True)
    assert result.verdict == "fail" and "non-finite with NaN-poisoned allocations" in result.message
    assert check("initialization", every_block, ref, rows, nondeterministic=True).verdict == "pass"


def test_undeclared_nondeterminism_is_not_called_unwritten_memory():
    def jitter(x):
        return torch.softmax(x, dim=-1) * (1 + 1e-6 * torch.rand(()))

    result = check("initialization", jitter, ref, rows)
    assert result.verdict == "pass" and "not deterministic" in result.message


def test_guarded_buffer_reports_writes_outside_the_view():
    like = torch.zeros(4, 6)[:, ::2]  # strided: gaps between the elements
    g = Guarded(like, 64, NAN_BYTE, "t")
    g.view.fill_(1.0)
    assert g.check() is None
    g.buffer[g.guard + 1] = 2.0  # a gap element (column 1 of the 6-wide rows)
    assert "gap" in g.check()
    g2 = Guarded(torch.zeros(5), 64, SENTINEL_BYTE, "u")
    g2.buffer[g2.guard + 5] = 0.0  # right after the end
    assert "past its last element" in g2.check()


def _shaped(seed, shape=None):
    torch.manual_seed(seed)
    return (torch.randn(shape or (16, 37)),)


def test_a_tail_unwritten_only_off_the_declared_shapes_is_initializations_finding():
    """A kernel that writes whole blocks of 8 rows is complete at a declared 16 rows; at a batch of 1 its
    output is what the memory held, which the shapes gate reported as a small numeric error (another at every
    call). The initialization gate judges the shapes gate's first edge shapes too: a tolerance-free fail."""
    from gates.initialization.correct import reference, softmax_blocked
    from gates.initialization.violating import softmax_blocked_whole_rows_only

    result = check("initialization", softmax_blocked_whole_rows_only, reference, _shaped, shapes=[[16, 37]])
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert result.details["edge_shape"] and "edge shape" in result.message
    assert result.case["shape"] != [16, 37], result.case
    correct = check("initialization", softmax_blocked, reference, _shaped, shapes=[[16, 37]])
    assert correct.verdict == "pass" and "edge shape(s)" in correct.message, correct.message


def test_an_edge_shape_the_kernel_rejects_is_left_to_the_shapes_gate():
    def sixteen_rows_only(x):
        if x.shape[0] != 16:
            raise ValueError("16 rows only")
        return torch.softmax(x, dim=-1)

    result = check("initialization", sixteen_rows_only, lambda x: torch.softmax(x, dim=-1), _shaped,
                   shapes=[[16, 37]])
    assert result.verdict == "pass", result.message
