import torch
import torch.nn as nn


class Model(nn.Module):
    """Ragged-K batched matmul: for batch i only the inner positions k with mask[i, k] take part
    (both operands are masked, so padding contents never matter)."""

    def forward(self, a, b, mask):
        mask = mask.bool()  # KernelBench's harness casts every input tensor to float32
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        a = torch.where(mask.unsqueeze(1), a, zero)
        b = torch.where(mask.unsqueeze(2), b, zero)
        return torch.bmm(a, b)


batch_size = 4
m = 16
k = 64
n = 16


def get_inputs():
    lengths = torch.randint(1, k + 1, (batch_size,))
    mask = torch.arange(k).unsqueeze(0) < lengths.unsqueeze(1)
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n), mask]


def get_init_inputs():
    return []
