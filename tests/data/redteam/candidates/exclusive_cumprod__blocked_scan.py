import torch
import torch.nn as nn

BLOCK = 48


class ModelNew(nn.Module):
    """Two-level exclusive scan: the shifted row is split into 48-wide blocks (ragged last block), each
    block does a local inclusive cumprod, the block totals are scanned exclusively into carries, and
    every block is multiplied by its carry. Products are carried at double width for float32 input (the
    accumulation type the CPU scan uses), so long products neither underflow nor overflow early."""

    def forward(self, x):
        acc = torch.float64 if x.dtype in (torch.float32, torch.float64) else torch.float32
        xa = x.to(acc)
        shifted = torch.cat([torch.ones_like(xa[..., :1]), xa[..., :-1]], dim=-1)
        local = [torch.cumprod(b, dim=-1) for b in shifted.split(BLOCK, dim=-1)]
        totals = torch.stack([blk[..., -1] for blk in local], dim=-1)
        carries = torch.cumprod(torch.cat([torch.ones_like(totals[..., :1]), totals[..., :-1]], dim=-1), dim=-1)
        out = torch.cat([blk * carries[..., i:i + 1] for i, blk in enumerate(local)], dim=-1)
        return out.to(x.dtype)
