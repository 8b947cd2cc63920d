"""Two broken row softmaxes: one overflows, one scribbles on its input."""

import torch


def softmax_naive(x):
    z = torch.exp(x)
    return z / z.sum(dim=-1, keepdim=True)


def softmax_inplace(x):
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
    return x / x.sum(dim=-1, keepdim=True)
