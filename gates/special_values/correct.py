"""special_values, correct control: stable softmax, which lets NaN/Inf through exactly where the
reference does. Also holds the reference and inputs factory."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 40), generator=gen, dtype=torch.float64) * 3
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.softmax(x, dim=-1)


def softmax_stable(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


# --- `special_values_match: spread`: a tiled scan ---------------------------------------------------

def make_inputs_scan(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 100), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


def reference_scan(x):
    return torch.cumsum(x, dim=-1)


def cumsum_tiled(x):
    """Row prefix sums the tiled way: a triangular matmul within blocks of 16 columns plus the carried
    block totals. A NaN/Inf in x[j] also reaches the outputs before j in its block (0 * NaN = NaN in the
    masked half of the triangle): more non-finite outputs than the sequential scan, none fewer. Declared
    with `special_values_match: spread`."""
    from tiled_scan import scan_blocks, scan_finish  # this folder is on sys.path when kgate loads it

    blocks, tri = scan_blocks(x)
    return scan_finish(blocks @ tri, x.shape[-1])


# --- reductions and ReLU: where the probes' positions matter ----------------------------------------

def reference_relu(x):
    return torch.relu(x)


def reference_row_sum(x):
    return x.sum(dim=-1)


# --- whole rows of NaN, and subnormal results ---------------------------------------------------------

def reference_row_mean(x):
    return x.mean(dim=-1)


def row_mean_blocked(x, block=16):
    """Row mean: float32 block sums added into a running total, divided by the row's length."""
    total = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
    for k0 in range(0, x.shape[-1], block):
        total += x[..., k0:k0 + block].float().sum(dim=-1)
    return (total / x.shape[-1]).to(x.dtype)


def reference_scale(x):
    return x * 0.75


def scale(x):
    """x * 0.75 in the input's dtype: subnormal inputs give subnormal results, as in the reference."""
    return x * 0.75


# --- a reference's 0 from rounding, not a flush -------------------------------------------------------

def make_inputs_cancelling(seed, shape=None, dtype=torch.float16, device="cpu"):
    """Rows [1, c, c, c, c, -1, 1, -1, ...] (sixteen ones that cancel exactly) with c a fraction of float16's
    half ulp at 1: the sum is 4c. Scaled so that products are subnormal (peak 7e-3), 4c is a clearly
    subnormal float16 (about 5e-6)."""
    gen = torch.Generator().manual_seed(seed)
    rows = (shape or (8, 21))[0]
    c = 1.6e-4 * (1 + 0.2 * torch.rand(rows, 1, generator=gen, dtype=torch.float64))
    ones = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(rows, 8)
    return (torch.cat([ones[:, :1], c.expand(rows, 4), ones[:, 1:]], -1).to(dtype=dtype, device=device),)


def reference_sum_in_dtype(x):
    """The row sum with its running sum rounded to the dtype at every step: each c is absorbed by the 1 before
    it and the ones cancel, so the sum is 0 where the truth is a subnormal 4c (rounding, not a flush)."""
    acc = torch.zeros_like(x[..., 0])
    for j in range(x.shape[-1]):
        acc = acc + x[..., j]
    return acc


def sum_float32(x):
    """Adds in float32, rounds once: keeps the subnormal 4c the oracle has, where the reference rounds to 0."""
    return x.float().sum(-1).to(x.dtype)


def reference_cumsum_ftz(x):
    """A prefix sum built with flush-to-zero: subnormal results are 0."""
    out = torch.cumsum(x.float(), -1).to(x.dtype)
    return torch.where(out.abs() < torch.finfo(out.dtype).tiny, torch.zeros_like(out), out)


# --- a class the reference itself gives in the kernel's dtype -------------------------------------------

def make_inputs_saturated(seed, shape=None, dtype=torch.bfloat16, device="cpu"):
    """Logits x in [8, 12), where sigmoid rounds to 1.0 in bfloat16, and a cotangent dy."""
    shape = shape or (4, 64)
    gen = torch.Generator().manual_seed(seed)
    x = 8 + 4 * torch.rand(shape, generator=gen, dtype=torch.float64)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)
    return x.to(dtype=dtype, device=device), dy.to(dtype=dtype, device=device)


def reference_sigmoid_backward(x, dy):
    """sigmoid's backward dy * s * (1 - s) in the inputs' dtype: where s rounds to 1.0 the derivative is 0, and
    an Inf cotangent gives NaN, where the float64 oracle (s < 1) gives Inf."""
    s = torch.sigmoid(x)
    return dy * s * (1 - s)


def sigmoid_backward(x, dy):
    """The same backward, fused: NaN where its reference gives NaN in the dtype (Inf * 0)."""
    s = torch.sigmoid(x)
    return dy * (s - s * s)


def reference_row_argmax(x):
    """torch.argmax along the last dimension: a NaN counts as the largest value (its index is returned), ties
    go to the first index."""
    return torch.argmax(x, dim=-1)


def row_argmax_blocked(x, block=16):
    """Row argmax in blocks of `block`: each block's max and index (the first among ties, a NaN's if any), then
    the first block holding the row's max; the tail padded with -inf."""
    n = x.shape[-1]
    pad = (-n) % block
    if pad:
        x = torch.nn.functional.pad(x, (0, pad), value=float("-inf"))
    values, within = x.reshape(*x.shape[:-1], x.shape[-1] // block, block).max(dim=-1)
    blocks = torch.argmax(values, dim=-1, keepdim=True)
    return (blocks * block + within.gather(-1, blocks)).squeeze(-1)



BIN_EDGES = torch.linspace(-2.0, 2.0, 9)
BIN_VALUES = torch.arange(10, dtype=torch.float32) * 0.5 - 2.0


def reference_binned(x):
    """Each value replaced by its bin's value (torch.bucketize: a NaN lands past the last edge)."""
    return BIN_VALUES.to(x.device, x.dtype)[torch.bucketize(x, BIN_EDGES.to(x.device, x.dtype))]


def binned_by_counting(x):
    """The bin as the count of edges below the value, a NaN sent past the last edge as bucketize does."""
    edges = BIN_EDGES.to(x.device, x.dtype)
    index = (x.unsqueeze(-1) > edges).sum(dim=-1)
    index = torch.where(torch.isnan(x), torch.full_like(index, edges.numel()), index)
    return BIN_VALUES.to(x.device, x.dtype)[index]


def make_signal(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (2, 3, 16), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


def reference_upsample(x):
    """2x linear upsampling along the last dimension (align_corners=False): at each edge the outermost output
    takes the edge element with weight 1 and its neighbour with weight 0, so an Inf there gives NaN."""
    return torch.nn.functional.interpolate(x, scale_factor=2, mode="linear", align_corners=False)


def upsample_taps(x):
    """The same as two gathers with per-position weights, the edge's zero-weight neighbour kept."""
    n = x.shape[-1]
    src = ((torch.arange(2 * n, device=x.device, dtype=torch.float64) + 0.5) * 0.5 - 0.5).clamp(min=0)
    i0 = src.floor().long().clamp(max=n - 1)
    i1 = i0 + (i0 < n - 1).long()
    w1 = (src - i0).to(x.dtype)
    return x[..., i0] * (1 - w1) + x[..., i1] * w1


def make_grouped(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (6, 16), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


class GroupedLinear(torch.nn.Module):
    """The reference: a block-diagonal linear layer, 4 groups of 4 inputs to 3 outputs (a grouped projection):
    weight (4, 3, 4), einsum per group."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, 4, generator=gen) / 2)

    def forward(self, x):
        groups = x.reshape(*x.shape[:-1], 4, 4)
        return torch.einsum("...gi,goi->...go", groups, self.weight).reshape(*x.shape[:-1], 12)


class GroupedLinearBmm(GroupedLinear):
    """The same as one batched matmul over the groups."""

    def forward(self, x):
        groups = x.reshape(-1, 4, 4).transpose(0, 1)  # (groups, rows, inputs)
        out = torch.bmm(groups, self.weight.transpose(1, 2))  # (groups, rows, outputs)
        return out.transpose(0, 1).reshape(*x.shape[:-1], 12)


grouped_linear = GroupedLinear()
grouped_linear_bmm = GroupedLinearBmm()


def reference_column_max(x):
    """The maximum of each column (over dimension 0): -Inf for a column that is all -Inf."""
    return x.amax(dim=0)


def column_max_blocked(x, block=4):
    """Column maxima of blocks of rows, then the maximum of the blocks' (the blocks' own -Inf kept)."""
    parts = [x[i:i + block].amax(dim=0) for i in range(0, x.shape[0], block)]
    return torch.stack(parts).amax(dim=0)


IGNORE_INDEX = -100


def make_logits(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Logits (N, C) and targets (N,) int64, every tenth from the sixth on `IGNORE_INDEX` (padding tokens; not
    the first, centre or last rows)."""
    gen = torch.Generator().manual_seed(seed)
    n, c = shape or (48, 10)
    logits = torch.randn(n, c, generator=gen, dtype=torch.float64) * 2
    target = torch.randint(0, c, (n,), generator=gen)
    target[5::10] = IGNORE_INDEX
    return logits.to(dtype=dtype, device=device), target.to(device)


def reference_cross_entropy(logits, target):
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)


def cross_entropy_valid_rows(logits, target):
    """The rows of the valid targets selected first, their log-softmax and the mean of the picked terms: the
    padding rows are never read."""
    valid = target != IGNORE_INDEX
    rows, picked = logits[valid], target[valid]
    losses = -torch.log_softmax(rows, dim=-1).gather(1, picked[:, None]).squeeze(1)
    return losses.sum() / valid.sum().to(logits.dtype)
