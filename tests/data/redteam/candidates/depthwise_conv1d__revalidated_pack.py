import torch
import torch.nn as nn
import torch.nn.functional as F

_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t):
    return t.detach().reshape(-1).view(_INT_OF_SIZE[t.element_size()])


class ModelNew(nn.Module):
    """Depthwise conv1d from a packed (C, K + 1) tap+bias tile. The pack is reused only while both
    parameters keep their address, in-place version, shape, strides, dtype and device AND a bitwise
    snapshot of them still matches (writes through .data do not bump the version); otherwise it is
    rebuilt."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)
        self._key = None
        self._snap = None
        self._pack = None

    def _packed(self):
        w, b = self.conv.weight, self.conv.bias
        key = tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype, t.device) for t in (w, b))
        fresh = (key == self._key and torch.equal(self._snap[0], _bits(w))
                 and torch.equal(self._snap[1], _bits(b)))
        if not fresh:
            c, _, k = w.shape
            self._pack = torch.cat((w.detach().reshape(c, k), b.detach().reshape(c, 1)), dim=1).clone()
            self._snap = (_bits(w).clone(), _bits(b).clone())
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
