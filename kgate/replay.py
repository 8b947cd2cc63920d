"""The torch operators a call ran, recorded and run again on fresh tensors, in a process without the caller's code.

The bounds gate's compute-sanitizer baseline: racecheck and synccheck judge a GPU kernel's own code, and a
report inside a kernel of the platform's (cuBLAS's `nvjet_*` behind a matmul) is not the candidate's. The
candidate's call is recorded at the dispatcher (`record`): each ATen operator it ran on a CUDA tensor, with
every tensor argument's shape, strides, storage offset, dtype and device and every other argument's value,
plus the process's matmul precision settings, which choose among cuBLAS's kernels. `replay` runs each such
operator once (repeats dropped), on fresh random tensors of the same metadata (integer and bool tensors
zero, a valid index everywhere), with the same settings, in a process that never imports the candidate. A
hazard site (kernel and code offset) the sanitizer reports in the replay too is torch's, reached the way the
candidate reached it.

Only ATen's own operators are replayed (`torch.ops.aten`), never the candidate's code, and Triton or CUDA
kernels launched outside the dispatcher are not recorded at all. The record is written by the process that
ran the candidate, so a candidate can forge it; forging chooses only which of torch's operators run on
random data, and a hazard is set aside only where that replay reports it at the same kernel and offset.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

MAX_OPS = 2000  # distinct operator calls kept; a longer record keeps its first ones
# torch.backends.cuda.matmul's settings that choose among cuBLAS's kernels (the isolation gate reads them too);
# a torch without one lacks the attribute
MATMUL_SETTINGS = ("allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
                   "allow_fp16_accumulation", "fp32_precision")


class Unrecordable(Exception):
    """An argument the record cannot hold (the operator is left out: the replay only shrinks)."""


def encode(value: Any) -> Any:
    """A JSON form of one operator argument."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.is_nested:
            raise Unrecordable(f"a {value.layout} tensor")
        return {"tensor": list(value.shape), "stride": list(value.stride()), "offset": value.storage_offset(),
                "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)}
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (torch.layout, torch.memory_format)):
        return {"enum": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    raise Unrecordable(type(value).__name__)


def _uses(value: Any, device_type: str) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == device_type
    if isinstance(value, (list, tuple)):
        return any(_uses(v, device_type) for v in value)
    return False


def record(fn: Any, args: tuple, path: str | Path, device_type: str = "cuda") -> Any:
    """Call fn(*args) with the ATen operators it runs on tensors of `device_type` recorded into `path` (JSON),
    also when it raises; returns what fn returns."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[dict] = []
    seen: set[str] = set()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if len(ops) < MAX_OPS and func.namespace == "aten" and _uses([*args, *kwargs.values()], device_type):
                try:
                    entry = {"op": str(func), "args": encode(list(args)),
                             "kwargs": {k: encode(v) for k, v in kwargs.items()}}
                except Exception:  # noqa: BLE001 - Unrecordable, or a tensor subclass's own error: left out;
                    entry = None  # the record never breaks the call it watches
                key = json.dumps(entry, sort_keys=True) if entry else ""
                if entry and key not in seen:
                    seen.add(key)
                    ops.append(entry)
            return func(*args, **kwargs)

    try:
        with Recorder():
            return fn(*args)
    finally:
        Path(path).write_text(json.dumps({"settings": settings(), "ops": ops}), encoding="utf-8")


def settings() -> dict[str, Any]:
    """The matmul precision settings that choose among cuBLAS's kernels (a setting torch refuses to read, as when
    the legacy and the fp32_precision APIs were mixed, is left out)."""
    matmul = torch.backends.cuda.matmul
    found: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                             "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}
    for name in MATMUL_SETTINGS:
        try:
            value = getattr(matmul, name)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(value, (bool, str)):
            found[name] = value
    return found


def _apply(recorded: dict[str, Any]) -> None:
    """Set what `settings` recorded; a value this torch does not take is left at its default."""
    matmul = torch.backends.cuda.matmul
    if isinstance(recorded.get("float32_matmul_precision"), str):
        try:
            torch.set_float32_matmul_precision(recorded["float32_matmul_precision"])
        except (RuntimeError, ValueError):
            pass
    for name in MATMUL_SETTINGS:
        if isinstance(recorded.get(name), (bool, str)) and hasattr(matmul, name):
            try:
                setattr(matmul, name, recorded[name])
            except (AttributeError, RuntimeError, TypeError, ValueError):
                pass
    if isinstance(recorded.get("cudnn_allow_tf32"), bool):
        torch.backends.cudnn.allow_tf32 = recorded["cudnn_allow_tf32"]


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {name!r}")
    return dtype


def decode(value: Any) -> Any:
    """An argument back from its JSON form: a tensor is a fresh random one with the recorded metadata."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        shape, stride, offset = list(value["tensor"]), list(value["stride"]), int(value["offset"])
        dtype, device = _dtype(value["dtype"]), torch.device(value["device"])
        extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else offset
        storage = torch.empty(max(extent, 1), dtype=dtype, device=device)
        if dtype.is_floating_point or dtype.is_complex:
            storage.normal_()
        else:
            storage.zero_()
        return storage.as_strided(shape, stride, offset)
    if "float" in value:
        return float(value["float"])
    if "dtype" in value:
        return _dtype(value["dtype"])
    if "device" in value:
        return torch.device(value["device"])
    if "enum" in value:
        return getattr(torch, str(value["enum"]))
    raise ValueError(f"not a recorded argument: {value!r}")


def operator(name: str) -> Any:
    """torch.ops.aten's overload named `name` ("aten.mm.default"); ValueError for any other namespace."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        raise ValueError(f"not an ATen operator: {name!r}")
    return getattr(getattr(torch.ops.aten, parts[1]), parts[2])


def replay(path: str | Path) -> int:
    """Run every recorded operator once on fresh tensors (an operator that rejects them, or a name outside ATen,
    is passed over); returns how many ran."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no record (the kernel's run never wrote one): nothing to replay
        return 0
    if not isinstance(data, dict):
        return 0
    _apply(data.get("settings") or {})
    ran = 0
    for entry in data.get("ops") or []:
        try:
            fn = operator(entry["op"])
            args = decode(entry.get("args") or [])
            kwargs = {k: decode(v) for k, v in (entry.get("kwargs") or {}).items()}
            fn(*args, **kwargs)
            ran += 1
        except Exception:  # noqa: BLE001 - random data an operator rejects (an index, a shape check): passed over
            continue
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return ran
