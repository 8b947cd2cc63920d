import torch
import torch.nn as nn


class Model(nn.Module):
    """Cross-entropy of (batch_size, num_classes) logits against int64 class indices (upstream level 1,
    problem 95, at small sizes): the targets must stay valid indices."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


batch_size = 16
num_classes = 10
input_shape = (num_classes,)
dim = 1


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
