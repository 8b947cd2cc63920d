import torch
import torch.nn as nn

VEC = 4


class ModelNew(nn.Module):
    """The step over (n // 4, 4) vectors in place, the ragged n % 4 elements in an epilogue."""

    def __init__(self, numel, lr=0.05, momentum=0.9):
        super().__init__()
        self.lr, self.momentum = lr, momentum
        self.param = nn.Parameter(torch.randn(numel))
        self.register_buffer("buf", torch.zeros(numel))

    def forward(self, grad):
        n = self.param.numel()
        bulk = n - n % VEC
        with torch.no_grad():
            p, b, g = self.param.view(-1), self.buf.view(-1), grad.reshape(-1)
            if bulk:
                bv, gv, pv = b[:bulk].view(-1, VEC), g[:bulk].view(-1, VEC), p[:bulk].view(-1, VEC)
                bv.mul_(self.momentum).add_(gv)
                pv.sub_(self.lr * (gv + self.momentum * bv))
            if bulk < n:  # epilogue
                tail = b[bulk:].mul(self.momentum).add_(g[bulk:])
                p[bulk:].sub_(self.lr * (g[bulk:] + self.momentum * tail))
            return self.param.detach().clone()
