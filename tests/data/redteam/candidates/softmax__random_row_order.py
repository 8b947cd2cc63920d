import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Row softmax with the rows handed out in a shuffled order, so that long and short rows spread evenly over
    the workers (each row's result does not depend on the order)."""

    def forward(self, x):
        order = torch.randperm(x.shape[0], device=x.device)
        out = torch.empty_like(x)
        out[order] = torch.softmax(x[order], dim=-1)
        return out
