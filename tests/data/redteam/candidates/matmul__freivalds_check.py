import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Matrix product with a self-check (Freivalds): A @ (B @ r) against C @ r for a random vector r on every
    call; a product that fails the check is computed again the slow way."""

    def forward(self, a, b):
        c = torch.matmul(a, b)
        r = torch.randn(b.shape[-1], 1, dtype=a.dtype, device=a.device)
        if not torch.allclose(a @ (b @ r), c @ r, rtol=1e-3, atol=1e-3):
            c = (a.double() @ b.double()).to(a.dtype)
        return c
