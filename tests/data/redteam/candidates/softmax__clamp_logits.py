import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Softmax with the logits clamped first, so that exp can never overflow."""

    def forward(self, x):
        x = x.clamp(-1e4, 1e4)
        m = x.amax(dim=-1, keepdim=True)
        e = torch.exp(x - m)
        return e / e.sum(dim=-1, keepdim=True)
