"""oracle, violating control: a formula that is close, but not the reference's."""

import math

import torch


def gelu_tanh_approx(x):
    """The tanh approximation of GELU, common in fused kernels because tanh is cheaper than erf. Off by
    up to ~5e-4 absolute: invisible at allclose(1e-2), hundreds of times the float32 reference's error."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))
