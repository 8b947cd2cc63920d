import torch
import torch.nn as nn


class Model(nn.Module):
    """Scatter-add of feature rows into bins: out[idx[i]] += src[i]."""

    def __init__(self, num_bins):
        super().__init__()
        self.num_bins = num_bins

    def forward(self, src, idx):
        idx = idx.long()  # KernelBench's harness casts every input tensor to float32
        out = torch.zeros(self.num_bins, src.shape[1], dtype=src.dtype, device=src.device)
        return out.index_add_(0, idx, src)


num_rows = 1024
features = 16
num_bins = 64


def get_inputs():
    return [torch.randn(num_rows, features), torch.randint(0, num_bins, (num_rows,))]


def get_init_inputs():
    return [num_bins]
