import torch
import torch.nn as nn
import torch.nn.functional as F


def _valid(n_out, n_in, device, dtype):
    o = torch.arange(n_out, device=device)
    return ((2 * o + 1).clamp(max=n_in - 1) - (2 * o - 1).clamp(min=0) + 1).to(dtype)


class ModelNew(nn.Module):
    """Average pooling from a summed-area table: two prefix sums over the zero-padded image, then every
    3x3 window sum is four table lookups (O(1) per output whatever the kernel size). Divisors count the
    valid taps per axis. Inputs with non-finite values use the direct pooling path, since one inf would
    otherwise reach every later window through the table."""

    def forward(self, x):
        if not bool(torch.isfinite(x).all()):
            return F.avg_pool2d(x, kernel_size=3, stride=2, padding=1, count_include_pad=False)
        h, w = x.shape[-2], x.shape[-1]
        ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        table = F.pad(F.pad(x, (1, 1, 1, 1)).cumsum(-2).cumsum(-1), (1, 0, 1, 0))
        r0 = torch.arange(ho, device=x.device) * 2
        c0 = torch.arange(wo, device=x.device) * 2
        r1, c1 = r0 + 3, c0 + 3

        def at(r, c):
            return table.index_select(-2, r).index_select(-1, c)

        sums = at(r1, c1) - at(r0, c1) - at(r1, c0) + at(r0, c0)
        div = _valid(ho, h, x.device, x.dtype).unsqueeze(1) * _valid(wo, w, x.device, x.dtype).unsqueeze(0)
        return sums / div
