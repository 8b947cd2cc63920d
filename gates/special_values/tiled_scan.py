"""The block pieces of a tiled row scan, shared by the spread-mode controls."""

import torch


def scan_blocks(x, block=16):
    nb = -(-x.shape[-1] // block)
    padded = torch.nn.functional.pad(x, (0, nb * block - x.shape[-1]))
    return padded.reshape(*x.shape[:-1], nb, block), torch.triu(torch.ones(block, block, dtype=x.dtype,
                                                                              device=x.device))


def scan_finish(local, n):
    if local.shape[-2] == 0:
        return local.reshape(*local.shape[:-2], 0)
    carry = torch.cumsum(local[..., -1], dim=-1) - local[..., -1]  # exclusive prefix of block totals
    nb, block = local.shape[-2:]
    return (local + carry[..., None]).reshape(*local.shape[:-2], nb * block)[..., :n]
