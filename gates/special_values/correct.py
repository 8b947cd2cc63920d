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
