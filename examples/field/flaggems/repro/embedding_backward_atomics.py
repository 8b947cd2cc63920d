"""FlagGems 5.0.2: embedding_backward sums the cotangent rows of repeated tokens with float atomics, so its weight
gradient (1) loses every subnormal value and (2) differs in its last bits from call to call; torch's CUDA
embedding backward keeps the subnormals and gives the same bits every call.

Needs a CUDA GPU (FlagGems does not import without one). Run: python embedding_backward_atomics.py

What FlagGems' code does (`flag_gems/ops/embedding.py`): `embedding_backward_kernel` runs one program per
token and adds its cotangent row into the weight gradient's row with `tl.atomic_add`, which compiles to PTX
`atom`/`red.global.add.f32`. Those flush subnormal inputs and results to sign-preserving zero (PTX ISA,
"atom": ".add.f32 ... flushes subnormal inputs and results"), and the order in which the tokens' additions land
changes from launch to launch. torch's CUDA path sorts the indices and sums each row's tokens in one order.

The script (a) gives a cotangent scaled into float32's subnormal range and counts the gradient elements that
are subnormal in float64 but 0 in FlagGems' result and in torch's; (b) calls both twice on one normal cotangent
with many repeated tokens and counts the elements that differ between the calls.
"""

import flag_gems
import torch
import torch.nn.functional as F

DEV = "cuda"


def torch_grad(num, indices, dy):
    w = torch.zeros(num, dy.shape[-1], device=dy.device, dtype=dy.dtype, requires_grad=True)
    F.embedding(indices, w).backward(dy)
    return w.grad


def main():
    gen = torch.Generator().manual_seed(0)
    num, dim = 64, 128
    indices = torch.randint(0, num, (16, 256), generator=gen).to(DEV)  # about 64 tokens per row
    tiny = torch.finfo(torch.float32).tiny
    dy = (torch.randn(16, 256, dim, generator=gen, dtype=torch.float64) * tiny / 64).to(DEV)
    want = torch_grad(num, indices, dy)  # float64: the exact sums
    subnormal = (want.abs() < tiny) & (want != 0)
    for name, got in (("FlagGems", flag_gems.embedding_backward(dy.float(), indices, num, -1, False, False)),
                      ("torch", torch_grad(num, indices, dy.float()))):
        lost = int((subnormal & (got == 0)).sum())
        print(f"{name}: {lost} of {int(subnormal.sum())} subnormal gradient elements returned as 0")
        if name == "FlagGems" and lost > subnormal.sum() // 2:
            print(f"DEFECT embedding_backward flushes subnormal gradients to zero ({lost} of {int(subnormal.sum())})")
    dy = torch.randn(16, 256, dim, generator=gen).to(DEV)
    for name, call in (("FlagGems", lambda: flag_gems.embedding_backward(dy, indices, num, -1, False, False)),
                       ("torch", lambda: torch_grad(num, indices, dy))):
        first, second = call(), call()
        torch.cuda.synchronize()
        differ = int((first != second).sum())
        print(f"{name}: {differ} of {first.numel()} gradient elements differ between two calls")
        if name == "FlagGems" and differ:
            print(f"DEFECT embedding_backward is not deterministic ({differ} elements differ between two calls)")


if __name__ == "__main__":
    main()
