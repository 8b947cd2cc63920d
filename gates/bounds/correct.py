"""bounds, correct controls: kernels that touch exactly the elements of their tensors. Also holds the
references and inputs factory."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 40), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


def total_reference(x):
    return x.sum()


def total(x):
    return x.sum()


def halve_reference(x):
    """In place (the manifest declares `inplace: [0]`)."""
    return x.mul_(0.5)


def halve_inplace(x):
    return x.mul_(0.5)


def halve_reference_new(x):
    return x * 0.5


def halve_into_new(x):
    """Halves x into a new dense tensor, each element at the new tensor's own strides, whatever x's are."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(x * 0.5)
    return out
