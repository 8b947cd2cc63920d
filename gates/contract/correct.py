"""contract, correct control: a half-precision-friendly softmax that computes in float32 and hands
back the caller's dtype, shape and a fresh tensor. Also holds the reference and inputs factory that
the contract controls share."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """One (rows, cols) tensor of logits of modest size (|x| < 3 almost surely)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 40), generator=gen, dtype=torch.float64) * 0.5
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.softmax(x, dim=-1)


def softmax_upcast(x):
    """Computes in float32 for accuracy and casts the result back to the input's dtype."""
    x32 = x.float()
    z = torch.exp(x32 - x32.amax(dim=-1, keepdim=True))
    return (z / z.sum(dim=-1, keepdim=True)).to(x.dtype)


def clamp_reference(x):
    return x.clamp(-3.0, 3.0)


def clamp_copy(x):
    """Clamps into a new tensor even when nothing needs clamping."""
    return torch.clamp(x, -3.0, 3.0)


def first_columns_reference(x):
    return x[..., :3]


def first_columns_view(x):
    """Returns a view of its input, as its reference does (slicing is a view by meaning): the output may
    share the input's memory because the reference's output shares it too."""
    return x[..., :3]


def make_features_and_weight(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Features (rows, d) and a weight (out, d) of a bias-free linear layer; shape is the features'."""
    gen = torch.Generator().manual_seed(seed)
    rows, d = shape or (6, 40)
    x = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    w = torch.randn(24, d, generator=gen, dtype=torch.float64) / d ** 0.5
    return x.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device)


def linear_reference(x, w):
    return x @ w.T


def linear_weight_stationary(x, w):
    """Computes w @ x^T (the weight as the left operand, as a weight-stationary schedule does) and hands
    back the caller's layout: the transpose of that product, made contiguous."""
    return (w @ x.T).T.contiguous()


def make_batch(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (32, 16), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


class BatchNormTraining(torch.nn.Module):
    """The reference: a BatchNorm in training mode, which normalises with the batch's statistics and updates
    its running ones on every call."""

    def __init__(self, features=16):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)


class BatchNormOwnFormula(BatchNormTraining):
    """Its own normalisation, the running statistics updated as torch updates them (unbiased variance); in
    eval mode from the running statistics."""

    def forward(self, x):
        bn = self.bn
        if not self.training:
            return (x - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
        mean, var = x.mean(0), x.var(0, unbiased=False)
        with torch.no_grad():
            if x.shape[0] > 0:  # an empty batch leaves them as they are (and is counted, as torch does)
                bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
                bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * x.var(0, unbiased=True))
            bn.num_batches_tracked += 1
        return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias


batchnorm_reference = BatchNormTraining()
batchnorm_own_formula = BatchNormOwnFormula()


def make_ids(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Position ids, one row per sequence: consecutive positions from a seeded start (as decoding makes them)."""
    gen = torch.Generator().manual_seed(seed)
    batch, length = shape or (1, 6)
    start = torch.randint(0, 10, (batch, 1), generator=gen)
    return ((start + torch.arange(length)).to(device),)


class PositionTable(torch.nn.Module):
    """The reference: a learned position embedding, a gather of table rows (a fresh tensor)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.table = torch.nn.Parameter(torch.randn(32, 8, generator=gen))

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.table)


class PositionTableIndexed(PositionTable):
    """The same through advanced indexing (a gather: a fresh tensor too)."""

    def forward(self, ids):
        return self.table[ids]


class ScaledLinear(torch.nn.Module):
    """The reference: a linear layer whose outputs are multiplied by a learned per-output gain."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(4)
        self.weight = torch.nn.Parameter(torch.randn(8, 16, generator=gen) / 4)
        self.gain = torch.nn.Parameter(1 + 0.1 * torch.randn(8, generator=gen))

    def forward(self, x):
        return (x @ self.weight.t()) * self.gain


class ScaledLinearFused(ScaledLinear):
    """The gain applied to the weight on the fly (a product made per call, the parameters left alone)."""

    def forward(self, x):
        return x @ (self.weight * self.gain[:, None]).t()


def make_rows(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (4, 16), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


position_table = PositionTable()
position_table_indexed = PositionTableIndexed()
scaled_linear = ScaledLinear()
scaled_linear_fused = ScaledLinearFused()
