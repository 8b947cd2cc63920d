import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Drawdown with a chunked scan for long series: rows up to 4096 are scanned in one block; longer
    rows are scanned in 2048-wide chunks (one block each) and every chunk folds in the running maximum
    carried from the chunk before it."""

    CHUNK = 2048
    SINGLE = 4096

    def forward(self, x):
        n = x.shape[-1]
        if n <= self.SINGLE:
            run = torch.cummax(x, dim=-1).values
        else:
            parts, carry = [], None
            for chunk in x.split(self.CHUNK, dim=-1):
                r = torch.cummax(chunk, dim=-1).values
                if carry is not None:
                    r = torch.where(carry > r, carry, r)
                parts.append(r)
                carry = r[..., -1:]
            run = torch.cat(parts, dim=-1)
        return run - x
