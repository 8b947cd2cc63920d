import torch
import torch.nn as nn
import torch.nn.functional as F

# Class-weighted cross entropy with ignore_index (padding tokens are -100).
N = 512
C = 100
IGNORE = -100


class Model(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.register_buffer("weight", torch.ones(num_classes))

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, weight=self.weight, ignore_index=IGNORE)


def get_inputs():
    logits = torch.randn(N, C)
    target = torch.randint(0, C, (N,))
    target[torch.rand(N) < 0.1] = IGNORE
    return [logits, target]


def get_init_inputs():
    return [C]
