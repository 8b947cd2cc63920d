"""FlagGems 5.0.2: amax, max(dim), min(dim), argmax, maximum, clamp and log_softmax drop a NaN input that
torch propagates.

Needs a CUDA GPU (FlagGems does not import without one). Run: python nan_propagation.py

torch documents NaN propagation for these ops (torch.maximum: "If one of the elements being compared is
a NaN, then that element is returned"; torch.max/min/amax over a dim return NaN for a row holding one;
torch.clamp keeps a NaN input NaN; log_softmax of a row holding a NaN is NaN in the whole row). What
FlagGems' code does instead:
- `ops/amax.py` (`amax_kernel`) reduces with `tl.maximum` and `tl.max`; `ops/max.py` / `ops/min.py`
  (`max_kernel` / `min_kernel` of `max_dim` / `min_dim`) reduce a block with `tl.max(..., return_indices=True)`
  and merge blocks with `max_value > result_value`. Triton's `tl.maximum`/`tl.minimum` do not propagate NaN
  by default (`propagate_nan=NONE`: the GPU's max.f32 returns the other operand), its argmax combine and
  the `>` merge are false for NaN: the NaN is skipped, the row's largest number comes back. `argmax`
  returns the index of that number; torch.argmax returns the NaN's index (a NaN counts as the largest).
- `ops/maximum.py` (`maximum_kernel`: `tl.maximum(X, Y)`) and `ops/clamp.py` (`clamp_func`:
  `tl.minimum(maxi, tl.maximum(mini, x))`): same, elementwise: maximum(NaN, y) gives y, clamp(NaN) gives
  the lower bound.
- `ops/log_softmax.py` (`log_softmax_kernel`) keeps a running max per lane with `tl.maximum(inp, m)`: a
  NaN in a lane whose running max is still -inf (the row's first block) leaves m = -inf and the
  rescaling skips it (`all_neg_inf`), so the row's normaliser is finite and only the NaN's own output is
  NaN; a NaN in a later block does reach the normaliser (exp(NaN - m)) and the whole row is NaN. The
  backward (`log_softmax_backward`) then sees the finite outputs and gives finite gradients.

The script puts one NaN into a row of random data (at the row's first and last element) and compares
each FlagGems result with the same torch op on the same GPU tensor (float32; torch's CUDA ops propagate
the NaN, as their CPU ops do).
"""

import flag_gems
import torch

DEV = "cuda"


def nan_rows(shape=(4, 1000), where=(-1,)):
    """Random rows, row r with a NaN at column where[r % len(where)]."""
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEV)
    for r in range(shape[0]):
        x[r, where[r % len(where)]] = float("nan")
    return x


def compare(name, got, want):
    """Prints the comparison; one DEFECT line where torch has NaN and FlagGems a number."""
    got, want = got.float(), want.float()
    missed = torch.isnan(want) & ~torch.isnan(got)
    print(f"{name}: torch NaN at {int(torch.isnan(want).sum())} of {want.numel()} outputs, "
          f"FlagGems NaN at {int(torch.isnan(got).sum())}")
    if missed.any():
        i = int(missed.reshape(-1).nonzero()[0, 0])
        print(f"DEFECT {name}: {int(missed.sum())} output(s) where torch gives NaN are numbers in FlagGems "
              f"(first: flat index {i}, FlagGems {got.reshape(-1)[i].item():.6g}, torch nan)")


def compare_index(name, got, want, x):
    """Prints the comparison of two index outputs; one DEFECT line where they differ on a row holding a NaN."""
    differ = (got != want) & torch.isnan(x).any(-1)
    print(f"{name}: {int(differ.sum())} of {want.numel()} rows differ")
    if differ.any():
        r = int(differ.nonzero()[0, 0])
        print(f"DEFECT {name}: row {r}: FlagGems index {int(got[r])} (value {x[r, int(got[r])].item():.6g}), "
              f"torch index {int(want[r])} (value {x[r, int(want[r])].item()})")


def main():
    x = nan_rows(where=(0, -1))  # a NaN at the first column of rows 0, 2 and the last of rows 1, 3
    compare("amax(x, dim=-1)", flag_gems.amax(x, [-1]), torch.amax(x, dim=-1))
    compare("max(x, dim=-1).values", flag_gems.max_dim(x, -1)[0], torch.max(x, dim=-1).values)
    compare("min(x, dim=-1).values", flag_gems.min_dim(x, -1)[0], torch.min(x, dim=-1).values)
    compare_index("argmax(x, dim=-1)", flag_gems.argmax(x, -1), torch.argmax(x, dim=-1), x)
    y = torch.randn_like(x)
    compare("maximum(x, y)", flag_gems.maximum(x, y), torch.maximum(x, y))
    compare("clamp(x, -1.5, 2.0)", flag_gems.clamp(x, -1.5, 2.0), torch.clamp(x, -1.5, 2.0))

    # log_softmax: the NaN in the first block of a row is lost, one in the last block spreads
    for col in (0, -1):
        xs = nan_rows(where=(col,))
        out = flag_gems.log_softmax(xs, -1, False)
        compare(f"log_softmax(x, -1), NaN at column {col}", out, torch.log_softmax(xs, dim=-1))
        dy = torch.randn_like(xs)
        ref_out = torch.log_softmax(xs, dim=-1)
        want = torch.ops.aten._log_softmax_backward_data(dy, ref_out, -1, xs.dtype)
        got = flag_gems.log_softmax_backward(dy, out, -1, xs.dtype)
        compare(f"log_softmax backward, NaN at column {col}", got, want)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
