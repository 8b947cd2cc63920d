"""bounds, violating controls: kernels handed a tensor's storage instead of the tensor.

A wrapper that passes `x.untyped_storage()` (or its data pointer and `nbytes()`) to a kernel instead of
`x.data_ptr()` and `x.numel()` is right whenever the tensor owns its whole storage, which freshly made
test inputs always do, and wrong for any view: it reads or writes the neighbours' memory."""

import torch


def _whole_storage(t):
    """What such a kernel sees: every element of the storage, from its first byte."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def total_over_storage(x):
    """Sums the whole storage: an out-of-bounds read."""
    return _whole_storage(x).sum()


def halve_storage_inplace(x):
    """Halves the whole storage in place: an out-of-bounds write into whatever shares it."""
    _whole_storage(x).mul_(0.5)
    return x


def halve_at_input_strides(x):
    """Halves x into a new dense tensor but stores each element at x's strides, from the new tensor's first
    element (as a Triton kernel handed the new tensor's pointer and the input's strides would): right for a
    contiguous x; for every other element it writes past the new tensor. Without the bounds gate's guard
    bands the storage ends there and torch refuses the view."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    at_input_strides = _whole_storage(out).as_strided(x.shape, x.stride(), out.storage_offset())
    at_input_strides.copy_(x * 0.5)
    return out
