import torch.nn as nn
import torch.nn.functional as F


def _pack(w):
    # (Cin, Cout, K) transposed-conv weight -> flipped (Cout, Cin, K) conv weight
    return w.detach().flip(-1).transpose(0, 1).contiguous()


class ModelNew(nn.Module):
    """Transposed conv as zero-insertion + direct conv with the flipped kernel.
    In inference (eval) mode the flipped kernel is pre-packed once and
    reused; in training mode it is repacked every call."""

    def __init__(self, cin, cout, k, stride, pad):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, k, stride=stride, padding=pad)
        self._packed_eval = None

    def forward(self, x):
        w = self.conv.weight
        if self.training:
            wf = _pack(w)
        else:
            if self._packed_eval is None:
                self._packed_eval = _pack(w)
            wf = self._packed_eval
        s, p = self.conv.stride[0], self.conv.padding[0]
        kk = w.shape[-1]
        b, cin, n = x.shape
        up = x.new_zeros(b, cin, (n - 1) * s + 1)
        up[..., ::s] = x
        return F.conv1d(up, wf, self.conv.bias, padding=kk - 1 - p)
