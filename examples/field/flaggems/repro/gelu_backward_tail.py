"""FlagGems 5.0.2: gelu_backward (approximate="none") returns exactly 0 for inputs below about -6.06 in
float32 (and bfloat16), where the derivative is a small negative float32 number (-2.5e-9 at x = -6.44,
-6.3e-11 at x = -7) that torch keeps; so an infinite upstream gradient gives NaN where torch gives -inf.

Needs a CUDA GPU for FlagGems (the emulation below is plain torch and runs anywhere).
Run: python gelu_backward_tail.py

What FlagGems' code does (`flag_gems/ops/gelu.py`, `gelu_backward_none`; the NVIDIA override
`runtime/backend/_nvidia/ops/gelu.py` has the same formula): in float32,
`dydx = scale2 * x * exp(-pow(scale1 * x, 2)) + 0.5 * erf(scale1 * x) + 0.5`, evaluated left to right.
For x < -5.5, erf(x / sqrt(2)) rounds to -1, so the first sum is -0.5 + x * pdf(x); float32 cannot hold
that next to 0.5 once |x * pdf(x)| is below half an ulp of 0.5 (2^-25, about 3e-8: x < -6.06), and adding
0.5 gives exactly 0. torch's formula (`GeluBackwardCUDAKernelImpl`, `ActivationGeluKernel.cu`:
`cdf + x * pdf` with `cdf = 0.5 * (1 + erf(x / sqrt(2)))`) adds the 0.5 first (cdf is 0 there) and keeps
x * pdf(x).
The gradient's error is below 3e-8 in absolute terms, so the oracle bound passes it; the relative error of
each such element is 100 %, and dy = inf gives 0 * inf = NaN.

The script prints, for inputs from -3 to -10, float64's derivative, torch's and FlagGems' float32 and
bfloat16 gelu_backward with dy = 1 and dy = +inf, and an emulation of FlagGems' order in plain torch.
"""

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
XS = [-3.0, -4.0, -5.0, -5.5, -6.0, -6.0625, -6.4375, -7.0, -8.0, -10.0]
SCALE1 = 0.7071067811  # FlagGems' constants
SCALE2 = 0.3989422803


def emulated(x):
    """FlagGems' gelu_backward_none formula and order, in float32."""
    x = x.float()
    return (SCALE2 * x * torch.exp(-torch.pow(SCALE1 * x, 2)) + 0.5 * torch.erf(SCALE1 * x)) + 0.5


def main():
    x64 = torch.tensor(XS, dtype=torch.float64)
    want = torch.ops.aten.gelu_backward(torch.ones_like(x64), x64, approximate="none")
    emu = emulated(x64.float())
    print("x          float64 d/dx    emulated FlagGems order (float32)")
    for xi, w, e in zip(XS, want.tolist(), emu.tolist()):
        print(f"{xi:8.4f}   {w:12.5g}    {e:12.5g}")
    lost = (emu == 0) & (want.float() != 0)
    print(f"emulation: {int(lost.sum())} of {len(XS)} inputs give exactly 0 where float64's derivative "
          f"rounds to a non-zero float32")
    if DEV != "cuda":
        print("no CUDA GPU: FlagGems not run")
        return
    import flag_gems

    for dtype in (torch.float32, torch.bfloat16):
        x = x64.to(dtype=dtype, device=DEV)
        for dy_value in (1.0, float("inf")):
            dy = torch.full_like(x, dy_value)
            got = flag_gems.gelu_backward(dy, x, approximate="none")
            ref = torch.ops.aten.gelu_backward(dy, x, approximate="none")
            exact = torch.ops.aten.gelu_backward(dy.double(), x.double(), approximate="none")
            torch.cuda.synchronize()
            print(f"{str(dtype):14s} dy={dy_value}: FlagGems {got.tolist()}")
            print(f"{'':14s} {'':7s} torch    {ref.tolist()}")
            if dy_value == 1.0:
                bad = (got == 0) & (exact.to(dtype) != 0)
                if bad.any():
                    i = int(bad.nonzero()[0, 0])
                    print(f"DEFECT gelu_backward {dtype}: {int(bad.sum())} of {x.numel()} inputs give 0 "
                          f"where the derivative is non-zero in {dtype} (first: x = {x[i].item()}, "
                          f"float64 {exact[i].item():.4g}, torch {ref[i].item():.4g})")
            else:
                bad = torch.isnan(got) & ~torch.isnan(exact.to(dtype))
                if bad.any():
                    i = int(bad.nonzero()[0, 0])
                    print(f"DEFECT gelu_backward {dtype}: dy = inf gives NaN at {int(bad.sum())} of "
                          f"{x.numel()} inputs where float64 gives {exact[i].item()} (first: x = "
                          f"{x[i].item()}, torch {ref[i].item()})")


if __name__ == "__main__":
    main()
