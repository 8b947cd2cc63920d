# Swaps torch.relu, which the reference calls too, for a wrong one: the reference, the oracle and the
# candidate then agree on the wrong answer. The audit must notice that torch was patched.
import torch
import torch.nn as nn

_real_relu = torch.relu
torch.relu = lambda x: _real_relu(x) * 0.5


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
