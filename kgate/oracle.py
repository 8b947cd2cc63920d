"""The float64 oracle and the calibrated bound.

The oracle is the reference evaluated in float64 on the same inputs, upcast. The bound a kernel must
meet is calibrated from the reference's own error in the kernel's dtype, measured on the same inputs:

    ref_err = max |reference(x) - oracle(x)|               (reference run in the kernel's dtype)
    floor   = ulps * eps(dtype) * max |oracle(x)| + atol
    bound   = factor * ref_err + floor
    pass   <=> max |kernel(x) - oracle(x)| <= bound

maxima over the elements where the oracle, rounded to the output dtype, is finite (the special_values
gate judges the others; a kernel that is non-finite where the oracle is finite has infinite error).
`factor` (default 8) says how much worse than the reference a kernel may be; `ulps` (default 4) keeps
the bound meaningful where the reference happens to be exact. `kgate calibrate` re-judges a report
over a sweep of factors. Integer and boolean outputs must match exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kgate.compare import index_of, map_tensors

BROKEN_FACTOR = 10.0  # an oracle miss of more than this many bounds counts as broken


def upcast(obj: Any, device: torch.device | None = None) -> Any:
    """Fresh float64 (complex128) copies of every floating tensor; other tensors cloned."""

    def one(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if device is not None:
            t = t.to(device)
        if t.is_complex():
            return t.to(torch.complex128).clone()
        if t.is_floating_point():
            return t.to(torch.float64).clone()
        return t.clone()

    return map_tensors(obj, one)


def eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


@dataclass
class LeafError:
    """How far one output tensor is from the oracle, with the bound it was judged against."""

    path: str
    err: float
    ref_err: float | None
    scale: float
    floor: float
    bound: float
    factor: float
    index: list[int] | None = None
    expected: float | None = None
    got: float | None = None
    rel_err: float = 0.0
    exact: bool = False

    @property
    def passed(self) -> bool:
        return self.err <= self.bound

    @property
    def ratio(self) -> float:
        if self.bound > 0:
            return self.err / self.bound
        return 0.0 if self.err == 0 else math.inf

    def describe(self) -> str:
        where = f" at {self.path}{self.index}" if self.index is not None else f" in {self.path}"
        if self.exact:
            return f"{self.path}: exact match required; differs{where}: expected {self.expected}, got {self.got}"
        ref = "unknown" if self.ref_err is None else f"{self.ref_err:.3g}"
        return (f"max abs error {self.err:.3g}{where} (expected {self.expected:.6g}, got {self.got:.6g}); "
                f"bound {self.bound:.3g} = {self.factor:g} x reference error {ref} + floor {self.floor:.3g}; "
                f"max rel error {self.rel_err:.3g}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("err", "bound", "rel_err"):
            if isinstance(data[key], float) and math.isinf(data[key]):
                data[key] = "inf"
        return data


def rejudge(err: float, ref_err: float | None, floor: float, factor: float) -> bool:
    """The oracle verdict for a recorded case at another tolerance factor (kgate calibrate)."""
    return err <= factor * (ref_err or 0.0) + floor


def _max_abs(diff: torch.Tensor) -> tuple[float, int]:
    flat = diff.reshape(-1)
    pos = int(torch.argmax(flat))
    return float(flat[pos]), pos


def measure(kernel: torch.Tensor, reference: torch.Tensor | None, oracle: torch.Tensor, *, path: str,
            factor: float, ulps: float, atol: float) -> LeafError:
    """Error of one kernel output against the oracle and the bound calibrated from the reference."""
    k = kernel.detach().cpu()
    o = oracle.detach().cpu()
    if not (k.is_floating_point() or k.is_complex()):
        equal = torch.equal(k, o.to(k.dtype)) if k.shape == o.shape else False
        if equal:
            return LeafError(path, 0.0, 0.0, 0.0, 0.0, 0.0, factor, exact=True)
        diff = (k != o.to(k.dtype)).reshape(-1)
        pos = int(diff.nonzero()[0, 0]) if diff.any() else 0
        index = list(index_of(pos, tuple(k.shape)))
        return LeafError(path, math.inf, 0.0, 0.0, 0.0, 0.0, factor, index=index,
                         expected=o.reshape(-1)[pos].item(), got=k.reshape(-1)[pos].item(), exact=True)
    dtype = k.dtype
    if k.is_complex():
        k, o = torch.view_as_real(k), torch.view_as_real(o.to(torch.complex128))
        dtype = k.dtype
    o64 = o.to(torch.float64)
    rounded = o64.to(dtype) if dtype != torch.float64 else o64
    finite = torch.isfinite(o64) & torch.isfinite(rounded)
    scale = float(o64[finite].abs().max()) if finite.any() else 0.0
    floor = ulps * eps(dtype) * scale + atol
    ref_err: float | None = None
    if reference is not None:
        r = reference.detach().cpu()
        if r.is_complex():
            r = torch.view_as_real(r)
        if r.shape == o64.shape:
            rdiff = torch.where(finite, (r.to(torch.float64) - o64).abs(), torch.zeros((), dtype=torch.float64))
            rdiff = torch.nan_to_num(rdiff, nan=math.inf)
            ref_err = _max_abs(rdiff)[0] if rdiff.numel() else 0.0
            if math.isinf(ref_err):
                ref_err = None  # the reference itself leaves the finite range: calibrate from the floor only
    bound = factor * (ref_err or 0.0) + floor
    if k.shape != o64.shape or not finite.any():
        return LeafError(path, 0.0, ref_err, scale, floor, bound, factor)
    kd = k.to(torch.float64)
    diff = (kd - o64).abs()
    diff = torch.where(torch.isfinite(kd), diff, torch.full_like(diff, math.inf))
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    err, pos = _max_abs(diff)
    rel = diff / o64.abs().clamp_min(torch.finfo(dtype).tiny)
    rel = torch.where(finite & (o64 != 0), rel, torch.zeros_like(rel))
    index = list(index_of(pos, tuple(k.shape)))
    return LeafError(path, err, ref_err, scale, floor, bound, factor, index=index,
                     expected=float(o64.reshape(-1)[pos]), got=float(kd.reshape(-1)[pos]),
                     rel_err=float(rel.max()) if rel.numel() else 0.0)
