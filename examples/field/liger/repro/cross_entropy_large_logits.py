"""liger-kernel 0.8.5: the cross-entropy loss loses digits as the logits grow, where torch's does not.

liger_cross_entropy_kernel (ops/cross_entropy.py) computes lse = m + log(d) and then loss = lse - X_y: the
sum m + log(d) is rounded at the magnitude of the logits before the logit is taken off again, so the loss
carries an error of about an ulp of the logits (4.9e-4 at a logit of 4608 in float32) however small the
loss is. torch's log_softmax takes the maximum off first (x - m), and its error follows the loss. The fused
linear cross-entropy uses the same kernel: the distributions gate found it with every input 1.5 (hidden
2048: every logit 4608, the loss log(32000) = 10.3735, Liger 4.3e-5 off), and the label-smoothed entry
with logits shifted far from zero. Logits of that size are rare in training; the error is relative to the
logits, not to the loss.

Run: python cross_entropy_large_logits.py   (CPU: TRITON_INTERPRET=1; or on a GPU)
"""

import os

import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

ROWS, VOCAB = 8, 4096 if DEVICE == "cpu" else 32000
gen = torch.Generator().manual_seed(0)
noise = torch.randn(ROWS, VOCAB, generator=gen)
target = torch.randint(0, VOCAB, (ROWS,), generator=gen)
for offset in (0.0, 64.0, 4608.0):
    logits = (noise + offset).to(DEVICE)
    exact = F.cross_entropy(logits.double(), target.to(DEVICE))
    torch_err = (F.cross_entropy(logits, target.to(DEVICE)).double() - exact).abs().item()
    liger_err = (liger_cross_entropy(logits.clone(), target.to(DEVICE)).double() - exact).abs().item()
    # Liger's formula, emulated in float32 on the CPU: (m + log d) - x_y, against torch's order
    x = logits.cpu()
    m = x.max(dim=-1).values
    d = (x - m[:, None]).exp().sum(dim=-1)
    emulated = ((m + d.log()) - x[torch.arange(ROWS), target]).mean().double()
    line = (f"offset {offset:g}: loss {exact.item():.6f}; error torch {torch_err:.3g}, liger {liger_err:.3g}, "
            f"the formula emulated {(emulated - exact.cpu()).abs().item():.3g}")
    print(("DEFECT " if liger_err > max(10 * torch_err, 1e-5) else "") + line)
