"""oracle, correct control: exact (erf) GELU. Also holds the reference and inputs factory."""

import math

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (8, 64), generator=gen, dtype=torch.float64) * 2
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.nn.functional.gelu(x)


def gelu_erf(x):
    """x * Phi(x) with the error function, as the reference defines it."""
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


# --- a cancellation to an exact 0: layer norm over one feature -------------------------------------------

LN_EPS = 1e-5


def make_one_feature(seed, shape=None, dtype=torch.float32, device="cpu"):
    """x (rows, features), weight and bias (features); one feature unless `shape` says otherwise: x_hat is then 0
    and the gradient of x is 0 exactly, a cancellation of terms of order rstd x w x dy (rstd = 1/sqrt(eps))."""
    rows, features = shape or (8, 1)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, features, generator=gen, dtype=torch.float64)
    w = torch.randn(features, generator=gen, dtype=torch.float64)
    b = torch.randn(features, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype=dtype, device=device) for t in (x, w, b))


class _LayerNormReference(torch.autograd.Function):
    """Layer norm in the inputs' dtype with the textbook backward, dx = rstd (w dy - mean(w dy) - x_hat mean(x_hat
    w dy)), as torch's fused CUDA backward computes it: over one feature it cancels to exactly 0 in every dtype
    (torch's CPU backward leaves a residue of its own there, autograd of the formula forms rsqrt's derivative at
    a zero variance, 1.6e7)."""

    @staticmethod
    def forward(ctx, x, w, b):
        centered = x - x.mean(-1, keepdim=True)
        rstd = torch.rsqrt((centered * centered).mean(-1, keepdim=True) + LN_EPS)
        x_hat = centered * rstd
        ctx.save_for_backward(x_hat, rstd, w)
        return x_hat * w + b

    @staticmethod
    def backward(ctx, dy):
        x_hat, rstd, w = ctx.saved_tensors
        wdy = w * dy
        dx = rstd * (wdy - wdy.mean(-1, keepdim=True) - x_hat * (x_hat * wdy).mean(-1, keepdim=True))
        return dx, (dy * x_hat).sum(0), dy.sum(0)


def layer_norm_reference(x, w, b):
    return _LayerNormReference.apply(x, w, b)


class _LayerNorm(torch.autograd.Function):
    """Layer norm over the last dimension, computed in float32, whose backward forms dx as fused kernels do:
    dx = (w dy - (x_hat c1 + c2)) rstd with c1 = mean(x_hat w dy), c2 = mean(w dy). `fused` (how the first
    use of w dy meets the subtraction) and `mean_of` (how c2 is formed) are the variants' only difference."""

    @staticmethod
    def forward(ctx, x, w, b, fused, mean_of):
        xf, wf = x.float(), w.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((xf - mean) ** 2).mean(-1, keepdim=True) + LN_EPS)
        x_hat = (xf - mean) * rstd
        ctx.save_for_backward(x_hat, rstd, wf)
        ctx.fused, ctx.mean_of = fused, mean_of
        return (x_hat * wf + b.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x_hat, rstd, w = ctx.saved_tensors
        dyf = dy.float()
        wdy = w * dyf
        c1 = (x_hat * wdy).mean(-1, keepdim=True)
        c2 = ctx.mean_of(wdy)
        dx = (ctx.fused(w, dyf, x_hat * c1 + c2) * rstd).to(dy.dtype)
        dw = (dyf * x_hat).sum(0).to(dy.dtype)
        db = dyf.sum(0).to(dy.dtype)
        return dx, dw, db, None, None


def _fused_multiply_subtract(w, dy, rest):
    """w * dy - rest rounded once (a fused multiply-add, as a GPU compiler contracts it): the product is exact."""
    return (w.double() * dy.double() - rest.double()).float()


def layer_norm_fused(x, w, b):
    """A correct layer norm whose backward contracts the first use of w dy into a fused multiply-add and rounds
    the second (inside c2): over one feature the exact 0 of dx comes out as rstd x (the product's rounding),
    a residue of a fraction of an ulp of w dy times rstd = 316 (Liger-Kernel's LayerNorm on a GPU)."""
    return _LayerNorm.apply(x, w, b, _fused_multiply_subtract, lambda wdy: wdy.mean(-1, keepdim=True))


def make_batch(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (32, 16), generator=gen, dtype=torch.float64) * 2 + 1).to(dtype=dtype, device=device),)


class BatchNormReference(torch.nn.Module):
    """The reference: BatchNorm1d, built in training mode (the batch's statistics, running ones updated); in
    eval mode it normalises with the running statistics."""

    def __init__(self, features=16):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)


class BatchNormBothModes(BatchNormReference):
    """Training mode through torch's batch_norm; eval mode as one multiply-add per element from the running
    statistics (scale and shift per feature: other rounding than the reference's)."""

    def forward(self, x):
        bn = self.bn
        if self.training:
            bn.num_batches_tracked.add_(1)  # nn.BatchNorm1d counts its calls; the functional call does not
            return torch.nn.functional.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, True,
                                                  bn.momentum, bn.eps)
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        return x * scale + (bn.bias - bn.running_mean * scale)


class BatchNormEvalFoldVersioned(BatchNormBothModes):
    """Eval mode's scale and shift folded once and kept while the weights and running statistics hold the values
    it was made from: the fold is keyed on each tensor's address and version counter (`_version`, which every
    in-place change, an optimizer step, `copy_` or `load_state_dict`, advances) and, since a write through
    `.data` (an optimizer's own kernel) and torch's batch_norm updating the running statistics in a
    training-mode call leave the versions as they were, on the values too: copies of them compared bitwise at
    every eval-mode call (a few vectors; far less than the fold's recomputation in a real layer)."""

    def held(self):
        bn = self.bn
        return bn.weight, bn.bias, bn.running_mean, bn.running_var

    def forward(self, x):
        bn = self.bn
        if self.training:
            return super().forward(x)
        key = tuple((t.data_ptr(), t._version) for t in self.held())
        kept = getattr(self, "_fold", None)
        if kept is None or kept[0] != key or not all(torch.equal(a, b) for a, b in zip(kept[1], self.held())):
            with torch.no_grad():
                scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
                self._fold = (key, [t.detach().clone() for t in self.held()], scale, bn.bias - bn.running_mean * scale)
        _, _, scale, shift = self._fold
        return x * scale + shift


class FusedNormLayer(torch.nn.Module):
    """A normalization layer of a fused kernel's own: a BatchNorm1d it holds under another name (`norm.inner`,
    where the reference's is `bn`), run by torch's batch_norm in training mode and as one multiply-add in eval
    mode. Its running statistics, under names the reference does not use, stand for the reference's: kgate
    keeps them in lockstep by their order and values (kgate.subject.pair_buffers), not by name."""

    momentum = 0.1  # the running statistics' update, as nn.BatchNorm1d's default

    def __init__(self, features=16):
        super().__init__()
        self.norm = torch.nn.Module()
        self.norm.inner = torch.nn.BatchNorm1d(features, momentum=self.momentum)

    def forward(self, x):
        bn = self.norm.inner
        if self.training:
            bn.num_batches_tracked.add_(1)
            return torch.nn.functional.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, True,
                                                  self.momentum, bn.eps)
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        return x * scale + (bn.bias - bn.running_mean * scale)


batchnorm_reference = BatchNormReference()
batchnorm_both_modes = BatchNormBothModes()
batchnorm_eval_fold_versioned = BatchNormEvalFoldVersioned()
fused_norm_layer = FusedNormLayer()


def make_observations(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (64, 8), generator=gen, dtype=torch.float64) * 2 + 0.5
    return (x.to(dtype=dtype, device=device),)


class RunningStandardizer(torch.nn.Module):
    """The reference: observations standardised with running statistics (reinforcement learning's observation
    normaliser). A training-mode call merges the batch's mean and variance into the running ones (Chan's
    parallel merge, weighted by the counts), then every call standardises with the running statistics: the
    output depends on every earlier training call."""

    def __init__(self, features=8, eps=1e-8):
        super().__init__()
        self.eps = eps
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("var", torch.ones(features))
        self.register_buffer("count", torch.tensor(1e-4))

    def forward(self, x):
        if self.training and x.shape[0] > 0:
            with torch.no_grad():
                batch_var, batch_mean = torch.var_mean(x, dim=0, correction=0)
                n = x.shape[0]
                delta = batch_mean - self.mean
                total = self.count + n
                m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
                self.mean.add_(delta * n / total)
                self.var.copy_(m2 / total)
                self.count.copy_(total)
        return (x - self.mean) / torch.sqrt(self.var + self.eps)


class RunningStandardizerWeights(RunningStandardizer):
    """The same merge written with the two weights a = count / total and b = n / total (mean += delta b,
    var = var a + batch var b + delta^2 a b) and a reciprocal square root: other rounding, the same statistics."""

    def forward(self, x):
        if self.training and x.shape[0] > 0:
            with torch.no_grad():
                batch_var, batch_mean = torch.var_mean(x, dim=0, correction=0)
                total = self.count + x.shape[0]
                a, b = self.count / total, x.shape[0] / total
                delta = batch_mean - self.mean
                self.var.copy_(self.var * a + batch_var * b + delta * delta * (a * b))
                self.mean.add_(delta * b)
                self.count.copy_(total)
        return (x - self.mean) * torch.rsqrt(self.var + self.eps)


running_standardizer = RunningStandardizer()
running_standardizer_weights = RunningStandardizerWeights()


class CumulativeSum(torch.nn.Module):
    """A running sum along dimension 0, each call from zero, in training and eval mode alike."""

    def forward(self, x):
        return torch.cumsum(x, dim=0)


cumulative_sum = CumulativeSum()


def make_labelled(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Per-sample losses and their classes: (values (N,), labels (N,) int64 in [0, 10))."""
    gen = torch.Generator().manual_seed(seed)
    n = (shape or (256,))[0]
    values = torch.rand(n, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 10, (n,), generator=gen)
    return values.to(dtype=dtype, device=device), labels.to(device)


class ClassWeightedMean(torch.nn.Module):
    """The reference: per-sample losses averaged with per-class weights (a buffer, ones as built, set from the
    class frequencies later), sum(w[y] * loss) / sum(w[y]): cross-entropy's `weight=` reduction."""

    def __init__(self, classes=10):
        super().__init__()
        self.register_buffer("weight", torch.ones(classes))

    def forward(self, values, labels):
        w = self.weight[labels]
        return (w * values).sum() / w.sum()


class ClassWeightedMeanGathered(ClassWeightedMean):
    """The same with the weighted sum and the weights' sum reduced together, as one (2, N) sum."""

    def forward(self, values, labels):
        w = self.weight[labels]
        sums = torch.stack([w * values, w.expand_as(values)]).sum(dim=1)
        return sums[0] / sums[1]


class_weighted_mean = ClassWeightedMean()
class_weighted_mean_gathered = ClassWeightedMeanGathered()

