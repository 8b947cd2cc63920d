import torch
import torch.nn as nn

# 2x learned upsampling of a 1-D feature sequence (vocoder / decoder style).
B = 8
CIN = 32
COUT = 16
L = 256
K = 4
STRIDE = 2
PAD = 1


class Model(nn.Module):
    def __init__(self, cin, cout, k, stride, pad):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, k, stride=stride, padding=pad)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(B, CIN, L)]


def get_init_inputs():
    return [CIN, COUT, K, STRIDE, PAD]
