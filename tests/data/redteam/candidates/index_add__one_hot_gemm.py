import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Scatter-add as a dense GEMM: one_hot(idx)^T @ src. No atomics, fully deterministic, and it maps
    onto the matrix units."""

    def __init__(self, num_bins):
        super().__init__()
        self.num_bins = num_bins

    def forward(self, src, idx):
        idx = idx.long()
        onehot = F.one_hot(idx, self.num_bins).to(src.dtype)
        return onehot.t() @ src
