"""accumulation, violating controls: reductions whose running total is kept in float16."""

import torch

BLOCK = 64


def matmul_fp16_accumulator(a, b):
    """K-blocked matmul whose accumulator is float16 (`tl.dot(..., out_dtype=tl.float16)` or an
    `acc = tl.zeros(..., tl.float16)`), although the reference accumulates float32 inputs in float32."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16, device=a.device)
    for k0 in range(0, a.shape[1], BLOCK):
        acc += (a[:, k0:k0 + BLOCK] @ b[k0:k0 + BLOCK]).to(torch.float16)
    return acc.to(a.dtype)


def rowsum_fp16_accumulator(x):
    """Row sum of float16 inputs with a float16 running total, one element at a time. On zero-mean
    inputs the total stays small and within the oracle bound; on same-sign inputs it stalls once its
    spacing exceeds the addends, where the reference's float32 accumulator does not."""
    acc = torch.zeros(x.shape[:-1], dtype=torch.float16, device=x.device)
    for j in range(x.shape[-1]):
        acc += x[..., j]
    return acc.to(x.dtype)


def conv_fp16_accumulator(x, w):
    """A 3 x 3 convolution as im2col and a running float16 sum over channels x window: the half-precision
    accumulator of a hand-written direct convolution."""
    n, _, h, wd = x.shape
    cols = torch.nn.functional.unfold(x, 3, padding=1)  # (n, c * 9, h * w)
    flat = w.reshape(w.shape[0], -1)
    acc = torch.zeros(n, w.shape[0], cols.shape[-1], dtype=torch.float16, device=x.device)
    for j in range(flat.shape[1]):
        acc += (flat[None, :, j, None] * cols[:, None, j, :]).to(torch.float16)
    return acc.to(x.dtype).reshape(n, w.shape[0], h, wd)
