# Wrong everywhere: off by 0.5, beyond any tolerance.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 0.5
