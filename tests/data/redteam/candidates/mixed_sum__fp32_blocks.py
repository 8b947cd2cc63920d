import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: float16 activations summed in float32 blocks of 64 columns, the blocks' total in float32."""

    SPLIT = 64

    def forward(self, x):
        h = x.to(torch.float16)
        acc = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
        for j in range(0, h.shape[-1], self.SPLIT):
            acc = acc + h[..., j:j + self.SPLIT].float().sum(dim=-1)
        return acc
