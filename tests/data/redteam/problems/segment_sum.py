import torch
import torch.nn as nn


class Model(nn.Module):
    """Scatter-add rows of `values` into `num_segments` segments named by int64 `index` (repeats add up)."""

    def __init__(self, num_segments):
        super().__init__()
        self.num_segments = num_segments

    def forward(self, values, index):
        index = index.long()  # KernelBench's harness casts every input tensor to float32
        out = torch.zeros(self.num_segments, values.shape[1], dtype=values.dtype, device=values.device)
        return out.index_add_(0, index, values)


num_segments = 64
count = 32
features = 8


def get_inputs():
    return [torch.randn(count, features), torch.randperm(num_segments)[:count]]


def get_init_inputs():
    return [num_segments]
