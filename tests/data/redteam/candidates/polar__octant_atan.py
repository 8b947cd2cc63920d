import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """atan2 by octant reduction, as GPU math libraries do: atan of min/max in [0, 1], then reflected
    into the right octant (pi/2 - r when |im| > |re|, pi - r for re < 0, negated for im < 0). Both
    infinite and both zero are handled explicitly. The magnitude uses torch.hypot."""

    def forward(self, re, im):
        ar, ai = re.abs(), im.abs()
        mx, mn = torch.maximum(ar, ai), torch.minimum(ar, ai)
        both_inf = torch.isinf(ar) & torch.isinf(ai)
        ratio = torch.where(mx == 0, torch.zeros_like(mx), mn / mx)
        ratio = torch.where(both_inf, torch.ones_like(mx), ratio)
        r = torch.atan(ratio)
        r = torch.where(ai > ar, math.pi / 2 - r, r)
        r = torch.where(re < 0, math.pi - r, r)
        r = torch.where(im < 0, -r, r)
        return torch.stack((torch.hypot(re, im), r), dim=0)
