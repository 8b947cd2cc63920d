"""layouts, correct control: RMS norm that makes its inputs contiguous before indexing them flat.

Also holds the reference and the inputs factory that the layouts controls share."""

import torch

EPS = 1e-6


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """x (rows, cols) and a weight (cols,)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape or (8, 96)
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    w = 1 + 0.1 * torch.randn(cols, generator=gen, dtype=torch.float64)
    return x.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device)


def reference(x, w):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * w


def rms_norm(x, w):
    """Same arithmetic as the violating control, on contiguous copies: any layout works."""
    x, w = x.contiguous(), w.contiguous()
    return _rms_norm_rowmajor(x, w)


def _rms_norm_rowmajor(x, w):
    rows = x.as_strided(x.shape, _row_major(x.shape))
    weight = w.as_strided(w.shape, (1,))
    return rows * torch.rsqrt(rows.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight


def _row_major(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def make_pair(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    n = (shape or (24,))[0]
    a, b = (torch.randn(n, n, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device) for _ in range(2))
    return a, b


def matmul_reference(a, b):
    return a @ b


def matmul_blocked(a, b):
    """a @ b in column blocks of 8 (whatever memory the operands share)."""
    return torch.cat([a @ b[:, j:j + 8] for j in range(0, b.shape[1], 8)] or [a @ b], dim=1)


def make_row_batch(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (4, 2, 8, 8), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


def relu_reference(x):
    return torch.relu(x)


def relu_fresh(x):
    return x.clamp(min=0)
