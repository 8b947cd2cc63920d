import torch
import torch.nn as nn


class Model(nn.Module):
    """Cartesian to polar coordinates: magnitude and angle of (re, im), stacked on a new leading dim."""

    def forward(self, re, im):
        return torch.stack((torch.hypot(re, im), torch.atan2(im, re)), dim=0)


rows = 64
cols = 64


def get_inputs():
    return [torch.randn(rows, cols), torch.randn(rows, cols)]


def get_init_inputs():
    return []
