"""oracle, violating control: a formula that is close, but not the reference's."""

import importlib.util
import math
from pathlib import Path

import torch


def gelu_tanh_approx(x):
    """The tanh approximation of GELU, common in fused kernels because tanh is cheaper than erf. Off by
    up to ~5e-4 absolute: invisible at allclose(1e-2), hundreds of times the float32 reference's error."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def layer_norm_half_precision_mean(x, w, b):
    """The layer norm of correct.py:layer_norm_fused, but c2 = mean(w dy) is kept in bfloat16 (a low-precision
    accumulator for one of the backward's row sums): over one feature dx is then rstd x (w dy - bf16(w dy)),
    about 2^-9 of rstd x w dy, a thousand ulps of the terms where the exact gradient is 0."""
    correct = _sibling("correct")
    return correct._LayerNorm.apply(x, w, b, correct._fused_multiply_subtract,
                                    lambda wdy: wdy.mean(-1, keepdim=True).bfloat16().float())


class BatchNormBatchStatsAlways(torch.nn.Module):
    """BatchNorm1d by its own formula, the running statistics updated as torch updates them, but normalising
    with the batch's statistics in eval mode too: right in training mode, the mode it is built in; in eval
    mode (inference) the running statistics it keeps are never used."""

    def __init__(self, features=16):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(features)

    def forward(self, x):
        bn = self.bn
        mean, var = x.mean(0), x.var(0, unbiased=False)
        with torch.no_grad():
            bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
            bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * x.var(0, unbiased=True))
            bn.num_batches_tracked += 1
        return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias


batchnorm_batch_stats_always = BatchNormBatchStatsAlways()


def _sibling(name):
    """This folder's module `name`, loaded by path (a plain import would find another folder's correct.py)."""
    spec = importlib.util.spec_from_file_location(f"kgate_catalogue_oracle_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
