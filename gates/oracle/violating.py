"""oracle, violating control: a formula that is close, but not the reference's."""

import math
from pathlib import Path

import torch

from kgate.loading import load_module_from_file


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


def _catalogue(folder, name):
    """The catalogue's module gates/FOLDER/NAME.py, loaded by path (a plain import would find another folder's)."""
    return load_module_from_file(Path(__file__).resolve().parent.parent / folder / f"{name}.py", "catalogue")


class BatchNormBatchStatsAlways(_catalogue("contract", "correct").BatchNormOwnFormula):
    """The contract catalogue's own-formula BatchNorm1d (running statistics updated as torch updates them) with
    its eval branch never taken: the batch's statistics in eval mode too. Right in training mode, the mode it
    is built in; in eval mode (inference) the running statistics it keeps are never used."""

    def forward(self, x):
        mode, self.training = self.training, True
        try:
            return super().forward(x)
        finally:
            self.training = mode


batchnorm_batch_stats_always = BatchNormBatchStatsAlways()


class BatchNormEvalShiftUnscaled(_catalogue("oracle", "correct").BatchNormBothModes):
    """Eval mode as one multiply-add per element, but its shift subtracts the running mean times the weight, not
    times the scale (weight / sqrt(running variance + eps)): right while the running mean is 0, as built."""

    def forward(self, x):
        bn = self.bn
        if self.training:
            return super().forward(x)
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        return x * scale + (bn.bias - bn.running_mean * bn.weight)


class BatchNormEvalFoldKept(_catalogue("oracle", "correct").BatchNormBothModes):
    """Eval mode's scale and shift folded at the first eval-mode call and kept for every later one (an inference
    fold made once): stale as soon as the weights or the running statistics change."""

    def forward(self, x):
        bn = self.bn
        if self.training:
            return super().forward(x)
        if getattr(self, "_fold", None) is None:
            scale = bn.weight.detach() * torch.rsqrt(bn.running_var + bn.eps)
            self._fold = (scale, bn.bias.detach() - bn.running_mean * scale)
        scale, shift = self._fold
        return x * scale + shift


batchnorm_eval_shift_unscaled = BatchNormEvalShiftUnscaled()
batchnorm_eval_fold_kept = BatchNormEvalFoldKept()


def _sibling(name):
    """This folder's module `name`, loaded by path (a plain import would find another folder's correct.py)."""
    return _catalogue("oracle", name)


class RunningStandardizerPooled(_catalogue("oracle", "correct").RunningStandardizer):
    """The running variance merged as the count-weighted mean of the two variances, without the term of the
    means' difference (delta^2 count n / total): right on the first training call, whose prior count is 1e-4,
    and off once a batch with another mean is merged into statistics that already count."""

    def forward(self, x):
        if self.training and x.shape[0] > 0:
            with torch.no_grad():
                batch_var, batch_mean = torch.var_mean(x, dim=0, correction=0)
                n = x.shape[0]
                total = self.count + n
                self.mean.add_((batch_mean - self.mean) * n / total)
                self.var.copy_((self.var * self.count + batch_var * n) / total)
                self.count.copy_(total)
        return (x - self.mean) / torch.sqrt(self.var + self.eps)


running_standardizer_pooled = RunningStandardizerPooled()


class BatchNormEvalFoldVersionOnly(_catalogue("oracle", "correct").BatchNormBothModes):
    """Eval mode's scale and shift folded once and kept while the weights' and running statistics' addresses and
    version counters are unchanged. A training-mode call updates the running statistics inside torch's batch_norm
    without advancing their version (the op's schema does not declare them written): after training mode, eval,
    training, eval, the fold is stale."""

    def forward(self, x):
        bn = self.bn
        if self.training:
            return super().forward(x)
        key = tuple((t.data_ptr(), t._version) for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var))
        if getattr(self, "_fold", (None,))[0] != key:
            with torch.no_grad():
                scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
                self._fold = (key, scale, bn.bias - bn.running_mean * scale)
        _, scale, shift = self._fold
        return x * scale + shift


batchnorm_eval_fold_version_only = BatchNormEvalFoldVersionOnly()


class CumulativeSumStreamingInEval(_catalogue("oracle", "correct").CumulativeSum):
    """The running sum along dimension 0, which in eval mode continues from the last call's total: inference over
    a stream cut into chunks, as if every eval-mode call were the next chunk of one sequence. The first eval-mode
    call is right, every later one is off by the totals before it."""

    def forward(self, x):
        out = torch.cumsum(x, dim=0)
        if self.training:
            return out
        carried = getattr(self, "_carry", None)
        if carried is not None and carried.shape == out.shape[1:]:
            out = out + carried
        self._carry = out[-1].detach().clone() if out.shape[0] else carried
        return out


cumulative_sum_streaming_in_eval = CumulativeSumStreamingInEval()


class FusedNormLayerMomentumDoubled(_catalogue("oracle", "correct").FusedNormLayer):
    """The fused layer with its running statistics updated at momentum 0.2 where the reference's BatchNorm uses
    0.1: training-mode outputs use the batch's statistics and are right; the running statistics, which eval
    mode reads, drift from the reference's with every training call."""

    momentum = 0.2


fused_norm_layer_momentum_doubled = FusedNormLayerMomentumDoubled()


class ClassWeightedMeanOverCount(_catalogue("oracle", "correct").ClassWeightedMean):
    """The weighted sum divided by the number of samples where the weights' sum belongs: equal while every class
    weight is 1, as built; wrong once the weights are set."""

    def forward(self, values, labels):
        return (self.weight[labels] * values).sum() / labels.numel()


class_weighted_mean_over_count = ClassWeightedMeanOverCount()

