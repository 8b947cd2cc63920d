"""accumulation, correct controls: blocked reductions whose running total is float32.

Also holds the references and the inputs factories that the accumulation controls share."""

import torch

BLOCK = 64


def make_matrices(seed, shape=None, dtype=torch.float32, device="cpu"):
    """a (m, k) and b (k, n); shape = (m, k, n)."""
    gen = torch.Generator().manual_seed(seed)
    m, k, n = shape or (16, 512, 16)
    a = torch.randn(m, k, generator=gen, dtype=torch.float64)
    b = torch.randn(k, n, generator=gen, dtype=torch.float64)
    return a.to(dtype=dtype, device=device), b.to(dtype=dtype, device=device)


def make_rows(seed, shape=None, dtype=torch.float16, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (8, 1024), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


def matmul_reference(a, b):
    return a @ b


def rowsum_reference(x):
    return x.sum(dim=-1)


def matmul_fp32_accumulator(a, b):
    """K-blocked matmul, partial products added into a float32 accumulator (tl.dot's default)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for k0 in range(0, a.shape[1], BLOCK):
        acc += a[:, k0:k0 + BLOCK].float() @ b[k0:k0 + BLOCK].float()
    return acc.to(a.dtype)


def rowsum_fp32_accumulator(x):
    """Running sum over the row, one element at a time, in a float32 register."""
    acc = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
    for j in range(x.shape[-1]):
        acc += x[..., j].float()
    return acc.to(x.dtype)


def make_images(seed, shape=None, dtype=torch.float32, device="cpu"):
    """x (n, c, h, h) and a 3 x 3 weight (8, c, 3, 3); shape = (n, c, h)."""
    gen = torch.Generator().manual_seed(seed)
    n, c, h = shape or (2, 32, 10)
    x = torch.randn(n, c, h, h, generator=gen, dtype=torch.float64)
    w = torch.randn(8, c, 3, 3, generator=gen, dtype=torch.float64) / 10
    return x.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device)


def conv_reference(x, w):
    return torch.nn.functional.conv2d(x, w, padding=1)


def conv_fp32_accumulator(x, w):
    """The convolution as im2col and a matrix product with a float32 accumulator."""
    n, _, h, wd = x.shape
    cols = torch.nn.functional.unfold(x.float(), 3, padding=1)  # (n, c * 9, h * w)
    out = w.float().reshape(w.shape[0], -1) @ cols
    return out.to(x.dtype).reshape(n, w.shape[0], h, wd)
