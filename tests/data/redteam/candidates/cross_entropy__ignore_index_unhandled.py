import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Cross-entropy as logsumexp(logits) - logits[target], averaged over the batch."""

    def forward(self, logits, targets):
        targets = targets.long()
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
        return (lse - picked).mean()
