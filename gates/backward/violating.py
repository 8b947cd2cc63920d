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
