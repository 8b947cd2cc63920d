import torch.nn as nn


class ModelNew(nn.Module):
    """Matmul with a wide path for 128-byte aligned operands and a split-K path (a third and two thirds of K, summed) for
    the others."""

    def forward(self, a, b):
        if a.data_ptr() % 128 == 0:
            return a @ b
        k = a.shape[1] // 3
        return a[:, :k] @ b[:k] + a[:, k:] @ b[k:]
