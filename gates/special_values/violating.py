"""special_values, violating controls: finite numbers where the truth is NaN or Inf, or the reverse."""

import torch


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
