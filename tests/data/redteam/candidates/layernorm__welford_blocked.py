import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: LayerNorm whose statistics come from blocks of 16 columns merged with Chan's parallel Welford
    update (count, mean, M2), then the affine transform."""

    BLOCK = 16

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        n = x.shape[-1]
        count = 0
        mean = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)
        m2 = torch.zeros_like(mean)
        for j in range(0, n, self.BLOCK):
            blk = x[..., j:j + self.BLOCK]
            nb = blk.shape[-1]
            bmean = blk.mean(dim=-1, keepdim=True)
            bm2 = ((blk - bmean) ** 2).sum(dim=-1, keepdim=True)
            delta = bmean - mean
            total = count + nb
            mean = mean + delta * (nb / total)
            m2 = m2 + bm2 + delta * delta * (count * nb / total)
            count = total
        var = m2 / n
        return (x - mean) * torch.rsqrt(var + self.norm.eps) * self.norm.weight + self.norm.bias
