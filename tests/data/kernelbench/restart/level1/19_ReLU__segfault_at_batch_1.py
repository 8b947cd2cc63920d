# Correct, except that a batch of one crashes the process (SIGSEGV), as an out-of-bounds kernel can:
# the gate that finds it gets the error, and a fresh worker judges the gates after it.
import ctypes

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if x.shape[0] == 1:
            ctypes.string_at(0)
        return torch.relu(x)
