"""FlagGems 5.0.2: sum, mean(dim), cumsum, softmax's backward and log_softmax (forward and backward) raise
ZeroDivisionError on an input with no elements, where torch returns a result.

Needs a CUDA GPU (FlagGems does not import without one). Run: python empty_inputs.py

What FlagGems' code does, for an input of shape (0, N):
- `ops/sum.py` (`sum`): `block_size = triton.next_power_of_2(math.ceil(math.sqrt(M)))` is 0 for M = 0
  elements, and `triton.cdiv(M, block_size)` divides by it.
- `ops/mean.py` (`mean_dim`), `ops/cumsum.py` (`cumsum_wrapper`), `ops/softmax.py` (`softmax_backward`),
  `ops/log_softmax.py` (`log_softmax`, `log_softmax_backward`): `K = inp.numel() // M // N` with M, the
  product of the dimensions before `dim`, equal to 0. `softmax`'s forward has a guard for this
  (`if self.numel() == 0`); its backward and the others have none.
torch returns 0 (sum), an empty tensor (mean over the last dim, cumsum, softmax and log_softmax and their
backwards). An empty micro-batch reaches these ops with sequence packing or filtering.
"""

import flag_gems
import torch

DEV = "cuda"


def attempt(name, gems_call, torch_call):
    want = torch_call()
    try:
        got = gems_call()
        torch.cuda.synchronize()
        print(f"{name}: FlagGems {tuple(got.shape)} {got.tolist() if got.numel() < 4 else ''} "
              f"(torch {tuple(want.shape)})")
    except Exception as exc:  # noqa: BLE001 - the defect is the exception
        print(f"DEFECT {name}: FlagGems raised {type(exc).__name__}: {exc} "
              f"(torch returns shape {tuple(want.shape)}{', value ' + str(want.item()) if want.numel() == 1 else ''})")


def main():
    x = torch.randn(0, 1000, device=DEV)
    dy = torch.randn(0, 1000, device=DEV)
    y_soft = torch.softmax(x, dim=-1)
    y_log = torch.log_softmax(x, dim=-1)
    attempt("sum(x)", lambda: flag_gems.sum(x), lambda: torch.sum(x))
    attempt("mean(x, dim=-1)", lambda: flag_gems.mean_dim(x, [-1]), lambda: torch.mean(x, dim=-1))
    attempt("cumsum(x, -1)", lambda: flag_gems.cumsum(x, -1), lambda: torch.cumsum(x, dim=-1))
    attempt("softmax(x, -1)", lambda: flag_gems.softmax(x, -1, False), lambda: torch.softmax(x, dim=-1))
    attempt("softmax backward", lambda: flag_gems.softmax_backward(dy, y_soft, -1, x.dtype),
            lambda: torch.ops.aten._softmax_backward_data(dy, y_soft, -1, x.dtype))
    attempt("log_softmax(x, -1)", lambda: flag_gems.log_softmax(x, -1, False),
            lambda: torch.log_softmax(x, dim=-1))
    attempt("log_softmax backward", lambda: flag_gems.log_softmax_backward(dy, y_log, -1, x.dtype),
            lambda: torch.ops.aten._log_softmax_backward_data(dy, y_log, -1, x.dtype))


if __name__ == "__main__":
    main()
