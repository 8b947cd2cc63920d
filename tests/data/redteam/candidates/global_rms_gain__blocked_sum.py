import torch
import torch.nn as nn

BLOCK = 4096


class ModelNew(nn.Module):
    """Blocked at every size: float32 sums of squares per block of BLOCK products, the block sums added in float32,
    then one division by the element count; a ragged last block zero-padded."""

    def __init__(self, rows, cols):
        super().__init__()
        self.gain = nn.Parameter(1.0 + 0.5 * torch.randn(rows, cols))

    def forward(self, x):
        y = self.gain * x
        flat = y.reshape(-1)
        pad = (-flat.numel()) % BLOCK
        blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, BLOCK)
        return y / (blocks.pow(2).sum(dim=1).sum() / flat.numel()).sqrt()
