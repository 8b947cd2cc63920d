"""liger-kernel 0.8.5: liger_cross_entropy and liger_fused_linear_cross_entropy raise on an empty
batch (0 tokens), where torch's F.cross_entropy returns nan (mean), 0 (sum) or an empty tensor (none).

cross_entropy_forward asserts `(target * target_mask).max() < V`, and .max() of an empty tensor
raises; fused_linear_cross_entropy_forward divides by the token count when it sizes its chunks.

Run: python cross_entropy_empty_batch.py   (CPU: TRITON_INTERPRET=1; or on a GPU)
"""

import os

import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.transformers.functional import (  # noqa: E402
    liger_cross_entropy,
    liger_fused_linear_cross_entropy,
)

logits = torch.randn(0, 33, device=DEVICE)
target = torch.zeros(0, dtype=torch.long, device=DEVICE)
hidden, weight = torch.randn(0, 16, device=DEVICE), torch.randn(33, 16, device=DEVICE)
for reduction in ("mean", "sum", "none"):
    want = F.cross_entropy(logits.double(), target, reduction=reduction)
    try:
        got = liger_cross_entropy(logits, target, reduction=reduction)
        print(f"liger_cross_entropy {reduction}: {got} (torch: {want})")
    except Exception as exc:  # noqa: BLE001 - the defect is the exception
        print(f"DEFECT liger_cross_entropy {reduction}: {type(exc).__name__}: {exc} (torch: {want})")
try:
    print("liger_fused_linear_cross_entropy:", liger_fused_linear_cross_entropy(hidden, weight, target))
except Exception as exc:  # noqa: BLE001
    print(f"DEFECT liger_fused_linear_cross_entropy: {type(exc).__name__}: {exc} "
          f"(torch: {F.cross_entropy(F.linear(hidden, weight).double(), target)})")
