import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Cross-entropy whose target logits are fetched with one flat gather: row * num_classes + target into
    the logits' buffer."""

    def forward(self, logits, targets):
        targets = targets.long()
        rows, classes = logits.shape
        buf = torch.empty(0, dtype=logits.dtype, device=logits.device).set_(
            logits.untyped_storage(), 0, (rows * classes,))
        flat = torch.arange(rows, device=logits.device) * classes + targets
        picked = buf[flat]
        return (torch.logsumexp(logits, dim=-1) - picked).mean()
