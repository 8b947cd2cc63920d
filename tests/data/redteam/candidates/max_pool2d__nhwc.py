import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """3x3 / stride 2 / pad 1 max pooling computed in NHWC (channels innermost, so every window read is
    a contiguous vector of channels), separable: rows, then columns."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        if x.dim() == 3:
            return self.forward(x.unsqueeze(0)).squeeze(0)
        xt = x.permute(0, 2, 3, 1)
        xp = F.pad(xt, (0, 0, 1, 1, 1, 1), value=float("-inf"))
        rows = xp.unfold(1, 3, 2).amax(-1)
        cols = rows.unfold(2, 3, 2).amax(-1)
        return cols.permute(0, 3, 1, 2)
