"""determinism, violating control: the result depends on the order partial sums arrive in."""

import torch

SPLIT = 16


def rowsum_split_any_order(x):
    """Partial sums added in whatever order the blocks finish, as float atomicAdd does on a GPU: the
    rounding changes from call to call. Each result is within the oracle bound; no two need agree."""
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    blocks = list(torch.arange(x.shape[-1], device=x.device).split(SPLIT))
    for i in torch.randperm(len(blocks)).tolist():
        total = total + x[..., blocks[i]].sum(dim=-1)
    return total
