import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """atan2 without the libm call: octant reduction to a ratio in [0, 1] and a degree-9 odd minimax
    polynomial for atan on that interval (Abramowitz & Stegun 4.4.47), then reflection into the right
    quadrant with sign bits, so signed zeros and infinities come out as atan2 gives them. The magnitude
    uses torch.hypot."""

    C = (0.9998660, -0.3302995, 0.1801410, -0.0851330, 0.0208351)

    def forward(self, re, im):
        ar, ai = re.abs(), im.abs()
        mx, mn = torch.maximum(ar, ai), torch.minimum(ar, ai)
        both_inf = torch.isinf(ar) & torch.isinf(ai)
        t = torch.where(mx == 0, torch.zeros_like(mx), mn / mx)
        t = torch.where(both_inf, torch.ones_like(mx), t)
        t2 = t * t
        p = self.C[4]
        for c in reversed(self.C[:4]):
            p = p * t2 + c
        r = p * t
        r = torch.where(ai > ar, math.pi / 2 - r, r)
        r = torch.where(torch.signbit(re), math.pi - r, r)
        r = torch.where(torch.signbit(im), -r, r)
        return torch.stack((torch.hypot(re, im), r), dim=0)
