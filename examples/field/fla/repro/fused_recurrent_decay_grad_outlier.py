"""fla-core 0.6.0: the decay gradient of fused_recurrent_simple_gla and fused_recurrent_gla loses every
digit when one token's value vector is large, although the exact decay gradient does not depend on it.

Needs a CUDA GPU. Run: python fused_recurrent_decay_grad_outlier.py

kgate's distributions gate failed both kernels' backward in bfloat16 at its 'huge' magnitudes, shape
(1, 67, 2, 64), in the decay gradient (out[3]): fused_recurrent_simple_gla "expected -0.424335, got 1024",
fused_recurrent_gla "expected -564.197, got -132096", shrunk to large values of v at the last token.

What fla's code does: the backward (`fla/ops/common/fused_recurrent.py`, `fused_recurrent_bwd_kernel`)
forms the decay gradient as a running sum over reversed time of `q_t . dq_t - k_t . dk_t` (per key for
GLA), an identity of exact arithmetic. With S_t = exp(g_t) S_{t-1} + k_t v_t^T, both terms hold
(q_t . k_t)(v_t . do_t), which cancel exactly: the true gradient is exp(g_t) <S_{t-1}, dS_t>, free of
v_t. In float32 the two terms leave a residue of their own size (eps x |q||k||v_t||do_t|), which the
running sum carries to every earlier token. Autograd of the recurrence forms exp(g_t) <S_{t-1}, dS_t>
directly and stays at float32 rounding whatever v_t is.

The script scales v at the last token by 1, 1e2, ..., 1e5 (float32 inputs, L2-normalised q and k, a
normal cotangent for the output and the final state) and compares each kernel's decay gradient with
autograd of the recurrence in float64, beside the same recurrence's autograd in float32. A DEFECT line
appears when the kernel's error grows with the outlier while the float32 recurrence's does not.
"""

import torch
import torch.nn.functional as F

SHAPE = (1, 67, 2, 64)  # (batch, tokens, heads, head_dim): the manifest's first shape
SCALES = (1.0, 1e2, 1e3, 1e4, 1e5)


def inputs(per_key, scale, seed=0):
    B, T, H, D = SHAPE
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    v[:, -1] *= scale
    gshape = (B, T, H, D) if per_key else (B, T, H)
    g = F.logsigmoid(torch.randn(*gshape, generator=gen, dtype=torch.float64) + 2) / (16 if per_key else 1)
    h0 = torch.randn(B, H, D, D, generator=gen, dtype=torch.float64)
    do = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    dht = torch.randn(B, H, D, D, generator=gen, dtype=torch.float64)
    return (q, k, v, g, h0), (do, dht)


def recurrence(q, k, v, g, h0):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = K^-0.5 q_t^T S_t, in the inputs' dtype."""
    state = h0.clone()
    outs = []
    for t in range(q.shape[1]):
        decay = torch.exp(g[:, t])
        decay = decay[..., :, None] if g.dim() == 4 else decay[..., None, None]
        state = state * decay + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(q.shape[-1] ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, 1), state


def decay_grad(fn, args, cots, device, dtype):
    leaves = [a.detach().to(device=device, dtype=dtype).clone().requires_grad_(True) for a in args]
    o, ht = fn(*leaves)
    torch.autograd.backward((o, ht), (cots[0].to(device=device, dtype=o.dtype),
                                      cots[1].to(device=device, dtype=ht.dtype)))
    return leaves[3].grad.double().cpu()


def main():
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: fla's kernels are Triton GPU kernels")
        return
    from fla.ops.gla import fused_recurrent_gla
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    kernels = {
        "fused_recurrent_simple_gla": (False, lambda q, k, v, g, h0: fused_recurrent_simple_gla(
            q, k, v, g, initial_state=h0, output_final_state=True)),
        "fused_recurrent_gla": (True, lambda q, k, v, g, h0: fused_recurrent_gla(
            q, k, v, gk=g, initial_state=h0, output_final_state=True)),
    }
    for name, (per_key, kernel) in kernels.items():
        rows = []
        for scale in SCALES:
            args, cots = inputs(per_key, scale)
            want = decay_grad(recurrence, args, cots, "cpu", torch.float64)
            ref32 = decay_grad(recurrence, args, cots, "cpu", torch.float32)
            got = decay_grad(kernel, args, cots, "cuda", torch.float32)
            rows.append((scale, want.abs().max().item(), (got - want).abs().max().item(),
                         (ref32 - want).abs().max().item()))
            print(f"{name}: v[:, -1] x {scale:g}: max |dg| (float64) {rows[-1][1]:.4g}; max |error|: "
                  f"fla {rows[-1][2]:.3g}, float32 recurrence {rows[-1][3]:.3g}")
        base, top = rows[0], rows[-1]
        if top[2] > 64 * max(top[3], 1e-30) and top[2] > 16 * base[2]:
            print(f"DEFECT {name} float32: with v at the last token x {top[0]:g} the decay gradient's error is "
                  f"{top[2]:.3g} (x{top[2] / base[2]:.3g} its error at x1) against {top[3]:.3g} for the float32 "
                  f"recurrence's autograd, while the exact gradient stays {top[1]:.3g} (it was {base[1]:.3g})")


if __name__ == "__main__":
    main()
