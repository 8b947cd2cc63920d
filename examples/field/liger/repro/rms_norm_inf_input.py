"""liger-kernel 0.8.5 RMSNorm with one +Inf in a row: Liger gives 0 for the row's finite elements, as the
op's formula does; torch's CUDA rms_norm gives NaN for the whole row. Checks a reading, not a defect.

Needs a CUDA GPU (Liger's RMSNorm kernel does not run in Triton's interpreter: it calls `.to` on the
float scalar eps). Run: python rms_norm_inf_input.py

kgate's special_values gate failed liger-rms-norm on the GPU: "out[3, 511, 0]: the oracle gives NaN, the
kernel gives 0.0 (4095 of 8388608 elements differ in class) after +Inf injected into argument 0 at
[3, 511, 4095]", and in the backward "out[1][0]: the oracle gives NaN, the kernel gives -38.75 (4095 of
4096 elements differ in class)" (out[1] is the weight's gradient). The oracle is the manifest's reference
(torch.nn.functional.rms_norm, then times the weight) evaluated in float64 on the GPU.

Reading: not a Liger defect. RMSNorm is y = x / sqrt(mean(x^2) + eps) * w (torch.nn.RMSNorm's
documentation). With one x_j = +Inf the denominator is +Inf: y_i = 0 for every finite x_i and y_j =
Inf/Inf = NaN. Liger (`liger_kernel/ops/rms_norm.py`, `_rms_norm_forward_kernel`: `mean_square =
sum(X_row * X_row) / n_cols`, `rstd = rsqrt(mean_square + eps)`, `X_row * rstd`, then times W) computes
exactly that, and so does torch on the CPU. torch's CUDA kernel computes RMSNorm's statistics with the
LayerNorm kernel's Welford update (`aten/src/ATen/native/cuda/layer_norm_kernel.cu`, rms_norm = true:
rstd = rsqrt(m2 + m1^2 + eps)), whose update `delta * (x - new_mean)` is Inf * (Inf - Inf) = NaN for an
Inf input: NaN spreads over the whole row. The weight's gradient follows: sum over rows of dy * x_i * rstd
is finite in Liger (and in the formula's float64 autograd) for every column but the Inf's, NaN everywhere
in torch's CUDA autograd.

The script prints, for each output, Liger, torch on the GPU, torch on the CPU (float64) and the formula
(float64, on the CPU), by class (finite / NaN / Inf). A DEFECT line appears only where Liger disagrees
with the formula. Liger is called with in_place=False so that its backward leaves the cotangent alone.
"""

import torch
from liger_kernel.transformers.functional import liger_rms_norm

EPS = 1e-6


def formula(x, w):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * w


def classes(t):
    t = t.detach().double().cpu()
    return {"finite": int(torch.isfinite(t).sum()), "NaN": int(torch.isnan(t).sum()),
            "Inf": int(torch.isinf(t).sum())}


def grads(fn, x, w, dy):
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = fn(x, w)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    return y.detach(), gx, gw


def main():
    torch.manual_seed(0)
    rows, n = 4, 4096
    x = torch.randn(rows, n, device="cuda")
    x[-1, -1] = float("inf")
    w = 1 + 0.1 * torch.randn(n, device="cuda")
    dy = torch.randn(rows, n, device="cuda")
    runs = {
        "Liger (cuda, float32)": grads(lambda a, b: liger_rms_norm(a, b, EPS, in_place=False), x, w, dy),
        "torch F.rms_norm (cuda, float64)": grads(lambda a, b: torch.nn.functional.rms_norm(a, (n,), b, EPS),
                                                  x.double(), w.double(), dy.double()),
        "torch F.rms_norm (cpu, float64)": grads(lambda a, b: torch.nn.functional.rms_norm(a, (n,), b, EPS),
                                                 x.double().cpu(), w.double().cpu(), dy.double().cpu()),
        "formula (cpu, float64)": grads(formula, x.double().cpu(), w.double().cpu(), dy.double().cpu()),
    }
    torch.cuda.synchronize()
    for name, (y, gx, gw) in runs.items():
        print(f"{name:34s} row with +Inf: y {classes(y[-1])}; dx {classes(gx[-1])}; dw {classes(gw)}")
    mine, truth = runs["Liger (cuda, float32)"], runs["formula (cpu, float64)"]
    for label, got, want in zip(("y", "dx", "dw"), mine, truth):
        g, t = got.detach().double().cpu(), want.detach().cpu()
        differ = (torch.isnan(g) != torch.isnan(t)) | (torch.isinf(g) != torch.isinf(t))
        if differ.any():
            print(f"DEFECT liger_rms_norm {label}: {int(differ.sum())} element(s) differ in class from the formula "
                  f"y = x / sqrt(mean(x^2) + eps) * w in float64")


if __name__ == "__main__":
    main()
