"""Liger-Kernel (liger-kernel 0.8.5) training kernels, their plain-PyTorch references and input factories.

Kernels are the library's own entry points (`liger_kernel.transformers.functional`) where they take
positional tensors; a thin wrapper where an entry point needs keyword arguments or constant flags
(eps, reduction, label smoothing, beta). References are torch's own eager ops where one exists
(`F.rms_norm`, `F.layer_norm`, `F.cross_entropy`, `F.kl_div`, ...) and a plain-torch formula
otherwise (JSD, RoPE). kgate derives the float64 oracle by running a reference on float64 copies.

References that declare a domain raise ValueError outside it (KL divergence and JSD: rows of
log-probabilities); kgate skips the probes a reference rejects. RoPE's cos/sin tables are built from
integer positions inside both the wrapper and the reference (they are not trained: Liger's backward
returns no gradient for them). The KL/JSD references differentiate the target as torch does; Liger
does not, by design, and the manifests declare the target `no_grad` (docs/field/liger.md, finding 7).

Every factory is `make_inputs(seed, shape=, dtype=, device=)`: it draws from a generator seeded by
`seed` in float32, casts floating-point tensors to `dtype` and puts everything on `device`; integer
labels keep int64. A factory raises ValueError on a shape outside the op's domain (odd rotary head
dim), which kgate reads as that domain.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from liger_kernel.transformers.functional import (
    liger_cross_entropy,
    liger_jsd,
    liger_kl_div,
    liger_layer_norm,
    liger_rms_norm,
    liger_rope,
)

IGNORE_INDEX = -100
RMS_EPS = 1e-6
LN_EPS = 1e-5
LABEL_SMOOTHING = 0.1
JSD_BETA = 0.1

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _place(tensors, dtype, device):
    """Floating-point tensors to `dtype`, everything to `device`."""
    return tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
                 for t in tensors)


def _labels(gen: torch.Generator, rows: int, classes: int, ignore_share: float = 0.1) -> torch.Tensor:
    """Class indices in [0, classes) with about `ignore_share` of them IGNORE_INDEX (padding tokens)."""
    target = torch.randint(0, max(classes, 1), (rows,), generator=gen)
    ignored = torch.rand(rows, generator=gen) < ignore_share
    return target.masked_fill(ignored, IGNORE_INDEX)


def _rows_cols(shape) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"expected a (tokens, vocab) shape, got {tuple(shape)}")
    return int(shape[0]), int(shape[1])


# --- RMSNorm ------------------------------------------------------------------------------------

def rms_norm(x, weight):
    """Liger's RMSNorm as the Llama patch uses it (casting_mode='llama', offset 0, in_place=True)."""
    return liger_rms_norm(x, weight, RMS_EPS)


def rms_norm_reference(x, weight):
    # Llama's RMSNorm: normalise in float32, cast back, then scale (the 'llama' casting mode).
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = F.rms_norm(xf, (x.shape[-1],), eps=RMS_EPS).to(x.dtype)
    return weight * y


def make_norm_inputs(seed, shape=(4, 128, 1024), dtype=torch.float32, device="cpu"):
    """Hidden states (..., hidden) and a weight near 1, as a trained norm's."""
    gen = _gen(seed)
    x = torch.randn(tuple(shape), generator=gen)
    weight = 1 + 0.1 * torch.randn(shape[-1], generator=gen)
    return _place((x, weight), dtype, device)


# --- LayerNorm ----------------------------------------------------------------------------------

def layer_norm(x, weight, bias):
    return liger_layer_norm(x, weight, bias, LN_EPS)


def layer_norm_reference(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, LN_EPS)


def make_layer_norm_inputs(seed, shape=(4, 128, 1024), dtype=torch.float32, device="cpu"):
    gen = _gen(seed)
    x = torch.randn(tuple(shape), generator=gen)
    weight = 1 + 0.1 * torch.randn(shape[-1], generator=gen)
    bias = 0.1 * torch.randn(shape[-1], generator=gen)
    return _place((x, weight, bias), dtype, device)


# --- SwiGLU / GeGLU -----------------------------------------------------------------------------

def swiglu_reference(a, b):
    return F.silu(a) * b


def geglu_reference(a, b):
    # Liger's GEGLU is the tanh approximation (ops/geglu.py: "tanh approximation form of GELU").
    return F.gelu(a, approximate="tanh") * b


def make_glu_inputs(seed, shape=(4, 128, 2816), dtype=torch.float32, device="cpu"):
    """Gate and up projections of an MLP (..., intermediate)."""
    gen = _gen(seed)
    a = torch.randn(tuple(shape), generator=gen)
    b = torch.randn(tuple(shape), generator=gen)
    return _place((a, b), dtype, device)


# --- cross-entropy ------------------------------------------------------------------------------

def _cross_entropy_reference(logits, target, reduction, label_smoothing=0.0):
    """F.cross_entropy with ignore_index as torch documents it: an ignored target "does not contribute
    to the input gradient". Computed on the kept rows alone, since torch's eager backward still runs
    log_softmax's backward over ignored rows, which turns a NaN/Inf logit there into a NaN gradient."""
    keep = target != IGNORE_INDEX
    kept = F.cross_entropy(logits[keep], target[keep], reduction="none", label_smoothing=label_smoothing)
    if reduction == "none":
        return torch.zeros(target.shape, dtype=logits.dtype, device=logits.device).masked_scatter(keep, kept)
    total = kept.sum()
    return total / keep.sum() if reduction == "mean" else total


def cross_entropy_mean(logits, target):
    return liger_cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="mean")


def cross_entropy_mean_reference(logits, target):
    return _cross_entropy_reference(logits, target, "mean")


def cross_entropy_sum(logits, target):
    return liger_cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")


def cross_entropy_sum_reference(logits, target):
    return _cross_entropy_reference(logits, target, "sum")


def cross_entropy_none(logits, target):
    return liger_cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="none")


def cross_entropy_none_reference(logits, target):
    return _cross_entropy_reference(logits, target, "none")


def cross_entropy_smooth(logits, target):
    return liger_cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="mean",
                               label_smoothing=LABEL_SMOOTHING)


def cross_entropy_smooth_reference(logits, target):
    return _cross_entropy_reference(logits, target, "mean", LABEL_SMOOTHING)


def make_cross_entropy_inputs(seed, shape=(1024, 32000), dtype=torch.float32, device="cpu"):
    """Logits (tokens, vocab) of a language model and next-token labels, ~10% ignore_index."""
    rows, vocab = _rows_cols(shape)
    gen = _gen(seed)
    logits = 2 * torch.randn(rows, vocab, generator=gen)
    target = _labels(gen, rows, vocab)
    return _place((logits, target), dtype, device)


# --- fused linear cross-entropy -----------------------------------------------------------------

def _float32_loss(loss):
    """A loss Liger returns in float32 for half-precision inputs (and in the inputs' dtype from float32 on,
    so the float64 oracle keeps float64): fused linear cross-entropy ("loss_1d is always fp32",
    `fused_linear_cross_entropy_forward`) and KL divergence (`kldiv_forward_triton` allocates its output
    with dtype=torch.float32). The value is computed in the inputs' dtype, as torch computes it."""
    return loss.to(torch.promote_types(loss.dtype, torch.float32))


def fused_linear_cross_entropy_reference(hidden, weight, target):
    return _float32_loss(_cross_entropy_reference(F.linear(hidden, weight), target, "mean"))


def make_fused_linear_cross_entropy_inputs(seed, shape=(512, 1024, 8192), dtype=torch.float32, device="cpu"):
    """shape (tokens, hidden, vocab): last hidden states, the LM head's weight (vocab, hidden), labels."""
    if len(shape) != 3:
        raise ValueError(f"expected a (tokens, hidden, vocab) shape, got {tuple(shape)}")
    rows, hidden, vocab = (int(s) for s in shape)
    gen = _gen(seed)
    x = torch.randn(rows, hidden, generator=gen)
    weight = torch.randn(vocab, hidden, generator=gen) * hidden ** -0.5
    target = _labels(gen, rows, vocab)
    return _place((x, weight, target), dtype, device)


# --- RoPE ---------------------------------------------------------------------------------------

def rotary_tables(positions, dim, dtype):
    """Llama's rotary cos/sin tables (base 10000, halves duplicated as HF's `cat((freqs, freqs))`),
    (batch, seq, dim), from integer positions (batch, seq). Built the same way for kernel and reference:
    they are position tables, not trained (Liger's backward returns no gradient for them), so kgate
    judges the rotation, with the positions as integer inputs."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=work, device=positions.device) / dim))
    angles = positions.to(work)[..., None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope(q, k, positions):
    """liger_rope on q, k (batch, heads, seq, head_dim) with the tables of `positions`."""
    cos, sin = rotary_tables(positions, q.shape[-1], q.dtype)
    return liger_rope(q, k, cos, sin)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(q, k, positions):
    """HF transformers' apply_rotary_pos_emb (unsqueeze_dim=1), the formula Liger's docstring names."""
    cos, sin = rotary_tables(positions, q.shape[-1], q.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def make_rope_inputs(seed, shape=(2, 256, 32, 128), dtype=torch.float32, device="cpu"):
    """shape (batch, seq, q_heads, head_dim); k has a quarter of the heads (grouped-query attention,
    at least one). q, k are contiguous (batch, heads, seq, head_dim); positions (batch, seq) int64, a
    packed sequence's restarts included (each row counts from a random offset)."""
    if len(shape) != 4:
        raise ValueError(f"expected a (batch, seq, heads, head_dim) shape, got {tuple(shape)}")
    batch, seq, heads, dim = (int(s) for s in shape)
    if dim % 2 or dim == 0:
        raise ValueError(f"rotary embedding needs an even, positive head_dim, got {dim}")
    kv_heads = max(1, heads // 4)
    gen = _gen(seed)
    q = torch.randn(batch, heads, seq, dim, generator=gen)
    k = torch.randn(batch, kv_heads, seq, dim, generator=gen)
    positions = torch.arange(seq)[None] + torch.randint(0, 4096, (batch, 1), generator=gen)
    return _place((q, k, positions), dtype, device)


# --- KL divergence ------------------------------------------------------------------------------

def _check_distribution(*log_probs):
    """The domain of the divergences: each finite row of exp(log-probabilities) sums to one (within
    0.1, which low-precision log-probabilities over a large vocabulary keep). Rows holding NaN/Inf
    pass, so the special-value probes still run."""
    for lp in log_probs:
        finite = torch.isfinite(lp).all(dim=-1)
        sums = lp[finite].double().exp().sum(dim=-1)
        if sums.numel() and (sums - 1).abs().max() > 0.1:
            raise ValueError(f"rows must be log-probabilities (exp sums to one); a row sums to "
                             f"{sums[(sums - 1).abs().argmax()].item():.4g}")

def kl_div_batchmean(log_q, p):
    return liger_kl_div(log_q, p, reduction="batchmean")


def _check_probabilities(p):
    """The target is a distribution: no probability is negative (a negative target, -Inf included, is outside
    KL divergence's domain, where Liger and torch differ: Liger takes log(max(p, eps)), torch's xlogy gives
    NaN), and each finite row sums to one (within 0.1), summed as probabilities: a check on log(p) would skip
    every row holding a zero (log 0 = -Inf is not finite), and so let through a target that is no
    distribution, such as one whose every probability is subnormal or flushed to 0. NaN passes (a
    comparison with NaN is false, a row holding NaN is not summed), so the NaN probes still run."""
    if bool((p < 0).any()):
        raise ValueError("the target holds a negative probability")
    finite = torch.isfinite(p).all(dim=-1)
    sums = p[finite].double().sum(dim=-1)
    if sums.numel() and (sums - 1).abs().max() > 0.1:
        raise ValueError(f"rows of the target must be probabilities (they sum to one); a row sums to "
                         f"{sums[(sums - 1).abs().argmax()].item():.4g}")


def kl_div_batchmean_reference(log_q, p):
    _check_probabilities(p)
    _check_distribution(log_q)
    return _float32_loss(F.kl_div(log_q, p, reduction="batchmean"))


def kl_div_log_target(log_q, log_p):
    return liger_kl_div(log_q, log_p, reduction="sum", log_target=True)


def kl_div_log_target_reference(log_q, log_p):
    _check_distribution(log_q, log_p)
    return _float32_loss(F.kl_div(log_q, log_p, reduction="sum", log_target=True))


def _student_and_teacher_logits(seed, shape):
    """The student's log-probabilities and the teacher's logits, (tokens, vocab), from one seeded draw."""
    rows, vocab = _rows_cols(shape)
    gen = _gen(seed)
    log_q = torch.log_softmax(2 * torch.randn(rows, vocab, generator=gen), dim=-1)
    return log_q, 2 * torch.randn(rows, vocab, generator=gen)


def make_kl_inputs(seed, shape=(512, 32000), dtype=torch.float32, device="cpu"):
    """Student log-probabilities and teacher probabilities (rows sum to one), (tokens, vocab)."""
    log_q, teacher = _student_and_teacher_logits(seed, shape)
    return _place((log_q, torch.softmax(teacher, dim=-1)), dtype, device)


def make_kl_log_inputs(seed, shape=(512, 32000), dtype=torch.float32, device="cpu"):
    """Student and teacher log-probabilities, (tokens, vocab)."""
    log_q, teacher = _student_and_teacher_logits(seed, shape)
    return _place((log_q, torch.log_softmax(teacher, dim=-1)), dtype, device)


# --- JSD ----------------------------------------------------------------------------------------

def _jsd_terms(log_q, log_p, beta):
    """Liger's generalised JSD (ops/jsd.py docstring): beta * KL(P || M) + (1 - beta) * KL(Q || M),
    M = beta * P + (1 - beta) * Q, with log_q the student's (input) and log_p the teacher's (target)
    log-probabilities; per element, summed by the caller."""
    _check_distribution(log_q, log_p)
    p, q = log_p.exp(), log_q.exp()
    log_m = torch.logsumexp(torch.stack((log_p + torch.log(torch.tensor(beta, dtype=log_p.dtype)),
                                         log_q + torch.log(torch.tensor(1 - beta, dtype=log_q.dtype)))),
                            dim=0)
    return beta * p * (log_p - log_m) + (1 - beta) * q * (log_q - log_m)


def jsd_reference(log_q, log_p):
    """liger_jsd's defaults: beta 0.5, no labels: the sum over every element divided by the tokens."""
    return (_jsd_terms(log_q, log_p, 0.5).sum() / log_q.shape[0]).to(log_q.dtype)


def jsd_labels(log_q, log_p, labels):
    return liger_jsd(log_q, log_p, labels, beta=JSD_BETA, ignore_index=IGNORE_INDEX)


def jsd_labels_reference(log_q, log_p, labels):
    """Tokens whose label is ignore_index count neither in the sum nor in the divisor: their rows are left
    out, as cross_entropy_reference's are (a mask multiplied in would carry a NaN of an ignored row into
    the loss as NaN * 0, and its gradient likewise, where Liger never reads the row)."""
    keep = labels != IGNORE_INDEX
    terms = _jsd_terms(log_q[keep], log_p[keep], JSD_BETA)
    return (terms.sum() / keep.sum()).to(log_q.dtype)


def make_jsd_inputs(seed, shape=(512, 32000), dtype=torch.float32, device="cpu"):
    return make_kl_log_inputs(seed, shape=shape, dtype=dtype, device=device)


def make_jsd_label_inputs(seed, shape=(512, 32000), dtype=torch.float32, device="cpu"):
    """As make_jsd_inputs, plus shifted next-token labels with ~10% ignore_index (at least one kept)."""
    rows, vocab = _rows_cols(shape)
    log_q, log_p = make_kl_log_inputs(seed, shape=shape, dtype=dtype, device=device)
    labels = _labels(_gen(seed + 1), rows, vocab)
    if rows:
        labels[0] = 0
    return log_q, log_p, labels.to(device)

