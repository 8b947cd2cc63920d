import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: two-pass log-softmax, x - m - log(sum(exp(x - m))), with the shift zeroed where the row max is
    infinite (as torch.logsumexp does), so +-inf rows give the reference's inf/NaN."""

    def forward(self, x):
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        lse = torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True)) + m
        return x - lse
