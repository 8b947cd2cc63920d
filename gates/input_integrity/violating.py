"""input_integrity, violating control: scratch space taken from the caller."""


def softmax_inplace_scratch(x):
    """Saves an allocation by exponentiating in the caller's tensor: the result is right, the caller's
    logits are gone (a second consumer of x, or autograd, now reads probabilities)."""
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
    return x / x.sum(dim=-1, keepdim=True)


def softmax_canonical_zeros(x):
    """Sanitises its input in place first: negative zeros become +0 (a sign bit no output depends on). On
    random inputs nothing changes; the caller's -0.0 values are gone."""
    x.masked_fill_(x == 0, 0.0)
    z = (x - x.amax(dim=-1, keepdim=True)).exp()
    return z / z.sum(dim=-1, keepdim=True)
