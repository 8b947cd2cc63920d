import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean-pool node features per graph (global mean pooling): batch[i] is the graph of row i; graphs
    with no rows get zeros."""

    def __init__(self, num_segments):
        super().__init__()
        self.num_segments = num_segments

    def forward(self, x, batch):
        batch = batch.long()  # KernelBench's harness casts every input tensor to float32
        total = x.new_zeros(self.num_segments, x.shape[1]).index_add_(0, batch, x)
        count = torch.bincount(batch, minlength=self.num_segments).clamp(min=1).to(x.dtype)
        return total / count.unsqueeze(1)


num_rows = 512
dim = 16
num_segments = 32


def get_inputs():
    batch = torch.sort(torch.randint(0, num_segments, (num_rows,))).values
    return [torch.randn(num_rows, dim), batch]


def get_init_inputs():
    return [num_segments]
