"""liger-kernel 0.8.5: liger_swiglu and liger_geglu write their gradients into the caller's gate and up
tensors (a, b) during backward, without bumping the tensors' version counters, so autograd never notices:
the caller's a and b hold da and db afterwards, a second backward through the same graph
(retain_graph=True) silently computes from the gradients instead of the activations, and any other op of
the graph that saved a or b for its own backward reads the gradients instead.

Needs a CUDA GPU (Triton's interpreter cannot run these kernels: `gate_multiplier.to(tl.float32)` on a
Python float, and libdevice's `tanh` returns None there).
Run: python swiglu_geglu_backward_overwrites_inputs.py

What Liger's code does (`liger_kernel/ops/swiglu.py`, `LigerSiLUMulFunction`; `ops/geglu.py`,
`LigerGELUMulFunction`): forward saves a and b themselves (`ctx.save_for_backward(a, b)`; `ensure_contiguous`
copies only non-contiguous tensors); backward recomputes the activation from them ("recomputation to save
memory") and `_swiglu_backward_kernel` / `_geglu_tanh_backward_kernel` store da into `a_ptr` and db into
`b_ptr`, then return a and b as the gradients. A Triton store is not an autograd in-place op, so the
version counters stay as they were. The fused gate-up variant in the same file
(`LigerFusedGateUpSiLUMulFunction`) writes in place only when asked (`in_place=False` by default) and
raises on a second backward, because "Triton writes bypass autograd's version counter, so a second backward
would silently read gradients instead of activations and produce wrong results"; `LigerSiLUMulFunction`
and `LigerGELUMulFunction` have neither the option nor the guard, and their docstrings say nothing of it.

For each op the script checks three things against float64 autograd of `F.silu(a) * b` /
`F.gelu(a, approximate="tanh") * b` (float32 on the GPU), and prints a DEFECT line for each one seen:
1. the caller's a and b after one backward;
2. the gradients of a second backward with retain_graph=True;
3. the gradient of w in `loss = (a * w).sum() + (op(a, b) * dc).sum()`: autograd runs the op's backward
   (created later) before `a * w`'s, which then multiplies by the saved a, now holding da.
"""

import torch
import torch.nn.functional as F
from liger_kernel.transformers.functional import liger_geglu, liger_swiglu

DEV = "cuda"
SHAPE = (4, 256)


def reference(name, a, b):
    return F.silu(a) * b if name == "swiglu" else F.gelu(a, approximate="tanh") * b


def float64_grads(name, a, b, dc):
    a64, b64 = (t.detach().double().requires_grad_(True) for t in (a, b))
    return torch.autograd.grad(reference(name, a64, b64), (a64, b64), dc.double())


def off(got, want):
    """Largest error relative to the largest float64 value (float32 rounding gives about 1e-7)."""
    return float((got.detach().double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def leaves(seed):
    gen = torch.Generator().manual_seed(seed)
    a, b, dc = (torch.randn(SHAPE, generator=gen) for _ in range(3))
    return a.to(DEV).requires_grad_(True), b.to(DEV).requires_grad_(True), dc.to(DEV)


def main():
    for name, op in (("swiglu", liger_swiglu), ("geglu", liger_geglu)):
        # 1. the caller's inputs after one backward
        a, b, dc = leaves(0)
        a0, b0 = a.detach().clone(), b.detach().clone()
        op(a, b).backward(dc)
        torch.cuda.synchronize()
        changed = [n for n, t, t0 in (("a", a, a0), ("b", b, b0)) if not torch.equal(t.detach(), t0)]
        want_da, want_db = float64_grads(name, a0, b0, dc)
        print(f"{name}: after backward, a {'changed' if 'a' in changed else 'unchanged'} "
              f"(now {off(a.detach(), want_da):.2g} from da, relative), b "
              f"{'changed' if 'b' in changed else 'unchanged'} (now {off(b.detach(), want_db):.2g} from db)")
        if changed:
            print(f"DEFECT {name}: backward overwrote the caller's {' and '.join(changed)} with the "
                  f"gradients (version counters {a._version}, {b._version}: autograd was not told)")

        # 2. a second backward through the same graph
        a, b, dc = leaves(1)
        want = float64_grads(name, a, b, dc)
        c = op(a, b)
        first = [g.clone() for g in torch.autograd.grad(c, (a, b), dc, retain_graph=True)]
        second = [g.clone() for g in torch.autograd.grad(c, (a, b), dc)]
        torch.cuda.synchronize()
        e1 = max(off(g, w) for g, w in zip(first, want))
        e2 = max(off(g, w) for g, w in zip(second, want))
        print(f"{name}: retain_graph: first backward's gradients {e1:.2g} from float64, second's {e2:.2g}")
        if e2 > 1e-3 and e1 < 1e-3:
            print(f"DEFECT {name}: a second backward (retain_graph=True) returns wrong gradients ({e2:.2g} "
                  "relative), without an error")

        # 3. another op that saved a for its own backward
        a, b, dc = leaves(2)
        a0 = a.detach().clone()
        w = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3)).to(DEV).requires_grad_(True)
        loss = (a * w).sum() + (op(a, b) * dc).sum()
        loss.backward()
        torch.cuda.synchronize()
        ew = off(w.grad, a0.double())  # d loss / d w = a
        print(f"{name}: gradient of w in (a * w).sum() + (op(a, b) * dc).sum(): {ew:.2g} from float64")
        if ew > 1e-3:
            print(f"DEFECT {name}: another op's gradient is wrong ({ew:.2g} relative): it read the a that "
                  "Liger's backward overwrote, and autograd raised no in-place error")


if __name__ == "__main__":
    main()
