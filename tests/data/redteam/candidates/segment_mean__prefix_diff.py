import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Global mean pooling in O(N) with no scatter: for a sorted batch vector, one inclusive prefix
    sum over the rows, and each graph's sum is the difference of the prefix at its last and first
    row. Unsorted batch vectors, and inputs with a non-finite value (which the prefix would carry into
    every later graph), fall back to index_add."""

    def __init__(self, num_segments):
        super().__init__()
        self.num_segments = num_segments

    def forward(self, x, batch):
        batch = batch.long()
        counts = torch.bincount(batch, minlength=self.num_segments)
        denom = counts.clamp(min=1).to(x.dtype).unsqueeze(1)
        unsorted = batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any())
        if unsorted or not bool(torch.isfinite(x).all()):
            total = x.new_zeros(self.num_segments, x.shape[1]).index_add_(0, batch, x)
            return total / denom
        prefix = torch.cat((x.new_zeros(1, x.shape[1]), torch.cumsum(x, dim=0)), dim=0)
        ends = torch.cumsum(counts, dim=0)
        starts = ends - counts
        return (prefix[ends] - prefix[starts]) / denom
