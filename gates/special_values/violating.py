"""special_values, violating controls: finite numbers where the truth is NaN or Inf, or the reverse."""

from pathlib import Path

import torch

from kgate.loading import load_module_from_file


def softmax_nan_to_num(x):
    """A fused softmax "cleaned up" with nan_to_num: a NaN in the row becomes zeros and a plausible
    distribution, where the reference says NaN."""
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return torch.nan_to_num(z / z.sum(dim=-1, keepdim=True), nan=0.0)


def softmax_no_max_subtraction(x):
    """No max subtraction: exp overflows to Inf for large logits and Inf/Inf gives NaN where the
    reference is finite."""
    z = torch.exp(x)
    return z / z.sum(dim=-1, keepdim=True)


def cumsum_tiled_masks_nonfinite(x):
    """The tiled scan 'fixed' so that a NaN no longer spreads through its block: non-finite inputs are
    zeroed before the product, so the outputs where the true prefix sum is NaN/Inf come out finite."""
    from tiled_scan import scan_blocks, scan_finish  # this folder is on sys.path when kgate loads it

    blocks, tri = scan_blocks(x)
    return scan_finish(torch.nan_to_num(blocks, nan=0.0, posinf=0.0, neginf=0.0) @ tri, x.shape[-1])


def relu_fmax(x):
    """ReLU as `fmaxf(x, 0.0f)`, the most common special-value fault of the H200 audit's CUDA kernels
    (docs/audit/README.md): fmax returns the other operand when one is NaN, so a NaN becomes 0."""
    return torch.fmax(x, torch.zeros((), dtype=x.dtype, device=x.device))


def row_sum_tail_nansum(x):
    """A split row sum whose second half is 'cleaned' with nansum: NaN in a row's first half reaches the
    output, NaN in its tail silently vanishes. Only a probe that puts a NaN in the tail catches it."""
    half = x.shape[-1] // 2
    return x[..., :half].sum(dim=-1) + torch.nansum(x[..., half:], dim=-1)


def row_mean_empty_rows_zero(x, block=16):
    """Row mean that treats a row with no valid value as empty and writes 0 for it (a guard against 0/0
    for fully masked rows): a NaN among other values still gives NaN, but a row that is all NaN gives 0
    where the reference says NaN. A NaN injected one element at a time never shows it."""
    total = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
    for k0 in range(0, x.shape[-1], block):
        total += x[..., k0:k0 + block].float().sum(dim=-1)
    empty = torch.isnan(x).all(dim=-1)
    return torch.where(empty, torch.zeros_like(total), total / x.shape[-1]).to(x.dtype)


def scale_flush_subnormals(x):
    """x * 0.75 as a fast-math (FTZ/DAZ) build computes it: subnormal inputs are read as 0 and subnormal
    results written as 0, where the reference keeps them. Within the oracle bound of normal inputs, and
    off by less than the smallest normal: only the zero-vs-subnormal class shows it."""
    tiny = torch.finfo(x.dtype).tiny
    x = torch.where(x.abs() < tiny, torch.zeros_like(x), x)
    out = x * 0.75
    return torch.where(out.abs() < tiny, torch.zeros_like(out), out)


def cumsum_keeps_flushed_subnormals(x):
    """A prefix sum that keeps subnormal results where its reference (built with flush-to-zero) flushes them: on
    subnormal inputs the first prefix sums are the inputs themselves, determined to a fraction of an ulp, so
    the reference's 0 there is a flush, not a rounding (the contract runs both ways)."""
    return torch.cumsum(x.float(), -1).to(x.dtype)


def sigmoid_backward_zeroing_nonfinite(x, dy):
    """sigmoid's backward with its non-finite results replaced by 0 (a guard against NaN gradients): an Inf
    cotangent gives 0, where the float64 oracle gives Inf and the reference in the dtype NaN."""
    s = torch.sigmoid(x)
    return torch.nan_to_num(dy * s * (1 - s), nan=0.0, posinf=0.0, neginf=0.0)


def row_argmax_skips_nan(x):
    """Row argmax whose comparison skips NaN (NaN mapped to -inf first, as a max reduction written with `>`
    does): right on finite rows; a row with a NaN gets its largest finite value's index, where torch returns
    the NaN's."""
    return torch.argmax(torch.nan_to_num(x, nan=float("-inf")), dim=-1)



def binned_nan_first(x):
    """The bin as the count of edges below the value (correct.py's tables): a NaN compares false with every
    edge and lands in the first bin, where torch's bucketize sends it past the last. Both give a finite bin
    value."""
    edges = torch.linspace(-2.0, 2.0, 9, device=x.device, dtype=x.dtype)
    values = (torch.arange(10, dtype=torch.float32) * 0.5 - 2.0).to(x.device, x.dtype)
    return values[(x.unsqueeze(-1) > edges).sum(dim=-1)]


def upsample_edge_replicated(x):
    """2x linear upsampling as the fixed 0.25/0.75 stencil with the edges replicated: each output reads its two
    real neighbours only. Equal values everywhere, but the outermost outputs never read the edge's neighbour,
    which the reference weights by 0: an Inf there leaves them finite where the reference gives NaN."""
    prev = torch.cat([x[..., :1], x[..., :-1]], dim=-1)
    nxt = torch.cat([x[..., 1:], x[..., -1:]], dim=-1)
    return torch.stack([0.25 * prev + 0.75 * x, 0.75 * x + 0.25 * nxt], dim=-1).reshape(*x.shape[:-1], 2 * x.shape[-1])


def _correct():
    """This folder's correct.py, loaded by path (a plain import would find another folder's)."""
    return load_module_from_file(Path(__file__).resolve().parent / "correct.py", "catalogue")


class GroupedLinearSkipsZeroGroups(_correct().GroupedLinear):
    """The block-diagonal layer with the groups whose weights are all 0 skipped (their outputs written as 0, a
    pruned-group fast path): the same values wherever the inputs are finite, but an Inf or NaN in a skipped
    group's inputs gives 0 where the reference's 0 x Inf is NaN."""

    def forward(self, x):
        groups = x.reshape(*x.shape[:-1], 4, 4)
        out = torch.zeros(*x.shape[:-1], 4, 3, dtype=x.dtype, device=x.device)
        for g in range(4):
            if bool(self.weight[g].any()):
                out[..., g, :] = groups[..., g, :] @ self.weight[g].t()
        return out.reshape(*x.shape[:-1], 12)


grouped_linear_skips_zero_groups = GroupedLinearSkipsZeroGroups()


def column_max_empty_as_zero(x):
    """Column maxima from a max initialised to -Inf, with "still -Inf" read as "no row seen" and written as 0
    (an empty segment's maximum): a column whose every value is -Inf, whose maximum is -Inf, becomes 0."""
    m = x.amax(dim=0)
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def cross_entropy_masked_by_weight(logits, target):
    """Every row's loss computed (the padding rows with a clamped target), then weighted by 0 for the padding
    rows and 1 for the others: equal where the padding rows' logits are finite; a NaN or Inf in a padding row's
    logits, which the reference never reads, gives 0 x NaN = NaN."""
    valid = target != -100
    losses = -torch.log_softmax(logits, dim=-1).gather(1, target.clamp_min(0)[:, None]).squeeze(1)
    return (losses * valid.to(logits.dtype)).sum() / valid.sum().to(logits.dtype)
