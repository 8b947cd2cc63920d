import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Computes C^T = B^T A^T (B's columns stream contiguously) and hands back C as its transpose."""

    def forward(self, a, b):
        ct = torch.mm(b.t(), a.t())
        return ct.t()
