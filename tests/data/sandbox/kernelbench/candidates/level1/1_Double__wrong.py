# Wrong everywhere: triples instead of doubling.
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 3
