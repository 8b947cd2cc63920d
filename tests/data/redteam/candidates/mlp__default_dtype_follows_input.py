import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """MLP whose scratch tensors follow the input's dtype: the default dtype is set from the input."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        torch.set_default_dtype(x.dtype)
        h = torch.zeros(x.shape[0], self.fc1.out_features, device=x.device)
        torch.addmm(self.fc1.bias, x, self.fc1.weight.t(), out=h)
        return self.fc2(F.gelu(h))
