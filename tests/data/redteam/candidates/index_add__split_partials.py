import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Scatter-add in two independent halves (as two workers would), each into its own zeroed partial
    histogram, then one elementwise add of the partials. Fixed split, so the order is deterministic."""

    def __init__(self, num_bins):
        super().__init__()
        self.num_bins = num_bins

    def forward(self, src, idx):
        idx = idx.long()
        half = src.shape[0] // 2
        shape = (self.num_bins, src.shape[1])
        a = torch.zeros(shape, dtype=src.dtype, device=src.device).index_add_(0, idx[:half], src[:half])
        b = torch.zeros(shape, dtype=src.dtype, device=src.device).index_add_(0, idx[half:], src[half:])
        return a + b
