"""fla-core 0.6.0: chunk_simple_gla on float32 inputs is about 1e-3 (relative) from the float64 recurrence,
a thousand times float32's rounding: its chunk products run in TF32.

Needs a CUDA GPU (fla's chunk kernels are autotuned, and Triton's autotuner needs a GPU driver).
Run: python chunk_simple_gla_float32_tf32.py

kgate's oracle gate failed fla-chunk-simple-gla in float32 on an H100: "max abs error 0.000231 at
out[0][0, 41, 1, 20] (expected 0.12876, got 0.128529); bound 2.43e-07", and the shapes gate at one token
(1, 1, 1, 64): "max abs error 0.0011 at out[1][0, 0, 11, 38] (expected -0.841527, got -0.840429)" (the
final state). The bound is 8 x the error of the same recurrence computed in float32 (plus a floor).

What fla's code does: `chunk_simple_gla` (`fla/ops/simple_gla/chunk.py`) runs `chunk_fwd_h` and
`chunk_fwd_o` (`fla/ops/common/chunk_h.py`, `chunk_o.py`), whose products are `tl.dot(b_q, b_h, ...)`,
`tl.dot(b_q, b_k, ...)`, `tl.dot(b_A.to(b_v.dtype), b_v)`, ... without `input_precision`. For float32
operands Triton's default precision on NVIDIA GPUs is TF32 (10 mantissa bits, relative rounding ~5e-4
per operand) unless TRITON_F32_DEFAULT says otherwise. fla asks for full float32 in a few kernels only
(`allow_tf32=False` in `ops/ttt`, `ops/generalized_delta_rule/iplr`); nothing in chunk_simple_gla's
docstring says float32 inputs are computed at TF32 precision.

The script runs the same inputs twice in child processes, with Triton's default and with
TRITON_F32_DEFAULT=ieee (full float32 products), and compares output and final state with the
recurrence in float64. A DEFECT line appears when the default's error is far above float32 rounding;
it says whether IEEE products remove it (then TF32 is the cause).
"""

import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

SHAPE = (1, 67, 2, 64)  # (batch, tokens, heads, head_dim): the manifest's first shape


def inputs(seed=0):
    """L2-normalised q, k; v; a scalar log decay per token and head; a float32 initial state."""
    B, T, H, D = SHAPE
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 2)
    h0 = torch.randn(B, H, D, D, generator=gen, dtype=torch.float64)
    return q, k, v, g, h0


def recurrence(q, k, v, g, h0):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = K^-0.5 q_t^T S_t, in float64."""
    state = h0.clone()
    outs = []
    for t in range(q.shape[1]):
        state = state * torch.exp(g[:, t])[..., None, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(q.shape[-1] ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, 1), state


def child():
    from fla.ops.simple_gla import chunk_simple_gla

    args64 = inputs()
    o_want, ht_want = recurrence(*args64)
    q, k, v, g, h0 = (a.float().cuda() for a in args64)
    o, ht = chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    torch.cuda.synchronize()
    result = {}
    for name, got, want in (("o", o, o_want), ("final_state", ht, ht_want)):
        err = (got.double().cpu() - want).abs()
        result[name] = {"err": err.max().item(), "scale": want.abs().max().item()}
    print(json.dumps(result))


def run(precision):
    env = dict(os.environ)
    if precision is not None:
        env["TRITON_F32_DEFAULT"] = precision
    else:
        env.pop("TRITON_F32_DEFAULT", None)
    done = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"child ({precision or 'default'}) failed:\n{done.stderr[-2000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    eps32 = torch.finfo(torch.float32).eps
    default, ieee = run(None), run("ieee")
    if default is None:
        return
    for name in ("o", "final_state"):
        d = default[name]
        line = f"{name}: float32 inputs {SHAPE}, max |error| vs float64: Triton default {d['err']:.3g}"
        if ieee is not None:
            line += f", TRITON_F32_DEFAULT=ieee {ieee[name]['err']:.3g}"
        print(line + f" (max |float64| {d['scale']:.3g}; float32 eps {eps32:.3g})")
        rel = d["err"] / d["scale"]
        if rel > 64 * eps32:
            cause = "unknown (no IEEE run)"
            if ieee is not None:
                rel_ieee = ieee[name]["err"] / ieee[name]["scale"]
                cause = (f"IEEE float32 products bring it to {rel_ieee:.2g}: the TF32 products are the cause"
                         if rel_ieee < rel / 16 else f"it stays {rel_ieee:.2g} with IEEE products: not TF32 alone")
            print(f"DEFECT chunk_simple_gla float32 {name}: relative error {rel:.2g} = {rel / eps32:.0f} x float32 "
                  f"eps; {cause}")


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
