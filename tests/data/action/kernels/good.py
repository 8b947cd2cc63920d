"""A correct row softmax, its reference and its inputs."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (4, 33), generator=gen, dtype=torch.float64) * 3).to(dtype=dtype, device=device),)


def softmax_ref(x):
    return torch.softmax(x, dim=-1)


def softmax(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)
