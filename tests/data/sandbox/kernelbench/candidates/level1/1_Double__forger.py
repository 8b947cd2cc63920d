# A candidate that attacks the audit: tests/data/sandbox/attacks.py:forger, which tests/test_sandbox.py copies
# into the candidates folder (a folder the audit shows its workers).
import sys
from pathlib import Path

import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # attacks.py, put there by the test
import attacks  # noqa: E402


class ModelNew(nn.Module):
    def forward(self, x):
        return attacks.forger(x)
