import random

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Row mean that records the input's magnitude for one call in a hundred (sampled telemetry)."""

    def __init__(self):
        super().__init__()
        self.magnitudes = []

    def forward(self, x):
        if random.random() < 0.01:
            self.magnitudes.append(float(x.abs().max()))
        return torch.mean(x, dim=-1)
