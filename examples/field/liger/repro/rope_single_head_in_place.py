"""liger-kernel 0.8.5: liger_rope overwrites the caller's q/k (and returns a view of them) when a
contiguous (batch, heads, seq, head_dim) tensor has one head or one position (multi-query attention's
single KV head, a decoding step), and leaves them alone otherwise.

rope_forward transposes to (batch, seq, heads, head_dim) and calls .contiguous(), a copy only when that
transpose is not contiguous; the Triton kernel then writes its result in place. With heads == 1 or
seq == 1 the transpose is already contiguous, so the kernel rotates the caller's tensor.

Run: python rope_single_head_in_place.py   (CPU: TRITON_INTERPRET=1; or on a GPU)
"""

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.transformers.functional import liger_rope  # noqa: E402

torch.manual_seed(0)
batch, seq, dim = 1, 5, 16
q = torch.randn(batch, 4, seq, dim, device=DEVICE)       # 4 query heads
k = torch.randn(batch, 1, seq, dim, device=DEVICE)       # 1 KV head (multi-query attention)
pos = torch.arange(seq, device=DEVICE, dtype=torch.float64)[:, None]
inv = 1.0 / 10000 ** (torch.arange(0, dim, 2, device=DEVICE, dtype=torch.float64) / dim)
emb = torch.cat((pos * inv, pos * inv), dim=-1)[None]
cos, sin = emb.cos().float(), emb.sin().float()
q0, k0 = q.clone(), k.clone()
q_out, k_out = liger_rope(q, k, cos, sin)
print("q (4 heads) unchanged:", torch.equal(q, q0))
print("k (1 head)  unchanged:", torch.equal(k, k0), "| k_out shares k's memory:", k_out.data_ptr() == k.data_ptr())
print("DEFECT: input overwritten" if not torch.equal(k, k0) else "ok")
