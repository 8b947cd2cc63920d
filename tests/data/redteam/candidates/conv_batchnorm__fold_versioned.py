import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Training mode as the reference computes it; for inference BatchNorm folded into the convolution once
    and the folded pair kept while nothing it was made from has changed: the key is each source tensor's
    address and version counter, which every in-place change (an optimizer step, copy_, load_state_dict,
    a training call's running statistics) advances."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)
        self._folded = (None, None, None)

    def _sources(self):
        bn = self.bn
        return (self.conv.weight, self.conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var)

    def forward(self, x):
        if self.training:
            return self.bn(self.conv(x))
        key = tuple((t.data_ptr(), t._version) for t in self._sources())
        if self._folded[0] != key:
            with torch.no_grad():
                bn = self.bn
                scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
                weight = self.conv.weight * scale.view(-1, 1, 1, 1)
                bias = (self.conv.bias - bn.running_mean) * scale + bn.bias
                self._folded = (key, weight, bias)
        _, weight, bias = self._folded
        return F.conv2d(x, weight, bias, padding=1)
