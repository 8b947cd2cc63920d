# Violating: scores every row against class 0, whatever its target.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        logp = predictions - torch.logsumexp(predictions, dim=1, keepdim=True)
        return -logp[:, 0].mean()
