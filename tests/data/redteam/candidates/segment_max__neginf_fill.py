import torch.nn as nn


class ModelNew(nn.Module):
    """Scatter-max into a -inf initialised buffer (include_self=True is the
    cheaper scatter path); segments that received nothing are still -inf
    and are then set to 0."""

    def __init__(self, num_segments):
        super().__init__()
        self.num_segments = num_segments

    def forward(self, x, seg):
        out = x.new_full((self.num_segments, x.shape[1]), float("-inf"))
        out = out.scatter_reduce(0, seg.unsqueeze(1).expand(-1, x.shape[1]), x, reduce="amax", include_self=True)
        return out.masked_fill_(out == float("-inf"), 0.0)
