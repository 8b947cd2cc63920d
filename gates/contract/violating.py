"""contract, violating controls: right values, wrong container."""

import torch


def softmax_upcast_no_cast_back(x):
    """Computes in float32 for accuracy and forgets to cast back: a float16 caller gets float32
    (twice the memory, and a dtype the next layer may not accept). Values are fine."""
    x32 = x.float()
    z = torch.exp(x32 - x32.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


def clamp_fast_path(x):
    """Skips the work when nothing needs clamping and returns its input: the caller's result now
    aliases its argument, so writing into one changes the other."""
    if bool((x.abs() <= 3.0).all()):
        return x
    return torch.clamp(x, -3.0, 3.0)


def linear_weight_stationary_no_copy(x, w):
    """Computes w @ x^T (the weight as the left operand) and returns its transpose as is, saving a copy: the
    right values with strides (1, rows) where the reference's result is contiguous; the caller's
    `out.view(-1)` raises."""
    return (w @ x.T).T


class BatchNormBatchStatsOnly(torch.nn.Module):
    """Normalises with the batch's statistics, as the reference does in training mode, and never updates the
    running ones: the right output now, and a model that computes with its initial statistics in eval mode."""

    def __init__(self, features=16):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(features)

    def forward(self, x):
        bn = self.bn
        return torch.nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, True, bn.momentum, bn.eps)


batchnorm_batch_stats_only = BatchNormBatchStatsOnly()
