import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Scatter-max into a -inf initialised buffer, then empty segments are
    detected by a bincount (not by the value -inf, which a real segment max
    can legitimately be) and zeroed."""

    def __init__(self, num_segments):
        super().__init__()
        self.num_segments = num_segments

    def forward(self, x, seg):
        out = x.new_full((self.num_segments, x.shape[1]), float("-inf"))
        out = out.scatter_reduce(0, seg.unsqueeze(1).expand(-1, x.shape[1]), x, reduce="amax", include_self=True)
        counts = torch.bincount(seg, minlength=self.num_segments)
        return torch.where((counts > 0).unsqueeze(1), out, torch.zeros((), dtype=x.dtype))
