import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """BatchNorm2d fused into one statistics pass, the running statistics updated as torch updates them
    (momentum, the unbiased variance, the batch counter); in eval mode one multiply-add per element from the
    running statistics."""

    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        bn = self.bn
        if self.training:
            var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False)
            n = x.numel() // x.shape[1]
            with torch.no_grad():
                if n > 0:  # an empty batch leaves the running statistics as they are (and is counted, as torch does)
                    bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
                    bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * n / (n - 1))
                bn.num_batches_tracked += 1
        else:
            mean, var = bn.running_mean, bn.running_var
        scale = bn.weight * torch.rsqrt(var + bn.eps)
        shift = bn.bias - mean * scale
        return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
