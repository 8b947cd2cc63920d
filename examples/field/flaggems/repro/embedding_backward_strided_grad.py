"""FlagGems 5.0.2: embedding_backward with a cotangent that is not contiguous (a transposed or permuted
gradient, as autograd passes on from a `.transpose()` after the lookup) returns a wrong weight gradient;
torch's embedding backward takes any layout.

Needs a CUDA GPU (FlagGems does not import without one). Run: python embedding_backward_strided_grad.py

What FlagGems' code does (`flag_gems/ops/embedding.py`): `embedding_backward_kernel` finds token `pid`'s
gradient row at `grad_out + pid * N` and reads its N columns at unit stride, and `embedding_backward` passes
`grad_outputs` as given, neither made contiguous nor with its strides. A cotangent whose last dimension is
not the innermost in memory is read as if it were, so the rows added into the weight gradient are mixtures
of other tokens' gradients.

The script computes the weight gradient of one lookup for a permuted cotangent and for its contiguous
copy, through FlagGems and through torch's autograd, and compares each with float64.
"""

import flag_gems
import torch
import torch.nn.functional as F

DEV = "cuda"


def torch_grad(weight, indices, dy):
    w = weight.detach().clone().requires_grad_(True)
    F.embedding(indices, w).backward(dy)
    return w.grad


def main():
    gen = torch.Generator().manual_seed(0)
    num, dim = 100, 16
    weight = torch.randn(num, dim, generator=gen).to(DEV)
    indices = torch.randint(0, num, (8, 12), generator=gen).to(DEV)
    permuted = torch.randn(dim, 8, 12, generator=gen).to(DEV).permute(1, 2, 0)  # (8, 12, 16), not contiguous
    assert not permuted.is_contiguous()
    want = torch_grad(weight.double(), indices, permuted.double())
    for name, dy in (("permuted cotangent", permuted), ("contiguous copy", permuted.contiguous())):
        got = flag_gems.embedding_backward(dy, indices, num, -1, False, False)
        ref = torch_grad(weight, indices, dy)
        torch.cuda.synchronize()
        gems_err = (got.double() - want).abs().max().item()
        torch_err = (ref.double() - want).abs().max().item()
        print(f"{name:19s} (strides {dy.stride()}): max abs error FlagGems {gems_err:.3g}, torch {torch_err:.3g}")
        if gems_err > 100 * max(torch_err, 1e-6):
            print(f"DEFECT embedding_backward with a {name}: weight gradient off by {gems_err:.3g} "
                  f"(torch {torch_err:.3g})")


if __name__ == "__main__":
    main()
