import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Split-K: the inner dimension in two halves (the second takes the odd one out), two partial GEMMs
    summed in float32, then the bias."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w, b = self.linear.weight, self.linear.bias
        h = w.shape[1] // 2
        return torch.addmm(b, x[:, :h], w[:, :h].t()) + x[:, h:] @ w[:, h:].t()
