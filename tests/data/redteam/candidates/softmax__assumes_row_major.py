import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Softmax that walks the input as one flat row-major buffer (one pointer, no stride arithmetic)."""

    def forward(self, x):
        flat = x.as_strided((x.numel(),), (1,))
        rows = flat.reshape(-1, x.shape[-1])
        m = rows.amax(dim=-1, keepdim=True)
        e = torch.exp(rows - m)
        return (e / e.sum(dim=-1, keepdim=True)).reshape(x.shape)
