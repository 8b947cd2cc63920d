import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean of the embedding rows of every fixed-size bag of indices."""

    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        self.bag = nn.EmbeddingBag(num_embeddings, embedding_dim, mode="mean")

    def forward(self, indices):
        return self.bag(indices.long())  # KernelBench's harness casts every input tensor to float32


num_embeddings = 512
embedding_dim = 16
num_bags = 32
bag_size = 8


def get_inputs():
    return [torch.randint(0, num_embeddings, (num_bags, bag_size))]


def get_init_inputs():
    return [num_embeddings, embedding_dim]
