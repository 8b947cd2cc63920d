"""FlagGems 5.0.2: var_mean() loses the variance of data that sits far from zero: its Welford combine is
the one-pass formula sum(x^2) - n * mean^2, which cancels catastrophically once the mean is large against
the spread.

Needs a CUDA GPU for FlagGems (the emulation below is plain torch). Run: python var_mean_offset.py

What FlagGems' code does (`flag_gems/ops/var_mean.py`):
- along a dimension (`var_mean_welford_kernel`), each of BLOCK_N lanes keeps a Welford running mean and sum
  of squared deviations over its columns (stable), then `tl.reduce(..., combine_fn=welford_func)` merges the
  lanes with
      M = M_x + n_x * mean_x^2 + M_y + n_y * mean_y^2 - n * mean^2
  i.e. each lane's sum of squares rebuilt from its mean, then the square of the mean taken off again: at a
  common offset c the terms are about n * c^2 and their difference n * var, so float32 keeps about
  log2(var / c^2) fewer bits of the variance than of the data (all of them once c / sd passes ~4000).
  Chan et al.'s pairwise update, M = M_x + M_y + (mean_y - mean_x)^2 * n_x * n_y / n, has no such
  cancellation; torch's CUDA var_mean uses it.
- over all elements (`var_mean_kernel_1`), each block of 1024 stores sum(x * x) - count * mean^2 directly,
  the textbook one-pass variance, before the same combine.

kgate's distributions gate found it on the GPU: var_mean of (64, 1000) float32 rows shifted by 1000 x
their spread, 1.86 off a variance of 527,622 (bound 0.35). The script prints, per offset, the float64
variance, torch's and FlagGems' float32 variances (on a GPU) and a plain-torch emulation of the lane
combine, and a DEFECT line where FlagGems is far off where torch is not.
"""

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LANES = 1024  # BLOCK_N: FlagGems autotunes it; with 1000 columns each lane holds at most one element


def welford_combine(mean_x, count_x, m_x, mean_y, count_y, m_y):
    """FlagGems' `welford_func`, in float32."""
    count = count_x + count_y
    safe = torch.clamp(count, min=1)
    mc_x, mc_y = mean_x * count_x, mean_y * count_y
    mean = (mc_x + mc_y) / safe
    m = m_x + mc_x * mean_x + m_y + mc_y * mean_y - count * mean * mean
    return mean, count, m


def emulated_var(rows):
    """The dim path in plain float32 torch: one lane per column block, lanes merged pairwise with
    `welford_combine` (tl.reduce's tree), then divided by N - 1."""
    x = rows.float()
    n = x.shape[-1]
    width = max(LANES, 1 << (n - 1).bit_length())
    mean = torch.zeros(x.shape[0], width)
    count = torch.zeros(x.shape[0], width)
    m = torch.zeros(x.shape[0], width)
    for start in range(0, n, width):  # each lane's Welford update over its columns
        chunk = x[:, start:start + width]
        k = chunk.shape[1]
        new_count = count[:, :k] + 1
        new_mean = mean[:, :k] + (chunk - mean[:, :k]) / new_count
        m[:, :k] += (chunk - new_mean) * (chunk - mean[:, :k])
        mean[:, :k], count[:, :k] = new_mean, new_count
    while mean.shape[1] > 1:  # the lanes merged in a tree
        mean, count, m = welford_combine(mean[:, 0::2], count[:, 0::2], m[:, 0::2],
                                         mean[:, 1::2], count[:, 1::2], m[:, 1::2])
    return (m[:, 0] / (n - 1)).double()


def main():
    gems = None
    if DEV == "cuda":
        import flag_gems
        gems = flag_gems.ops.var_mean
    else:
        print("no CUDA GPU: FlagGems cannot run here; the emulation alone follows")
    for offset in (0.0, 1e2, 1e3, 1e4):
        gen = torch.Generator().manual_seed(0)
        rows = (torch.randn(64, 1000, generator=gen, dtype=torch.float64) + offset).float()
        truth = rows.double().var(dim=1)
        ref_err = (torch.var(rows.to(DEV), dim=1).double().cpu() - truth).abs().max().item()
        emu_err = (emulated_var(rows) - truth).abs().max().item()
        line = (f"offset {offset:g} x sd: variance ~{truth.mean().item():.4f}; torch float32 error {ref_err:.3g}, "
                f"emulated FlagGems combine error {emu_err:.3g}")
        if gems is not None:
            var, _ = gems(rows.to(DEV), [1], correction=1)
            got_err = (var.double().cpu() - truth).abs().max().item()
            line += f", FlagGems error {got_err:.3g}"
            if got_err > 100 * max(ref_err, 1e-7 * truth.abs().max().item()):
                print(line)
                print(f"DEFECT var_mean(float32 (64, 1000) + {offset:g}, dim=1): FlagGems' variance is {got_err:.3g} "
                      f"off (torch {ref_err:.3g}; the variance is ~{truth.mean().item():.4f})")
                continue
        print(line)


if __name__ == "__main__":
    main()
