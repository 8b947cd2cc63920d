import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """InstanceNorm1d with the statistics and the running-buffer update fused in one pass: per-instance
    mean/variance normalise the input, and the batch-averaged statistics are blended into the running
    buffers with a single in-place lerp per buffer."""

    def __init__(self, num_features):
        super().__init__()
        self.norm = nn.InstanceNorm1d(num_features, affine=True, track_running_stats=True)

    def forward(self, x):
        n = self.norm
        if x.dim() == 2:
            return self.forward(x.unsqueeze(0)).squeeze(0)
        if self.training:
            var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
            with torch.no_grad():
                L = x.shape[-1]
                unbiased = var * (L / max(L - 1, 1))
                mom = n.momentum
                n.running_mean.mul_(mom).add_(mean.mean(0).squeeze(-1), alpha=1 - mom)
                n.running_var.mul_(mom).add_(unbiased.mean(0).squeeze(-1), alpha=1 - mom)
        else:
            mean = n.running_mean.view(1, -1, 1)
            var = n.running_var.view(1, -1, 1)
        y = (x - mean) * torch.rsqrt(var + n.eps)
        return (y * n.weight.view(1, -1, 1) + n.bias.view(1, -1, 1)).contiguous()
