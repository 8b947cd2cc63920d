"""flash-linear-attention (fla-core 0.6.0) beyond the GDN fixture: simple GLA and GLA, chunked and
fused-recurrent, and the fused-recurrent gated delta rule, with plain-PyTorch recurrences as references.

Every kernel returns (o, final_state) and takes the initial state as its last argument, as the GDN
fixture's entries do (fixtures/gdn/kgate_entry.py), whose factories, references (the naive recurrence
of fixtures/gdn/naive.py, computed in the inputs' own dtype) and domain check are reused here: the
scalar-gate kernels are judged against them directly. GLA's gate is per key (B, T, H, K), which the
naive recurrence does not take; `gla_reference` is that recurrence with a per-key decay.

fla is imported when a kernel is first called, so the manifests load (and the references run) where
fla's Triton kernels cannot: most are autotuned, and Triton's autotuner asks the GPU driver for a
benchmarker, which Triton's CPU interpreter lacks (docs/field/fla.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: fixtures.gdn

from fixtures.gdn.kgate_entry import DEFAULT_SHAPE, check_domain, make_inputs_gla  # noqa: E402

# --- simple GLA (one scalar log decay per token and head) ---------------------------------------

def chunk_simple_gla(q, k, v, g, h0):
    from fla.ops.simple_gla import chunk_simple_gla as fla_chunk_simple_gla

    return fla_chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True)


def fused_recurrent_simple_gla(q, k, v, g, h0):
    from fla.ops.simple_gla import fused_recurrent_simple_gla as fla_fused_recurrent_simple_gla

    return fla_fused_recurrent_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True)


# --- GLA (a log decay per token, head and key) ---------------------------------------------------

def chunk_gla(q, k, v, gk, h0):
    from fla.ops.gla import chunk_gla as fla_chunk_gla

    return fla_chunk_gla(q, k, v, gk, initial_state=h0, output_final_state=True)


def fused_recurrent_gla(q, k, v, gk, h0):
    from fla.ops.gla import fused_recurrent_gla as fla_fused_recurrent_gla

    return fla_fused_recurrent_gla(q, k, v, gk=gk, initial_state=h0, output_final_state=True)


def gla_reference(q, k, v, gk, h0):
    """S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T, o_t = scale * q_t^T S_t (scale K^-0.5), in the inputs'
    dtype (float64 for the oracle); the final state in at least float32, as fla returns it. The domain:
    gk is a log decay (<= 0), head dims the GDN family's."""
    check_domain(k, gk, None, False)
    B, T, H, K = q.shape
    cd = q.dtype
    state = h0.to(cd).clone()
    outs = []
    for t in range(T):
        state = state * torch.exp(gk[:, t].to(cd))[..., :, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(K ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, v.shape[-1])
    return o.to(v.dtype), state.to(torch.promote_types(h0.dtype, torch.float32))


def make_gla_inputs(seed, shape=None, dtype=None, device=None):
    """(q, k, v, gk, h0), shape (B, T, H, D): the GDN fixture's q, k, v and h0, and a per-key log decay
    gk = logsigmoid(x) / 16 (fla's GLA layer divides its log-sigmoid gate by a normaliser of 16)."""
    q, k, v, _, h0 = make_inputs_gla(seed, shape=shape, dtype=dtype, device=device)
    B, T, H, D = shape or DEFAULT_SHAPE
    gen = torch.Generator().manual_seed(seed + 1)
    gk = F.logsigmoid(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)) / 16
    return q, k, v, gk.to(dtype=q.dtype, device=q.device), h0


# --- gated delta rule, fused recurrent (forward only: fla raises in its backward) ----------------

def fused_recurrent_gated_delta_rule(q, k, v, g, beta, h0):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_fused_recurrent_gdr

    return fla_fused_recurrent_gdr(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True)
