"""FlagGems 5.0.2: rsqrt of a subnormal float32 (or bfloat16) input returns +inf; torch returns the
finite 1/sqrt(x) (up to about 1.3e22 for float32).

Needs a CUDA GPU (FlagGems does not import without one). Run: python rsqrt_subnormal.py

What FlagGems' code does (`flag_gems/ops/rsqrt.py`, `rsqrt_func`): `1.0 / tl.sqrt(x.to(tl.float32))`.
Triton documents `tl.sqrt` as the "fast square root" (`tl.sqrt_rn` is the IEEE-rounded one); on NVIDIA
GPUs it is the approximate square root with flush-to-zero (PTX `sqrt.approx.ftz.f32`), which reads a
subnormal input as 0: sqrt gives 0 and 1/0 gives +inf. torch.rsqrt on CUDA keeps subnormal inputs.
float16 inputs are not affected (their subnormals are normal float32 numbers after the cast); bfloat16
shares float32's exponent range, so its subnormals are float32 subnormals and are affected too.

The script evaluates FlagGems' rsqrt and torch.rsqrt on subnormal and on normal inputs and compares with
float64.
"""

import flag_gems
import torch

DEV = "cuda"


def main():
    for dtype in (torch.float32, torch.bfloat16):
        tiny = torch.finfo(dtype).tiny
        x = torch.tensor([tiny * 0.5, tiny * 0.01, 1e-40, tiny, 1e-30, 1.0], dtype=torch.float64).to(dtype)
        x = x[x > 0].to(DEV)
        want = torch.rsqrt(x.double())
        got = flag_gems.rsqrt(x)
        ref = torch.rsqrt(x)
        torch.cuda.synchronize()
        for xi, g, r, w in zip(x.tolist(), got.tolist(), ref.tolist(), want.tolist()):
            sub = "subnormal" if xi < tiny else "normal"
            print(f"{str(dtype):14s} rsqrt({xi:.4g}, {sub}): FlagGems {g:.6g}, torch {r:.6g}, float64 {w:.6g}")
        bad = ~torch.isfinite(got) & torch.isfinite(want.to(dtype))
        if bad.any():
            i = int(bad.nonzero()[0, 0])
            print(f"DEFECT rsqrt {dtype}: {int(bad.sum())} of {x.numel()} inputs give {got[i].item()} where torch "
                  f"and float64 are finite (first: x = {x[i].item():.4g}, torch {ref[i].item():.6g})")


if __name__ == "__main__":
    main()
