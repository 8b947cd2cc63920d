import torch
import torch.nn as nn


def _blocked_softmax(x, block):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype, device=x.device)
    s = torch.zeros_like(m)
    for j in range(0, n, block):
        blk = x[..., j:j + block]
        m_new = torch.maximum(m, blk.amax(dim=-1, keepdim=True))
        s = s * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / s


class ModelNew(nn.Module):
    """Online softmax whose block size is autotuned on the first calls (each candidate block is timed on
    live data; the fastest one is kept)."""

    configs = (16, 32, 8)

    def __init__(self):
        super().__init__()
        self.timings = {}
        self.best = None

    def forward(self, x):
        import time

        if self.best is not None:
            return _blocked_softmax(x, self.best)
        block = self.configs[len(self.timings) % len(self.configs)]
        t0 = time.perf_counter()
        out = _blocked_softmax(x, block)
        self.timings[block] = time.perf_counter() - t0
        if len(self.timings) == len(self.configs):
            self.best = min(self.timings, key=self.timings.get)
        return out
