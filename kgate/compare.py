"""Tensor comparison that gates share: output trees, bitwise equality, aliasing, locating a mismatch.

Every mismatch is described the same way (what was expected, what came, where, how many), in the
spirit of torch.testing.assert_close's messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def flatten(obj: Any, path: str = "out") -> list[tuple[str, Any]]:
    """Leaves of an output tree (tensors and scalars) with a readable path such as out[1]."""
    if isinstance(obj, (tuple, list)):
        leaves: list[tuple[str, Any]] = []
        for i, item in enumerate(obj):
            leaves.extend(flatten(item, f"{path}[{i}]"))
        return leaves
    if isinstance(obj, dict):
        leaves = []
        for key in sorted(obj, key=str):
            leaves.extend(flatten(obj[key], f"{path}[{key!r}]"))
        return leaves
    return [(path, obj)]


def structure(obj: Any) -> str:
    """The shape of an output tree, ignoring leaf values: 'tuple(Tensor, list(Tensor, None))'. A named
    tuple (`torch.return_types.max`, a `collections.namedtuple`) is a tuple: read by position, as
    `flatten` reads it (and the float64 oracle, rebuilt by `map_tensors`, is a plain one)."""
    if isinstance(obj, (tuple, list)):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return f"{kind}({', '.join(structure(x) for x in obj)})"
    if isinstance(obj, dict):
        return "dict(" + ", ".join(f"{k!r}: {structure(obj[k])}" for k in sorted(obj, key=str)) + ")"
    if isinstance(obj, torch.Tensor):
        return "Tensor"
    return type(obj).__name__


def tensors(obj: Any) -> list[torch.Tensor]:
    return [leaf for _, leaf in flatten(obj) if isinstance(leaf, torch.Tensor)]


def index_of(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(index))


def on_device_of(t: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`t` on `other`'s device (itself when already there): comparisons run where the expected values
    live, never through host copies (outputs can hold 10^9 elements)."""
    return t if t.device == other.device else t.to(other.device)


def bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view with the same bits, so NaN payloads and -0.0 compare exactly."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    size = t.element_size()
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return t.view(int_dtype) if t.dtype != int_dtype else t


@dataclass
class Mismatch:
    count: int
    total: int
    index: tuple[int, ...]
    expected: Any
    got: Any

    def describe(self) -> str:
        return (f"{self.count} of {self.total} elements differ; first at index {list(self.index)}: "
                f"expected {self.expected}, got {self.got}")


def _scalar(t: torch.Tensor, index: tuple[int, ...]) -> Any:
    value = t[index] if index else t
    if value.dtype in _FLOATS or value.is_floating_point():
        return float(value.double().item())
    return value.item()


def bitwise_differ(pairs: list[tuple[torch.Tensor, torch.Tensor]], together: bool | None = None) -> list[bool]:
    """For each (a, b): whether they differ bitwise (shape and dtype included), as `bitwise_mismatch(a, b) is not
    None`, with one read from each GPU for all of them, not one per pair: many small tensors (a model's
    running statistics, before every call) cost a few launches in all, not a device synchronization each. On
    the CPU, where a read costs nothing, pair by pair (`together`: all at once, or pair by pair, on any device)."""
    found = [a.shape != b.shape or a.dtype != b.dtype for a, b in pairs]
    # (index, bits of a, bits of b) by device and bits dtype: each group compared in one concatenation
    groups: dict[tuple[str, torch.dtype], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for i, (a, b) in enumerate(pairs):
        if found[i] or a.numel() == 0:
            continue
        x, y = bits(a).reshape(-1), bits(on_device_of(b, a)).reshape(-1)
        if not (together if together is not None else x.device.type != "cpu"):
            found[i] = bool((x != y).any())
        else:
            groups.setdefault((str(x.device), x.dtype), []).append((i, x, y))
    for members in groups.values():
        xs, ys = torch.cat([x for _, x, _ in members]), torch.cat([y for _, _, y in members])
        owner = element_owners([x.numel() for _, x, _ in members], xs.device)
        for (i, _, _), differs in zip(members, members_differ(xs, ys, owner, len(members))):
            found[i] = differs
    return found


def element_owners(lengths: list[int], device: torch.device) -> torch.Tensor:
    """For tensors of `lengths` elements concatenated flat: the index of the tensor each element came from."""
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))


def members_differ(xs: torch.Tensor, ys: torch.Tensor, owner: torch.Tensor, members: int) -> list[bool]:
    """Whether each of `members` concatenated tensors (`owner`: `element_owners`) differs between `xs` and `ys`,
    with one read from the device."""
    counts = torch.zeros(members, dtype=torch.int64, device=xs.device)
    counts.index_add_(0, owner, (xs != ys).to(torch.int64))
    return [count > 0 for count in counts.tolist()]


def bitwise_mismatch(expected: torch.Tensor, got: torch.Tensor) -> Mismatch | None:
    """None when bitwise equal (shape and dtype included)."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return Mismatch(1, 1, (), f"{tuple(expected.shape)} {expected.dtype}", f"{tuple(got.shape)} {got.dtype}")
    a, b = bits(expected), bits(on_device_of(got, expected))
    diff = a != b
    if diff.dim() > expected.dim():  # complex: real/imag pairs
        diff = diff.any(dim=-1)
    count = int(diff.sum())
    if count == 0:
        return None
    flat = int(diff.reshape(-1).nonzero()[0, 0])
    index = index_of(flat, tuple(expected.shape))
    return Mismatch(count, expected.numel(), index, _scalar(expected, index), _scalar(got, index))


def value_mismatch(expected: torch.Tensor, got: torch.Tensor) -> Mismatch | None:
    """Like bitwise_mismatch but NaN equals NaN and -0.0 equals 0.0 (value semantics)."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return Mismatch(1, 1, (), f"{tuple(expected.shape)} {expected.dtype}", f"{tuple(got.shape)} {got.dtype}")
    e, g = expected.detach(), on_device_of(got.detach(), expected)
    diff = e != g
    if e.is_floating_point() or e.is_complex():
        diff &= ~(torch.isnan(e) & torch.isnan(g))
    count = int(diff.sum())
    if count == 0:
        return None
    flat = int(diff.reshape(-1).nonzero()[0, 0])
    index = index_of(flat, tuple(e.shape))
    return Mismatch(count, e.numel(), index, _scalar(e, index), _scalar(g, index))


def _storage_span(t: torch.Tensor) -> tuple[int, int] | None:
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share memory (same storage and intersecting spans)."""
    if a.device != b.device:
        return False
    try:
        if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
            return False
    except (RuntimeError, NotImplementedError):
        pass
    sa, sb = _storage_span(a), _storage_span(b)
    if sa is None or sb is None:
        return False
    return sa[0] < sb[1] and sb[0] < sa[1]


def clone_tree(obj: Any) -> Any:
    """A deep copy in which every tensor is a fresh clone (same strides kept where possible)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone(memory_format=torch.preserve_format)
    if isinstance(obj, tuple):
        return tuple(clone_tree(x) for x in obj)
    if isinstance(obj, list):
        return [clone_tree(x) for x in obj]
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    return obj


def map_tensors(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(x, fn) for x in obj)
    if isinstance(obj, list):
        return [map_tensors(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj
