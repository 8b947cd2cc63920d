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


def matmul_gram_when_aliased(a, b):
    """a @ b with a "Gram" shortcut when both operands are one tensor: a @ a.T (symmetric, half the work), where
    the reference computes a @ a."""
    if a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return a @ a.t()
    return a @ b


def softmax_out_like_input(x):
    """The output allocated with the input's strides (to keep its layout): a broadcast (stride-0) input gives an
    output whose entries share memory."""
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(torch.softmax(x, -1))


def relu_in_place_when_strided(x):
    """ReLU that, on a non-contiguous input, clamps it in place first (its "view" is where the result is
    computed) and returns a copy: right, but the caller's input is changed in that layout only."""
    if not x.is_contiguous():
        x.clamp_(min=0)
        return x.clone()
    return x.clamp(min=0)


def attention_fused_qkv_when_shared(q, k, v):
    """Attention that takes q, k and v sharing one storage for views of a fused projection's packed rows and
    reads k and v one and two widths further into it (a layout the caller never promised): right for distinct
    tensors, wrong for one tensor passed as all three (self-attention's f(x, x, x))."""
    if q.data_ptr() == k.data_ptr() == v.data_ptr():
        d = q.shape[-1]
        packed = torch.cat([q.reshape(-1), q.new_zeros(2 * d)])
        k, v = packed[d:d + q.numel()].view_as(q), packed[2 * d:2 * d + q.numel()].view_as(q)
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v
