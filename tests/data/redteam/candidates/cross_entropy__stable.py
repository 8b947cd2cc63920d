import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Max-shifted logsumexp minus the target logit, averaged over the targets that are not ignore_index
    (-100), as F.cross_entropy does; the shift is zeroed where a row's max is infinite (torch.logsumexp's
    guard) and a batch of ignored targets gives NaN (0 / 0)."""

    IGNORE = -100

    def forward(self, logits, targets):
        targets = targets.long()
        m = logits.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        lse = (torch.log(torch.exp(logits - m).sum(dim=-1, keepdim=True)) + m).squeeze(1)
        keep = targets != self.IGNORE
        safe = torch.where(keep, targets, torch.zeros_like(targets))
        picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1)
        losses = torch.where(keep, lse - picked, torch.zeros_like(lse))
        return losses.sum() / keep.sum().to(logits.dtype)
