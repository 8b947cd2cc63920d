"""liger-kernel 0.8.5: liger_cross_entropy returns a wrong gradient when the logits' last dimension
is not contiguous (stride(-1) != 1, e.g. a transposed view): the gradient it returns is the logits
themselves (ignored rows zeroed), not softmax - one_hot.

cross_entropy_forward copies such logits (`_input = _input.contiguous()`), and then computes the
gradient only `if _input.requires_grad` (HAS_GRADIENTS): inside autograd.Function.forward grad mode
is off, so the copy never requires grad, no gradient is written, and backward scales the copy.

Run: python cross_entropy_strided_logits_grad.py   (CPU: TRITON_INTERPRET=1; or on a GPU)
"""

import os

import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

torch.manual_seed(0)
rows, vocab = 7, 33
target = torch.randint(0, vocab, (rows,), device=DEVICE)
base = torch.randn(vocab, rows, device=DEVICE)

strided = base.t().detach().requires_grad_(True)      # shape (rows, vocab), strides (1, rows)
liger_cross_entropy(strided, target).backward()

oracle = base.t().double().detach().requires_grad_(True)
F.cross_entropy(oracle, target).backward()

contiguous = base.t().contiguous().requires_grad_(True)
liger_cross_entropy(contiguous, target).backward()

print("max |grad - float64 grad|, contiguous logits:", (contiguous.grad.double() - oracle.grad).abs().max().item())
print("max |grad - float64 grad|, strided logits:   ", (strided.grad.double() - oracle.grad).abs().max().item())
print("strided grad[0, :4]:", strided.grad[0, :4].tolist())
print("logits[0, :4]:     ", base.t()[0, :4].tolist())
bad = not torch.allclose(strided.grad.double(), oracle.grad, atol=1e-5)
print("DEFECT: wrong gradient for strided logits" if bad else "ok")
