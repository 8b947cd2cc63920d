"""input_integrity, violating control: scratch space taken from the caller."""


def softmax_inplace_scratch(x):
    """Saves an allocation by exponentiating in the caller's tensor: the result is right, the caller's
    logits are gone (a second consumer of x, or autograd, now reads probabilities)."""
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
    return x / x.sum(dim=-1, keepdim=True)
