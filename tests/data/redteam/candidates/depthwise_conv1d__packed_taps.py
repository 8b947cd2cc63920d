import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Depthwise conv1d as a shifted multiply-add over the taps. The taps and the bias are packed once
    into one (C, K + 1) tile (what the kernel loads per channel) and the pack is rebuilt whenever the
    weight tensor changes (address, in-place version, shape, dtype or device)."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)
        self._key = None
        self._pack = None

    def _packed(self):
        w, b = self.conv.weight, self.conv.bias
        key = (w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device)
        if key != self._key:
            c, _, k = w.shape
            self._pack = torch.cat((w.detach().reshape(c, k), b.detach().reshape(c, 1)), dim=1).contiguous()
            self._key = key
        return self._pack

    def forward(self, x):
        pack = self._packed()
        k = pack.shape[1] - 1
        p = self.conv.padding[0]
        xp = F.pad(x, (p, p))
        lout = xp.shape[-1] - k + 1
        out = pack[:, k].reshape(1, -1, 1).expand(x.shape[0], -1, lout).clone()
        for j in range(k):
            out += pack[:, j].reshape(1, -1, 1) * xp[..., j:j + lout]
        return out
