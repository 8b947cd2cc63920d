"""A reference that declares its input domain by raising, as the chunked linear-recurrence kernels do
(keys L2-normalised, log-gate g <= 0): a decayed copy of the keys, out[b, t] = exp(sum_{s<=t} g[b, s]) k[b, t].

Shared by the special_values, distributions and accumulation tests of rejected probes.
"""

from __future__ import annotations

import torch


def keys_and_gates(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(4, 16, 8, generator=gen, dtype=torch.float64)
    k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    g = -torch.rand(4, 16, generator=gen, dtype=torch.float64) * 2
    return k.to(dtype=dtype, device=device), g.to(dtype=dtype, device=device)


def check_domain(k, g):
    """Raise outside the domain. NaN passes both checks (comparisons with NaN are false), as in most
    real domain checks, so NaN probes stay in the domain; +-Inf keys and +Inf gates do not."""
    if (g > 0).any():
        raise ValueError("log-gate g must be <= 0")
    if ((torch.linalg.vector_norm(k.double(), dim=-1) - 1).abs() > 1e-2).any():
        raise ValueError("keys must be L2-normalised")


def decayed_keys_reference(k, g):
    check_domain(k, g)
    return decayed_keys(k, g)


def decayed_keys(k, g):
    return torch.exp(torch.cumsum(g, dim=-1)).unsqueeze(-1) * k
