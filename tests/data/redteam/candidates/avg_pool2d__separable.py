import torch
import torch.nn as nn
import torch.nn.functional as F


def _valid(n_out, n_in, device, dtype):
    o = torch.arange(n_out, device=device)
    return ((2 * o + 1).clamp(max=n_in - 1) - (2 * o - 1).clamp(min=0) + 1).to(dtype)


class ModelNew(nn.Module):
    """Separable average pooling: three strided column slices of the zero-padded input summed, then
    three strided row slices of that, so a 3x3 window costs 4 adds instead of 8; the divisor is the
    exact count of valid taps per axis (min/max of the window against the image edges), odd sizes
    included."""

    def forward(self, x):
        h, w = x.shape[-2], x.shape[-1]
        ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        xp = F.pad(x, (1, 1, 1, 1))
        cs = xp[..., 0:2 * wo - 1:2] + xp[..., 1:2 * wo:2] + xp[..., 2:2 * wo + 1:2]
        s = cs[..., 0:2 * ho - 1:2, :] + cs[..., 1:2 * ho:2, :] + cs[..., 2:2 * ho + 1:2, :]
        div = _valid(ho, h, x.device, x.dtype).unsqueeze(1) * _valid(wo, w, x.device, x.dtype).unsqueeze(0)
        return s / div
