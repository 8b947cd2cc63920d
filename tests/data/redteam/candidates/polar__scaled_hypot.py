import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Branch-light polar conversion. Magnitude: max * sqrt(1 + (min/max)^2), which never overflows or
    underflows in the squares, with an infinite component giving +inf even beside a NaN (as hypot does).
    Angle: octant reduction (atan of min/max), reflected with sign bits so that signed zeros land on
    the same +-0 / +-pi as atan2; both-zero and both-infinite pairs are handled explicitly."""

    def forward(self, re, im):
        ar, ai = re.abs(), im.abs()
        mx, mn = torch.maximum(ar, ai), torch.minimum(ar, ai)
        zero = torch.zeros_like(mx)
        both_inf = torch.isinf(ar) & torch.isinf(ai)
        ratio = torch.where(mx == 0, zero, mn / mx)
        ratio = torch.where(both_inf, torch.ones_like(mx), ratio)
        mag = mx * torch.sqrt(1 + ratio * ratio)
        mag = torch.where(torch.isinf(ar) | torch.isinf(ai), torch.full_like(mx, math.inf), mag)
        r = torch.atan(ratio)
        r = torch.where(ai > ar, math.pi / 2 - r, r)
        r = torch.where(torch.signbit(re), math.pi - r, r)
        r = torch.where(torch.signbit(im), -r, r)
        return torch.stack((mag, r), dim=0)
