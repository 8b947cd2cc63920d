"""Row softmax kernels for the demo: one reference, one correct kernel and a few that go wrong the
way generated kernels do. Plain PyTorch so the demo runs on any CPU; `make demo` gates them."""

import os

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Inputs for one case: a single (rows, cols) tensor of logits."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (8, 1000), generator=gen, dtype=torch.float64) * 3
    return (x.to(dtype=dtype, device=device),)


def softmax_ref(x):
    """The meaning: softmax over the last dimension."""
    return torch.softmax(x, dim=-1)


def softmax_stable(x):
    """Correct: subtract the row maximum, exponentiate, normalise, all in the input's dtype."""
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


def softmax_masked(x):
    """Hides NaN: a fused kernel 'cleaned up' with nan_to_num returns zeros where the truth is NaN."""
    return torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)


def softmax_fp16_accum(x):
    """Accumulates the row sum in float16 although the reference keeps float32."""
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    acc = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float16)
    for j in range(x.shape[-1]):
        acc += z[..., j : j + 1].to(torch.float16)
    return z / acc.to(x.dtype)


def softmax_naive(x):
    """No max subtraction: exp overflows for large logits, giving NaN where the truth is finite."""
    z = torch.exp(x)
    return z / z.sum(dim=-1, keepdim=True)


def softmax_inplace(x):
    """Saves an allocation by exponentiating the caller's tensor in place."""
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
    return x / x.sum(dim=-1, keepdim=True)


# The order atomics arrive in: a generator of its own, seeded by the OS (drawing from torch's global one would
# change the caller's random numbers too, which the isolation gate reports)
_ARRIVAL = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))


def softmax_atomic_order(x):
    """Sums each row in an order that changes from call to call, as float atomics do on a GPU."""
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    perm = torch.randperm(x.shape[-1], generator=_ARRIVAL).to(x.device)
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for block in perm.split(64):
        total = total + z[..., block].sum(dim=-1)
    return z / total.unsqueeze(-1)


def softmax_squeezed(x):
    """Drops size-1 dimensions on the way out (a reshape that only looks right for rows > 1)."""
    return softmax_stable(x).squeeze()
