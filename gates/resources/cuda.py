"""resources, CUDA controls: one row sum in Triton, compiled two ways. Spread over 4 warps in blocks of 1024
(8 values a thread) it stays within a budget of 128 registers and no spills (correct); one warp holding a
whole row of 8192 (256 values a thread) needs more registers than a thread has and spills to local
memory (violating), with the same results."""

import torch
import triton
import triton.language as tl

ROW = 8192


def make_inputs(seed, shape=None, dtype=torch.float32, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (64, ROW), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return x.sum(dim=-1)


@triton.jit
def _row_sum(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty))


def _launch(x, block, warps):
    x = x.contiguous()
    rows, cols = x.reshape(-1, x.shape[-1]).shape
    out = torch.empty(rows, device=x.device, dtype=x.dtype)
    _row_sum[(rows,)](x, out, cols, cols, BLOCK=block, num_warps=warps)
    return out.reshape(x.shape[:-1])


def row_sum_tiled(x):
    return _launch(x, 1024, 4)


def row_sum_whole_row_per_warp(x):
    """The whole row in one warp's registers: 256 fp32 values a thread before any arithmetic."""
    return _launch(x, ROW, 1)
