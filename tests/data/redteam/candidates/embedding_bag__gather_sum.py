import torch.nn as nn


class ModelNew(nn.Module):
    """EmbeddingBag (mean) as one flat index_select of all rows, a view as (bags, bag_size, dim) (every size
    written out, so an empty batch views too) and a sum over the bag divided by the bag size (no per-bag
    offsets needed for fixed-size bags)."""

    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        self.bag = nn.EmbeddingBag(num_embeddings, embedding_dim, mode="mean")

    def forward(self, indices):
        indices = indices.long()
        rows = self.bag.weight.index_select(0, indices.reshape(-1))
        rows = rows.view(*indices.shape, rows.shape[-1])
        return rows.sum(dim=-2) / indices.shape[-1]
