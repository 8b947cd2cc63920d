"""FlagGems 5.0.2 layer_norm backward on an input of more than two dimensions, against float64 autograd.

Needs a CUDA GPU (FlagGems does not import without one). Run: python layer_norm_backward_3d.py

What the code says (flag_gems/ops/layernorm.py): the forward takes M = numel // prod(normalized_shape)
rows, but `layer_norm_backward` takes M = input.shape[0] and N = numel // M. For a (B, T, C) input
normalized over C that is B rows of T*C: the dx kernel applies row b's statistics mean[b], rstd[b] to
T*C elements and reads the weight at columns up to T*C (it has C), and the weight/bias kernel stores
dW and dB at T*C columns (they have C). `flag_gems.enable()` registers this function as
aten::native_layer_norm_backward, which torch's autograd calls with the input as it is (B, T, C).
The forward also keeps mean and rstd in the input's dtype (bfloat16/float16), where its own comment
and torch's CUDA kernel keep float32.

The script calls the two FlagGems functions the way torch's autograd formula does (what `enable()`
makes happen) and compares dx, dw, db with float64 autograd of torch.nn.functional.layer_norm, on a
2-D input (expected fine) and on the same data as (B, T, C) (the defect), and prints a DEFECT line where
the 3-D gradients are off (or the call faults: the weight/bias kernel writes past dW and dB). The GPU
run of kgate (H100, torch 2.11, Triton 3.6) saw NaN gradients, 4,089 bytes written past a 768-element
dW/dB and an illegal memory access on (4, 50, 768).
"""

import math

import flag_gems
import torch
import torch.nn.functional as F


def gems_layer_norm_grads(x, w, b, dy, eps=1e-5):
    shape = [x.shape[-1]]
    _, mean, rstd = flag_gems.layer_norm(x, shape, w, b, eps)
    dx, dw, db = flag_gems.layer_norm_backward(dy, x, shape, mean, rstd, w, b, [True, True, True])
    torch.cuda.synchronize()
    return dx, dw, db, mean.dtype


def float64_grads(x, w, b, dy, eps=1e-5):
    x, w, b = (t.double().requires_grad_() for t in (x, w, b))
    y = F.layer_norm(x, (x.shape[-1],), w, b, eps)
    return torch.autograd.grad(y, (x, w, b), dy.double())


def report(label, x, w, b, dy):
    """Prints dx, dw, db against float64 autograd; returns the worst error relative to the largest float64
    gradient (inf for a wrong shape or a non-finite value)."""
    dx, dw, db, stats_dtype = gems_layer_norm_grads(x, w, b, dy)
    ref = float64_grads(x, w, b, dy)
    print(f"{label}: input {tuple(x.shape)} {x.dtype}, FlagGems keeps mean/rstd in {stats_dtype}")
    worst = 0.0
    for name, got, want in zip(("dx", "dw", "db"), (dx, dw, db), ref):
        if got.shape != want.shape:
            print(f"  {name}: shape {tuple(got.shape)} (expected {tuple(want.shape)})")
            worst = math.inf
            continue
        err = (got.double() - want).abs().max().item()
        scale = want.abs().max().item()
        print(f"  {name}: shape {tuple(got.shape)}, max |error| vs float64 = {err:.3e}, max |float64| = {scale:.3e}")
        worst = max(worst, err / scale if math.isfinite(err) and scale > 0 else math.inf)
    return worst


def main():
    torch.manual_seed(0)
    dev = "cuda"
    bsz, t, c = 4, 50, 768
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(bsz, t, c, device=dev).to(dtype)
        w = (1 + 0.1 * torch.randn(c, device=dev)).to(dtype)
        b = (0.1 * torch.randn(c, device=dev)).to(dtype)
        dy = torch.randn(bsz, t, c, device=dev).to(dtype)
        flat = report("2-D (B*T, C)", x.reshape(-1, c), w, b, dy.reshape(-1, c))
        try:
            full = report("3-D (B, T, C)", x, w, b, dy)
        except Exception as exc:  # noqa: BLE001 - a fault of the out-of-bounds writes is the defect showing
            print(f"DEFECT layer_norm_backward {dtype} (B, T, C) = {(bsz, t, c)}: raised {type(exc).__name__}: {exc}")
            return  # a CUDA fault leaves the context unusable
        # the same data as (B*T, C) is the yardstick: several times its relative error is not rounding
        if full > max(16 * flat, 1e-2):
            print(f"DEFECT layer_norm_backward {dtype} (B, T, C) = {(bsz, t, c)}: gradients off by {full:.3g} of their "
                  f"largest float64 value (the same data as (B*T, C): {flat:.3g})")


if __name__ == "__main__":
    main()
