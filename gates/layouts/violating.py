"""layouts, violating control: RMS norm that indexes its inputs as if they were contiguous."""

import torch

EPS = 1e-6


def rms_norm_assumes_contiguous(x, w):
    """Reads x and w from their data pointers with row-major strides, as a kernel that is handed
    `x.data_ptr()` and computes `row * n_cols + col` does. Right for contiguous tensors; reads the
    wrong elements (or a buffer's padding) for a transposed, strided or sliced view."""
    rows = x.as_strided(x.shape, _row_major(x.shape))
    weight = w.as_strided(w.shape, (1,))
    return rows * torch.rsqrt(rows.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight


def _row_major(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
