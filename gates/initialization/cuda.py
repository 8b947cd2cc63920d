"""initialization, CUDA controls: a Triton row-wise scale launched with a grid that covers every
element (correct) or only whole blocks (violating). The output comes from torch.empty_like, i.e. from
the caching allocator's recycled blocks."""

import torch
import triton
import triton.language as tl

BLOCK = 256


def make_inputs(seed, shape=None, dtype=torch.float32, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (1000,), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return x * 2.0 + 1.0


@triton.jit
def _affine(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0 + 1.0, mask=mask)


def affine_cdiv_grid(x):
    """grid = cdiv(n, BLOCK): every element has a program."""
    out = torch.empty_like(x)
    n = x.numel()
    _affine[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out


def affine_floor_grid(x):
    """grid = n // BLOCK: the last n % BLOCK elements are never written and keep the allocator's
    previous contents (1000 = 3 x 256 + 232)."""
    out = torch.empty_like(x)
    n = x.numel()
    _affine[(n // BLOCK,)](x, out, n, BLOCK=BLOCK)
    return out
