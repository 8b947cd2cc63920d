"""contract, violating controls: right values, wrong container."""

from pathlib import Path

import torch

from kgate.loading import load_module_from_file


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


class FusedNormBatchStatsOnly(torch.nn.Module):
    """The same, in a fused layer of the kernel's own that holds its BatchNorm under other names (`norm.inner`
    where the reference's is `bn`): the running statistics it never updates stand for the reference's all the
    same (kgate pairs them by order and value as built)."""

    def __init__(self, features=16):
        super().__init__()
        self.norm = torch.nn.Module()
        self.norm.inner = torch.nn.BatchNorm1d(features)

    def forward(self, x):
        bn = self.norm.inner
        return torch.nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, True, bn.momentum, bn.eps)


fused_norm_batch_stats_only = FusedNormBatchStatsOnly()


def _correct():
    """This folder's correct.py, loaded by path (a plain import would find another folder's)."""
    return load_module_from_file(Path(__file__).resolve().parent / "correct.py", "catalogue")


class PositionTableSpanView(_correct().PositionTable):
    """A span fast path: a single sequence of consecutive positions p, ..., p + L - 1 is one slab of the table,
    returned as a slice of it (a view of the parameter): a caller that writes to the output writes the table."""

    def forward(self, ids):
        row = ids[0]
        p = int(row[0])
        if ids.shape[0] == 1 and torch.equal(row, torch.arange(p, p + row.numel(), device=row.device)):
            return self.table[p:p + row.numel()].unsqueeze(0)
        return torch.nn.functional.embedding(ids, self.table)


class ScaledLinearFoldsOnce(_correct().ScaledLinear):
    """The gain folded into the weight in place at the first call (the weight scaled, the gain set to 1): every
    output right, but the module's parameters are not what was loaded into it."""

    def forward(self, x):
        if not getattr(self, "_folded", False):
            with torch.no_grad():
                self.weight.mul_(self.gain[:, None])
                self.gain.fill_(1.0)
            self._folded = True
        return (x @ self.weight.t()) * self.gain


position_table_span_view = PositionTableSpanView()
scaled_linear_folds_once = ScaledLinearFoldsOnce()
