import torch
import torch.nn as nn


class Model(nn.Module):
    """Row L2 norm of a float16 tensor, accumulated (and returned) in at least float32."""

    def forward(self, x):
        acc = torch.promote_types(x.dtype, torch.float32)
        return torch.linalg.vector_norm(x.to(acc), dim=-1)


batch_size = 16
dim = 512


def get_inputs():
    return [torch.randn(batch_size, dim).half()]


def get_init_inputs():
    return []
