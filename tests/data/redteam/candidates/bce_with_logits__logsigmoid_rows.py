import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """BCE-with-logits as (1 - y) * x - logsigmoid(x), reduced in two levels (per-row sums, then the sum
    of the row sums divided by the element count) the way a row-per-program kernel would."""

    def forward(self, logits, targets):
        loss = (1 - targets) * logits - F.logsigmoid(logits)
        rows = loss.reshape(-1, loss.shape[-1]).sum(dim=-1)
        return rows.sum() / loss.numel()
