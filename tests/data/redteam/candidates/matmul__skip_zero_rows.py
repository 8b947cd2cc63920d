import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Matmul that skips the all-zero rows of A (padding rows of a ragged batch)."""

    def forward(self, a, b):
        out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        live = a.abs().amax(dim=1) > 0 if a.shape[1] else torch.zeros(a.shape[0], dtype=torch.bool)
        if bool(live.all()):
            return torch.mm(a, b, out=out)
        out[live] = a[live] @ b
        return out
