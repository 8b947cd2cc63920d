"""liger-kernel 0.8.5: liger_cross_entropy overwrites the caller's logits of ignore_index rows with
zeros, even without autograd (torch.no_grad, or logits that do not require grad), where torch's
F.cross_entropy leaves its input alone.

Run: python cross_entropy_zeroes_ignored_logits.py   (CPU: TRITON_INTERPRET=1; or on a GPU)
"""

import os

import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

torch.manual_seed(0)
logits = torch.randn(4, 33, device=DEVICE)
target = torch.tensor([3, -100, 7, 1], device=DEVICE)
before = logits.clone()
with torch.no_grad():
    loss = liger_cross_entropy(logits, target, ignore_index=-100)
expected = F.cross_entropy(before.double(), target, ignore_index=-100)
print(f"loss {loss.item():.6f}, float64 F.cross_entropy {expected.item():.6f}")
changed = (logits != before).any(dim=1)
print("rows of the logits changed by the call:", changed.nonzero().flatten().tolist())
print("row 1 (ignored) before:", before[1, :4].tolist())
print("row 1 (ignored) after: ", logits[1, :4].tolist())
print("DEFECT: input modified" if changed.any() else "ok: input unchanged")
