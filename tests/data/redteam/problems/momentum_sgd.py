import torch
import torch.nn as nn


class Model(nn.Module):
    """One Nesterov-momentum SGD step as a module holding the parameter and its momentum buffer.

    forward(grad), in place:  buf = momentum * buf + grad;  p = p - lr * (grad + momentum * buf);
    returns a copy of the new parameter."""

    def __init__(self, numel, lr=0.05, momentum=0.9):
        super().__init__()
        self.lr, self.momentum = lr, momentum
        self.param = nn.Parameter(torch.randn(numel))
        self.register_buffer("buf", torch.zeros(numel))

    def forward(self, grad):
        with torch.no_grad():
            self.buf.mul_(self.momentum).add_(grad)
            self.param.sub_(self.lr * (grad + self.momentum * self.buf))
            return self.param.detach().clone()


numel = 2048


def get_inputs():
    return [torch.randn(numel)]


def get_init_inputs():
    return [numel]
