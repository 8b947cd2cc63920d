"""Making the inputs of one case: a factory from the manifest, or declarative argument specs.

A factory is called as `make_inputs(seed, shape=..., dtype=..., device=...)` with only the keywords
it accepts; the global RNG is seeded with `seed` first, so factories that just call torch.randn are
reproducible. What the factory did not take care of (dtype, device), kgate does: floating-point
tensors are cast to the case's dtype and every tensor is moved to the device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.testing import make_tensor

from kgate.compare import map_tensors
from kgate.manifest import ArgSpec

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
# the dtypes a declarative argument may also have (kgate.manifest.INTEGER_DTYPES): made in their own dtype
ARGUMENT_DTYPES = {**DTYPES, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
                   "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}


def dtype_of(name: str) -> torch.dtype:
    return ARGUMENT_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Case:
    """One point of the sweep: shape (None = the factory's default), dtype name, seed."""

    shape: tuple[int, ...] | None
    dtype: str
    seed: int

    def label(self) -> str:
        shape = "default" if self.shape is None else "x".join(map(str, self.shape)) or "scalar"
        return f"shape={shape} dtype={self.dtype} seed={self.seed}"

    def to_json(self) -> dict[str, Any]:
        return {"shape": None if self.shape is None else list(self.shape), "dtype": self.dtype, "seed": self.seed}


class InputError(Exception):
    """The inputs factory failed or returned something kgate cannot use."""


class InputFactory:
    def __init__(self, source: Callable[..., Any] | list[ArgSpec] | None):
        self.source = source
        self._accepts: set[str] = set()
        self._var_kw = False
        if callable(source):
            try:
                params = inspect.signature(source).parameters
            except (TypeError, ValueError):
                params = {}
            self._accepts = set(params)
            self._var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def _takes(self, name: str) -> bool:
        return self._var_kw or name in self._accepts

    def __call__(self, case: Case, device: torch.device) -> tuple[Any, ...]:
        dtype = dtype_of(case.dtype)
        torch.manual_seed(case.seed)
        if callable(self.source):
            kwargs: dict[str, Any] = {}
            for key, value in (("seed", case.seed), ("shape", case.shape), ("dtype", dtype), ("device", device)):
                if self._takes(key):
                    kwargs[key] = value
            try:
                produced = self.source(**kwargs)
            except Exception as exc:
                raise InputError(f"inputs factory raised {type(exc).__name__}: {exc}") from exc
            cast_dtype = not self._takes("dtype")
        else:
            produced = self._declarative(case, dtype, device)
            cast_dtype = False
        args = tuple(produced) if isinstance(produced, (tuple, list)) else (produced,)

        def fix(t: torch.Tensor) -> torch.Tensor:
            t = t.detach()
            if cast_dtype and t.is_floating_point():
                t = t.to(dtype)
            return t.to(device)

        return map_tensors(args, fix)

    def _declarative(self, case: Case, dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        specs = self.source if isinstance(self.source, list) else [ArgSpec()]
        args: list[Any] = []
        for i, spec in enumerate(specs):
            if spec.value is not None:
                args.append(spec.value)
                continue
            shape = spec.shape if spec.shape is not None else case.shape
            if shape is None:
                raise InputError(f"argument {i} has no shape: give it `shape:` or give the kernel `shapes:`")
            arg_dtype = dtype_of(spec.dtype) if spec.dtype else dtype
            low, high = spec.low, spec.high
            if not arg_dtype.is_floating_point:  # whole numbers (the manifest checked), as make_tensor takes them
                low, high = (None if v is None else int(v) for v in (low, high))
            args.append(make_tensor(tuple(shape), dtype=arg_dtype, device=device, low=low, high=high))
        return tuple(args)
