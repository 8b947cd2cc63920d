import torch
import torch.nn as nn

IGNORE = -100


class ModelNew(nn.Module):
    """Row log-sum-exp and target gather fused; only non-ignored rows are
    reduced and the mean is taken over the non-ignored tokens."""

    def __init__(self, num_classes):
        super().__init__()
        self.register_buffer("weight", torch.ones(num_classes))

    def forward(self, logits, target):
        valid = target != IGNORE
        x = logits[valid]
        t = target[valid]
        m = x.amax(-1, keepdim=True)
        nll = torch.log(torch.exp(x - m).sum(-1)) - (x.gather(1, t[:, None]) - m).squeeze(1)
        w = self.weight[t]
        return (w * nll).sum() / valid.sum().to(logits.dtype)
