# Correct: a plain PyTorch ReLU.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.clamp_min(x, 0.0)
