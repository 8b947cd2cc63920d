"""backward, correct control: SiLU as a torch.autograd.Function with a hand-written backward that is
right. Also holds the reference and inputs factory."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 40), generator=gen, dtype=torch.float64) * 3
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.nn.functional.silu(x)


class _SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * s * (1 + x * (1 - s))


def silu(x):
    return _SiLU.apply(x)


# -- an argument that gets no gradient by contract (`no_grad: [1]`) ----------------------------------------

def make_kl_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """A student's log-probabilities and a teacher's probabilities, rows over the last dimension."""
    gen = torch.Generator().manual_seed(seed)
    shape = shape or (6, 40)
    log_q = torch.log_softmax(2 * torch.randn(shape, generator=gen, dtype=torch.float64), dim=-1)
    p = torch.softmax(2 * torch.randn(shape, generator=gen, dtype=torch.float64), dim=-1)
    return log_q.to(dtype=dtype, device=device), p.to(dtype=dtype, device=device)


def kl_div_reference(log_q, p):
    return torch.nn.functional.kl_div(log_q, p, reduction="sum")


def student_gradient(log_q, p, grad):
    """d/d log_q of KL(p || q) times `grad`, as torch's own kl_div differentiates it."""
    with torch.enable_grad():
        leaf = log_q.detach().requires_grad_(True)
        (d_log_q,) = torch.autograd.grad(kl_div_reference(leaf, p), leaf, grad)
    return d_log_q


class _KLDivStudentOnly(torch.autograd.Function):
    """KL divergence for distillation: the teacher's distribution `p` is data, so backward returns None for
    it (as Liger-Kernel's ops/kl_div.py and ops/jsd.py do); the manifest declares it `no_grad: [1]`."""

    @staticmethod
    def forward(ctx, log_q, p):
        ctx.save_for_backward(log_q, p)
        return kl_div_reference(log_q, p)

    @staticmethod
    def backward(ctx, grad):
        log_q, p = ctx.saved_tensors
        return student_gradient(log_q, p, grad), None


def kl_div_student_only(log_q, p):
    return _KLDivStudentOnly.apply(log_q, p)
