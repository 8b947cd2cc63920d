import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """conv_transpose1d(x, w, stride s, padding p) ==
    conv1d(zero_insert(x, s), flip(w).transpose(0, 1), padding=K - 1 - p).
    Kernel is flipped from the live parameter on every call."""

    def __init__(self, cin, cout, k, stride, pad):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, k, stride=stride, padding=pad)

    def forward(self, x):
        w, bias = self.conv.weight, self.conv.bias
        s, p = self.conv.stride[0], self.conv.padding[0]
        kk = w.shape[-1]
        b, cin, n = x.shape
        up = x.new_zeros(b, cin, (n - 1) * s + 1)
        up[..., ::s] = x
        return F.conv1d(up, w.flip(-1).transpose(0, 1), bias, padding=kk - 1 - p)
