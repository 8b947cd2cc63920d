import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Depthwise conv1d in 16-wide output blocks (one vector register each). When the length is not a
    multiple of 16 the last block is shifted left to end exactly at the last output (overlapping the
    previous block, which it recomputes identically) instead of running a masked remainder loop."""

    BLOCK = 16

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x):
        w = self.conv.weight
        c, _, k = w.shape
        taps = w.reshape(c, k)
        bias = self.conv.bias.reshape(1, c, 1)
        p = self.conv.padding[0]
        xp = F.pad(x, (p, p))
        lout = xp.shape[-1] - k + 1
        out = x.new_empty(x.shape[0], c, lout)
        for start in range(0, lout, self.BLOCK):
            s = max(min(start, lout - self.BLOCK), 0)
            e = min(s + self.BLOCK, lout)
            acc = bias + taps[:, 0].reshape(1, c, 1) * xp[..., s:e]
            for j in range(1, k):
                acc = acc + taps[:, j].reshape(1, c, 1) * xp[..., s + j:e + j]
            out[..., s:e] = acc
        return out
