import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean over the valid (mask True) positions of each sequence; padding positions are ignored
    whatever they hold. A sequence with no valid position gives 0/0."""

    def forward(self, x, mask):
        mask = mask.bool()  # KernelBench's harness casts every input tensor to float32
        m = mask.unsqueeze(-1)
        total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
        count = mask.sum(dim=1, keepdim=True).to(x.dtype)
        return total / count


batch_size = 8
seq_len = 32
dim = 16


def get_inputs():
    lengths = torch.randint(1, seq_len + 1, (batch_size,))
    mask = torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(1)
    return [torch.randn(batch_size, seq_len, dim), mask]


def get_init_inputs():
    return []
