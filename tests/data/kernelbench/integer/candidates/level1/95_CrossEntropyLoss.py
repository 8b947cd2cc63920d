# Correct: log-softmax (the row's maximum subtracted first, as torch does), the target's entry gathered,
# averaged over the batch.
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        shifted = predictions - predictions.amax(dim=1, keepdim=True)
        logp = shifted - shifted.exp().sum(dim=1, keepdim=True).log()
        return -logp.gather(1, targets.unsqueeze(1)).mean()
