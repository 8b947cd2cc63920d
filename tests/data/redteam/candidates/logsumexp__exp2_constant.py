import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """logsumexp through exp2/log2 (the fast hardware instructions), with the usual max shift."""

    LOG2E = 1.4427
    LN2 = 0.6931

    def forward(self, x):
        m = x.amax(dim=-1, keepdim=True)
        s = torch.exp2((x - m) * self.LOG2E).sum(dim=-1)
        return m.squeeze(-1) + torch.log2(s) * self.LN2
