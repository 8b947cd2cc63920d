"""bounds, CUDA controls: a Triton kernel whose store is masked (correct) or not (violating)."""

import torch
import triton
import triton.language as tl

BLOCK = 128


def make_inputs(seed, shape=None, dtype=torch.float32, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (1000,), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return x * 0.5


@triton.jit
def _halve(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASK_STORE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if MASK_STORE:
        tl.store(out_ptr + offs, x * 0.5, mask=mask)
    else:
        tl.store(out_ptr + offs, x * 0.5)


def halve_masked(x):
    out = torch.empty_like(x)
    n = x.numel()
    _halve[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, MASK_STORE=True)
    return out


def halve_unmasked_store(x):
    """Masks the load but not the store: the last program writes BLOCK - n % BLOCK zeros past the end of
    `out` (24 elements for n = 1000). The caching allocator's 512-byte rounding usually hides this
    from memcheck and from every value check; the guard band after `out` does not."""
    out = torch.empty_like(x)
    n = x.numel()
    _halve[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, MASK_STORE=False)
    return out
