import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """3x3 / stride 2 / pad 1 max pooling as two 1-D passes (max over 3 rows, then over 3 columns) on a
    -inf padded input: 6 comparisons per output instead of 9, exact since max is associative. The output
    follows the input's memory format, as the reference's does."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        xp = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
        rows = xp.unfold(-2, 3, 2).amax(-1)
        out = rows.unfold(-1, 3, 2).amax(-1)
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            return out.contiguous(memory_format=torch.channels_last)
        return out.contiguous()
