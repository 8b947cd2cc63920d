import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """MLP whose hidden activations are clamped to float16's range, so that the fused epilogue is safe to
    store in half precision."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        h = self.fc1(x).clamp(-65504.0, 65504.0)
        return self.fc2(F.gelu(h))
