import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Matmul that opts into the reduced-precision fast path where the backend has one."""

    def __init__(self):
        super().__init__()
        torch.set_float32_matmul_precision("medium")

    def forward(self, a, b):
        return torch.matmul(a, b)
