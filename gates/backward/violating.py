"""backward, violating control: a right forward with a wrong backward."""

import torch


class _SiLUWrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        """d/dx [x * sigmoid(x)] taken as sigmoid(x): the product rule's second term is forgotten.
        Every forward test passes; training silently follows the wrong gradient."""
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


def silu_wrong_backward(x):
    return _SiLUWrongGrad.apply(x)


class _KLDivStudentWrongSign(torch.autograd.Function):
    """KL divergence whose backward returns None for the declared `no_grad` target, as it may, but the
    student's gradient with its sign flipped (p * grad for -p * grad): declaring the target must not
    hide an error in the other gradients."""

    @staticmethod
    def forward(ctx, log_q, p):
        ctx.save_for_backward(p)
        return torch.nn.functional.kl_div(log_q, p, reduction="sum")

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * grad, None


def kl_div_student_wrong_sign(log_q, p):
    return _KLDivStudentWrongSign.apply(log_q, p)
