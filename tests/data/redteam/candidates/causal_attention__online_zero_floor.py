import math

import torch
import torch.nn as nn

BLOCK = 16


class ModelNew(nn.Module):
    """Flash-style causal attention: keys and values streamed in blocks of 16 with an online softmax
    (running max, running denominator, rescaled accumulator). The running max starts at 0, which keeps
    every exponent argument finite and avoids (-inf) - (-inf) on rows whose first blocks are masked."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        L, S = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        m = torch.zeros(*q.shape[:-1], 1, dtype=q.dtype, device=q.device)
        denom = torch.zeros_like(m)
        acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        rows = torch.arange(L, device=q.device).unsqueeze(-1)
        for j0 in range(0, S, BLOCK):
            kb, vb = k[..., j0:j0 + BLOCK, :], v[..., j0:j0 + BLOCK, :]
            s = (q @ kb.transpose(-1, -2)) * scale
            cols = torch.arange(j0, j0 + kb.shape[-2], device=q.device).unsqueeze(0)
            s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            denom = denom * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + p @ vb
            m = m_new
        return acc / denom
