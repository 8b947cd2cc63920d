"""`kgate.yaml`: the versioned manifest, its validation and its JSON Schema.

The schema is one pydantic model; the JSON Schema that editors use (`kgate schema`) is generated from
it, so the two never disagree. Loading keeps the YAML position of every key, so each problem is
reported with file, line and key, plus a suggestion where one exists (nearest valid key, missing
`version`, ...). Nothing runs unless the whole manifest is valid.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib.machinery
import json
import keyword
import math
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from kgate.errors import ManifestError, Problem
from kgate.names import BACKWARD_SUFFIX, GATE_NAMES, KNOWN_GATES, OPTIONAL_GATES
from kgate.sandbox import allowed_env, kgate_command  # kgate_command: the very command the workers start with

SUPPORTED_VERSIONS = (1,)
DEFAULT_MANIFEST = "kgate.yaml"
# Bounds on what is read (a manifest of thousands of kernels is well within each).
MAX_MANIFEST_BYTES = 2**20
MAX_DEPTH = 32  # levels of mappings and lists
MAX_EXPANDED = 100_000  # values that aliases add by repeating their anchor's value

DTYPE_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64", "f64": "float64",
}
DTYPES = ("float16", "bfloat16", "float32", "float64")
# Declarative arguments may also be integer or boolean tensors (indices, labels, masks): made in their own
# dtype whatever floating-point dtype is swept. Each: the values `low`/`high` may take (high exclusive).
INTEGER_DTYPES: dict[str, tuple[int, int] | None] = {
    "int8": (-2**7, 2**7), "int16": (-2**15, 2**15), "int32": (-2**31, 2**31), "int64": (-2**63, 2**63),
    "uint8": (0, 2**8), "bool": None,
}
INTEGER_DTYPE_ALIASES = {"long": "int64", "short": "int16", "byte": "uint8", "i8": "int8", "i16": "int16",
                         "i32": "int32", "i64": "int64", "u8": "uint8"}
# torch.testing.make_tensor's range for an integer dtype when `low` / `high` are not given
DEFAULT_INTEGER_RANGE = (-9, 10)
VERDICTS = ("pass", "fail", "error", "skip")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
MIN_MEMORY = 64 * 2**20  # below this no worker starts (the Python interpreter and torch alone take more)
MAX_MEMORY = 2**50  # 1 PiB: more than any machine has
MAX_ELEMENTS = 2**36  # elements of one declared shape: more than any device holds in float16
MAX_SEED = 2**32 - 1  # a seed torch, numpy and random all take
MAX_TIMEOUT = 7 * 24 * 3600.0
MAX_NAME = 200  # characters of a name: it names files (logs, an audit's output folder)
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class InvalidValue(ValueError):
    """A validator's complaint about one value, with a hint for the user (shown as `hint:`)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


_DTYPE_LIST = ", ".join(DTYPES)
_INTEGER_DTYPE_RE = re.compile(r"^(torch\.)?(u?int\d*|bool|long|short|byte|char)$", re.IGNORECASE)


def _unsupported_dtype(value: str, *, declarative: bool) -> InvalidValue:
    integers = ", ".join(INTEGER_DTYPES)
    if _INTEGER_DTYPE_RE.match(value):
        if declarative:
            return InvalidValue(
                f"integer dtype {value!r}: declarative arguments are made in {_DTYPE_LIST} or {integers}",
                f"write one of {integers} (aliases: {', '.join(INTEGER_DTYPE_ALIASES)}); other integer tensors "
                "come from an inputs factory (`inputs: file.py:make_inputs`), which kgate passes through unchanged")
        return InvalidValue(
            f"integer dtype {value!r} cannot be swept: `dtypes` are the floating-point precisions a kernel is "
            f"judged in ({_DTYPE_LIST})",
            "kgate casts the floating-point inputs to each one and scales the oracle bound by its eps; integer "
            "tensors (indices, masks) are declarative arguments with their own dtype (`{shape: [8], dtype: "
            "int64, low: 0, high: 4}`) or come from an inputs factory, and pass through unchanged; integer "
            "outputs are compared exactly")
    options = list(DTYPES) + list(DTYPE_ALIASES) + (list(INTEGER_DTYPES) if declarative else [])
    return InvalidValue(f"unsupported dtype {value!r}: kgate judges {_DTYPE_LIST}"
                        + (f"; declarative arguments may also be {integers}" if declarative else ""),
                        _suggest(value, options) or "aliases: " + ", ".join(DTYPE_ALIASES))


def _dtype(value: Any, *, declarative: bool = False) -> Any:
    if isinstance(value, str):
        value = DTYPE_ALIASES.get(value.lower(), value)
        if declarative:
            value = INTEGER_DTYPE_ALIASES.get(value.lower(), value)
            if value.lower() in INTEGER_DTYPES:
                return value.lower()
        if value not in DTYPES:
            raise _unsupported_dtype(value, declarative=declarative)
    return value


def _argument_dtype(value: Any) -> Any:
    return _dtype(value, declarative=True)


def parse_memory(value: Any) -> int:
    """'8GiB', '512MB', 1073741824 -> bytes, between MIN_MEMORY and MAX_MEMORY."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as '8GiB' or a number of bytes")
    if isinstance(value, int):
        size = value
    else:
        match = _MEMORY_RE.match(str(value))
        if not match:
            raise ValueError(f"cannot read {_show(value)} as a size; write e.g. '8GiB', '512MiB' or a number of bytes")
        number, unit = match.groups()
        size = float(number) * _UNITS[(unit or "B").lower()]
    if not MIN_MEMORY <= size <= MAX_MEMORY:  # (a float of 5000 digits is inf: out of range too)
        raise InvalidValue(
            f"memory limit {_show(value)} is out of range: kgate takes {_size(MIN_MEMORY)} to {_size(MAX_MEMORY)}",
            "a worker imports torch and the kernel's modules (a few hundred MiB) before the first gate; the limit "
            "holds for its whole process tree, e.g. '8GiB'")
    return int(size)


def _size(n: float) -> str:
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _device(value: Any) -> Any:
    if isinstance(value, str) and not _DEVICE_RE.match(value):
        hint = ("a GPU is 'cuda' (or 'cuda:N')" if "gpu" in value.lower()
                else _suggest(value, ["auto", "cpu", "cuda"]) or "auto: cuda when there is a GPU, else cpu")
        raise InvalidValue(f"device {value!r} is not one of auto, cpu, cuda, cuda:N", hint)
    return value


DType = Annotated[Literal["float16", "bfloat16", "float32", "float64"], BeforeValidator(_dtype)]
ArgumentDType = Annotated[Literal["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                                  "uint8", "bool"], BeforeValidator(_argument_dtype)]
Device = Annotated[str, BeforeValidator(_device)]
Memory = Annotated[int, BeforeValidator(parse_memory)]


def _check_shape(shape: list[int]) -> list[int]:
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        many = f"{count:.3g}" if count < 1e300 else "over 1e300"
        raise InvalidValue(f"shape {_show(shape)} has {many} elements: over kgate's limit of 2^36 "
                           f"({MAX_ELEMENTS:.3g}), more than any device holds",
                           "shapes are sizes of the inputs a kernel is judged on; a few million elements show what "
                           "larger ones would")
    return shape


Size = Annotated[int, Field(ge=0, strict=True)]
Shape = Annotated[list[Size], AfterValidator(_check_shape)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, strict=True)]


def _check_corpus_name(name: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise InvalidValue(f"name {_show(name)} is not a plain relative folder name: the corpus's results go to "
                           "--out/NAME, and this one would lead elsewhere",
                           "use words joined by '-', '_' or '.', optionally folders separated by single '/' "
                           "(no leading '/', no '.' or '..' part)")
    return name
Verdict = Literal["pass", "fail", "error", "skip"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Tolerance(_Strict):
    """How far from the float64 oracle a kernel may be (see docs: the oracle bound).

    bound = factor * max|reference_in_dtype - oracle| + ulps * eps(dtype) * max|oracle| + atol
    """

    factor: float = Field(8.0, gt=0, description="c: multiple of the reference's own error in the kernel's dtype")
    ulps: float = Field(4.0, ge=0, description="floor, in units of eps(dtype) x max|oracle|")
    atol: float = Field(0.0, ge=0, description="absolute floor added to the bound")


class Resources(_Strict):
    """A budget for each compiled GPU kernel of a kernel, judged by the `resources` gate (opt-in: declaring a
    budget adds the gate). Figures come from Triton's compiled kernels and from `cuobjdump` of CUDA
    extensions, so the gate is skipped on the CPU and under Triton's interpreter."""

    max_registers: int | None = Field(None, ge=0, le=65536, description="registers per thread")
    spills: int | None = Field(None, ge=0, le=2**31,
                               description="bytes of local memory per thread (where registers spill); 0: no spills")
    max_shared: int | None = Field(None, ge=0, le=2**31, description="bytes of shared memory per block")


class GateSelection(_Strict):
    include: list[str] | None = Field(None, description="gates to run (default: all)")
    exclude: list[str] = Field(default_factory=list, description="gates not to run")


GateSpec = Literal["all"] | list[str] | GateSelection


class ArgSpec(_Strict):
    """A declarative input: one positional argument made by torch.testing.make_tensor. Floating-point
    arguments are made in the dtype being swept (or their own `dtype`); integer and bool arguments
    (indices, labels, masks) in their own dtype at every case: the gates that change floating-point values
    leave them alone, and the distributions gate probes integer tensors with repeated and equal values."""

    shape: Shape | None = Field(None, description="shape; omitted = the shape being swept")
    dtype: ArgumentDType | None = Field(
        None, description="dtype; omitted = the dtype being swept. int8, int16, int32, int64, uint8 and bool make "
        "a tensor of that dtype at every case (not swept)")
    low: int | float | None = Field(
        None, description="least value (inclusive); integer dtypes: a whole number, default -9 (uint8: 0)")
    high: int | float | None = Field(
        None, description="greatest value (exclusive); integer dtypes: a whole number, default 10")
    value: Annotated[float, Field(allow_inf_nan=True)] | int | bool | None = Field(
        None, description="a Python scalar argument instead of a tensor (inf and nan allowed)")

    @model_validator(mode="after")
    def _integer_range(self) -> ArgSpec:
        if self.value is not None or self.dtype not in INTEGER_DTYPES:
            return self
        limits = INTEGER_DTYPES[self.dtype]
        given = {key: getattr(self, key) for key in ("low", "high") if getattr(self, key) is not None}
        if limits is None:
            if given:
                raise InvalidValue(f"a bool argument takes no {' or '.join(given)}: its values are True and False",
                                   "leave out low and high (make_tensor draws both values)")
            return self
        for key, bound in given.items():
            if isinstance(bound, float) and not bound.is_integer():
                raise InvalidValue(f"{key} {_show(bound)} of an argument of dtype {self.dtype} is not a whole number",
                                   f"write {key}: {math.floor(bound) if key == 'low' else math.ceil(bound)}")
            if not limits[0] <= bound <= limits[1]:
                raise InvalidValue(f"{key} {_show(bound)} is outside what {self.dtype} holds "
                                   f"({limits[0]} to {limits[1] - 1})",
                                   "choose a wider dtype or a narrower range")
        low = int(given.get("low", max(DEFAULT_INTEGER_RANGE[0], limits[0])))
        high = int(given.get("high", DEFAULT_INTEGER_RANGE[1]))
        if low >= high:
            raise InvalidValue(f"empty range: low {low} >= high {high} for an argument of dtype {self.dtype} (values "
                               "are drawn from low to high, high excluded)",
                               f"give both, with low < high (unset: low {max(DEFAULT_INTEGER_RANGE[0], limits[0])},"
                               f" high {DEFAULT_INTEGER_RANGE[1]})")
        return self


def _check_kwarg_name(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        why = "a Python keyword" if keyword.iskeyword(name) else "not a Python identifier"
        raise InvalidValue(f"keyword argument name {_show(name)} is {why}",
                           "kwargs are passed as name=value to the kernel and the reference: use the name of a "
                           "parameter of both, e.g. ignore_index")
    return name


# Names a manifest may not point at a kernel's cache folder (`cache_env`): what kgate sets itself, what decides
# which code runs (a loader path), and what the sandbox keeps for kgate (kgate.sandbox).
_KEPT_ENV = frozenset({"HOME", "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "PATH", "SHELL", "USER", "LOGNAME",
                       "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV",
                       "CONDA_PREFIX"})
_KEPT_ENV_PREFIXES = ("LD_", "PYTHON", "KGATE_", "DYLD_")


def _check_cache_env_name(name: str) -> str:
    from kgate.sandbox import SECRET_NAME

    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        raise InvalidValue(f"cache_env name {_show(name)} is not an environment variable name in capitals",
                           "e.g. cache_env: [FLAGGEMS_CACHE_DIR]")
    if name in _KEPT_ENV or name.startswith(_KEPT_ENV_PREFIXES) or SECRET_NAME.search(name):
        raise InvalidValue(f"cache_env cannot set {name}: kgate sets it itself, it decides which code runs, or it "
                           "looks like a secret",
                           "name only the variable a library reads for its own cache folder, e.g. FLAGGEMS_CACHE_DIR")
    return name


CacheEnvName = Annotated[str, AfterValidator(_check_cache_env_name)]
CACHE_ENV_HELP = (
    "environment variables that name a library's own cache folder (FlagGems keeps its tuned configurations "
    "under FLAGGEMS_CACHE_DIR, else under HOME, which is each worker's own): kgate points each at a folder of "
    "the kernel's own caches, which that kernel's workers share and no other kernel sees, as it does Triton's "
    "cache; so a configuration is tuned once per kernel, not once per worker. Where a library keeps its caches "
    "does not change what is judged: not part of the kernel's digest (kgate run --resume)")

KwargScalar = Annotated[float, Field(allow_inf_nan=True)] | StrictBool | StrictInt | StrictStr | None
KwargName = Annotated[str, AfterValidator(_check_kwarg_name)]


class Limits(_Strict):
    timeout: float = Field(300.0, gt=0, le=MAX_TIMEOUT, description="seconds one gate of one kernel may take")
    memory: Memory = Field(8 * 2**30, description="resident memory of a worker process, e.g. '8GiB'")


class Defaults(_Strict):
    device: Device = "auto"
    dtypes: list[DType] = Field(default_factory=lambda: ["float32"], min_length=1)
    gates: GateSpec = "all"
    seeds: list[Seed] = Field(default_factory=lambda: [0, 1], min_length=1)
    tolerance: Tolerance = Field(default_factory=Tolerance)
    limits: Limits = Field(default_factory=Limits)
    resources: Resources | None = Field(None, description="a resource budget for every kernel (see Resources)")
    cache_env: list[CacheEnvName] = Field(default_factory=list, description=CACHE_ENV_HELP)


# keys of an entry that `defaults` does not take, and why
_PER_KERNEL = {
    "kwargs": "kwargs are set per kernel: they are parameters of one op (a cross-entropy's ignore_index), which "
              "other kernels do not take; share them between entries with an anchor (`x-ce: &ce {ignore_index: "
              "-100}` at the top, `kwargs: *ce` in each entry)",
}


class KernelEntry(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-/]+$", max_length=MAX_NAME,
                      description="unique name, used by -k and in reports")
    kernel: str = Field(description="'path/to/file.py:attr' or 'package.module:attr'")
    reference: str = Field(description="the callable that defines the meaning, same reference syntax")
    inputs: str | list[ArgSpec] | None = Field(
        None, description="factory 'file.py:make_inputs' (called as make_inputs(seed, shape=, dtype=, device=)) "
        "or a list of declarative argument specs")
    kwargs: dict[KwargName, KwargScalar | list[KwargScalar]] = Field(
        default_factory=dict, description="keyword arguments passed to both the kernel and the reference (so the "
        "float64 oracle) on every call, by every gate: name -> a number (.inf, -.inf and .nan allowed), integer, "
        "true/false, string, null or a list of those, e.g. {ignore_index: -100, reduction: sum}; a name must be "
        "a parameter both accept by keyword and not one the declarative inputs fill by position")
    shapes: list[Shape] | None = Field(None, description="shapes passed to the inputs factory")
    dtypes: list[DType] | None = Field(None, min_length=1)
    gates: GateSpec | None = None
    seeds: list[Seed] | None = Field(None, min_length=1)
    backward: bool = Field(False, description="also judge gradients against float64 autograd of the reference")
    inplace: list[Size] = Field(default_factory=list,
                                description="indices of arguments the kernel may modify; with backward: true the "
                                "gradients' phase numbers the inputs first, then one cotangent per output, so an "
                                "index past the inputs names a cotangent the backward may overwrite")
    no_grad: list[Size] = Field(
        default_factory=list, description="with backward: true, indices of positional arguments that get no "
        "gradient by contract (a teacher's distribution, a target, a lookup table): the gradients' phase passes "
        "them to the kernel and to the reference as plain tensors that do not require grad, and judges the "
        "gradients of the other inputs only; the forward phase judges values as before (its requires_grad check "
        "also passes them without grad)")
    nondeterministic: bool = Field(False, description="declare run-to-run differences as intended")
    bitwise_layouts: bool = Field(
        False, description="layouts gate: results on strided inputs must be bitwise equal to those on contiguous "
        "copies (tolerance-free), not only within the oracle bound")
    special_values_match: Literal["exact", "nonfinite", "spread"] = Field(
        "exact", description="exact: NaN, +Inf and -Inf where the oracle has each; nonfinite: any non-finite "
        "value where the oracle is non-finite (for re-associated sums, where inf - inf order decides); spread: "
        "as nonfinite, and on probes that inject NaN/Inf into an input, non-finite outputs where the oracle is "
        "finite are allowed and counted (tiled/chunked kernels: 0 * NaN = NaN poisons the rest of a tile); "
        "the overflow probe still needs finite vs non-finite to match both ways")
    tolerance: Tolerance | None = None
    device: Device | None = None
    limits: Limits | None = None
    resources: Resources | None = Field(
        None, description="registers, spills and shared memory each compiled GPU kernel may use; adds the "
        "`resources` gate (see Resources)")
    cache_env: list[CacheEnvName] | None = Field(None, description=CACHE_ENV_HELP + "; default: the defaults'")
    files: list[str] = Field(default_factory=list, description=(
        "globs of more files whose change gates this kernel (the pre-commit hook, kgate run --changed, the "
        "Action's changed-only), relative to the manifest's folder; ../ reaches outside it"))
    expect: dict[str, Verdict] | None = Field(
        None, description="expected verdict per gate (used by `kgate selftest` for the controls)")
    description: str | None = None

    @field_validator("kernel", "reference")
    @classmethod
    def _ref_syntax(cls, value: str) -> str:
        return _check_ref_syntax(value)

    @field_validator("inputs")
    @classmethod
    def _inputs_syntax(cls, value: Any) -> Any:
        if isinstance(value, str):
            _check_ref_syntax(value)
        return value

    @field_validator("no_grad", mode="before")
    @classmethod
    def _no_grad_is_indices(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise InvalidValue(f"no_grad takes the indices of the arguments that get no gradient, not {_show(value)}",
                               "e.g. no_grad: [1] for a second argument (a target) that gets none; to judge no "
                               "gradients at all, leave out backward: true")
        return value


class KernelBenchEntry(_Strict):
    """A corpus in KernelBench format (problems with Model/get_inputs/get_init_inputs, candidates with
    ModelNew), judged by `kgate audit --manifest` rather than by `kgate run`."""

    name: Annotated[str, AfterValidator(_check_corpus_name)] = Field(
        pattern=r"^[A-Za-z0-9_.\-/]+$", max_length=MAX_NAME, description="unique name, used for the output subfolder")
    format: Literal["kernelbench"] = Field(description="the corpus format")
    problems: str = Field(description="folder of problem files, relative to the manifest")
    candidates: str = Field(description="folder of candidate files, relative to the manifest")
    index: str | None = Field(None, description="JSON or CSV file pairing candidate -> problem")
    description: str | None = None


def _entry_kind(value: Any) -> str:
    if isinstance(value, KernelBenchEntry) or (isinstance(value, dict) and value.get("format") == "kernelbench"):
        return "KernelBenchEntry"
    return "KernelEntry"


AnyEntry = Annotated[Annotated[KernelEntry, Tag("KernelEntry")] | Annotated[KernelBenchEntry, Tag("KernelBenchEntry")],
                     Discriminator(_entry_kind)]


class Manifest(_Strict):
    version: int = Field(description="manifest format version; this kgate reads version 1")
    defaults: Defaults = Field(default_factory=Defaults)
    kernels: list[AnyEntry] = Field(min_length=1)


def _check_ref_syntax(value: str) -> str:
    target, sep, attr = value.rpartition(":")
    if not sep or not target or not attr or not attr.replace(".", "_").isidentifier():
        hint = (f"add ':' and the name of the function or nn.Module instance, e.g. '{value}:my_kernel'"
                if not sep else "after the ':' comes a Python name (dotted names allowed)")
        raise InvalidValue(f"{value!r} is not 'path/to/file.py:attr' or 'package.module:attr'", hint)
    return value


def json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://kgate.dev/schema/kgate.v1.json"
    schema["title"] = "kgate.yaml"
    schema["properties"]["version"] = {"const": 1, "description": "manifest format version"}
    schema["patternProperties"] = {"^x-": {"description": "ignored by kgate: a place for YAML anchors that entries "
                                              "merge with `<<: *name`"}}
    return schema


# --------------------------------------------------------------------------------------------------
# The resolved manifest: what the runner uses.


class Ref:
    """A parsed 'target:attr' reference, resolved against the manifest's folder, with the keyword arguments
    (`kwargs:`) bound to every call of what it names (kgate.loading binds them when it imports it)."""

    def __init__(self, text: str, base: Path, kwargs: dict[str, Any] | None = None):
        self.text = text
        self.kwargs = dict(kwargs or {})
        target, _, self.attr = text.rpartition(":")
        self.is_file = target.endswith(".py") or "/" in target or "\\" in target
        self.path: Path | None = (base / target).resolve() if self.is_file else None
        self.module = None if self.is_file else target

    def __repr__(self) -> str:
        return f"Ref({self.text!r})"

    def to_json(self) -> str:
        return self.text


class ResolvedKernel:
    """One kernel entry with the defaults applied and every path resolved."""

    def __init__(self, entry: KernelEntry, defaults: Defaults, manifest: LoadedManifest, index: int):
        self.entry = entry
        self.index = index
        self.manifest = manifest
        self.name = entry.name
        base = manifest.base
        self.kwargs = dict(entry.kwargs)
        self.kernel = Ref(entry.kernel, base, self.kwargs)
        self.reference = Ref(entry.reference, base, self.kwargs)
        self.inputs: Ref | list[ArgSpec] | None = (
            Ref(entry.inputs, base) if isinstance(entry.inputs, str) else entry.inputs)
        self.shapes = [tuple(s) for s in entry.shapes] if entry.shapes else [None]
        self.dtypes = list(entry.dtypes or defaults.dtypes)
        self.seeds = list(entry.seeds or defaults.seeds)
        self.gate_spec = entry.gates if entry.gates is not None else defaults.gates
        self.tolerance = entry.tolerance or defaults.tolerance
        self.device = entry.device or defaults.device
        self.limits = entry.limits or defaults.limits
        self.resources = entry.resources or defaults.resources
        self.cache_env = list(entry.cache_env if entry.cache_env is not None else defaults.cache_env)
        self.line = manifest.line_of(("kernels", index))

    def selected_gates(self, all_names: list[str]) -> list[str]:
        """The gates of `all_names` (the twelve: `all`) that `gates:` selects, then each opt-in gate that
        `gates:` names or, for `resources`, that a declared budget asks for (unless `gates:` excludes it)."""
        spec = self.gate_spec
        chosen = _selected(spec, all_names)
        named = _names(spec, include_only=True)
        # a list or an `include:` chooses exactly; `all` or an `exclude:` alone leaves room for a budget's gate
        open_ended = spec == "all" or isinstance(spec, GateSelection) and spec.include is None
        for gate in OPTIONAL_GATES:
            asked = gate == "resources" and self.resources is not None and open_ended
            if gate not in chosen and (gate in named or asked and gate not in _names(spec)):
                chosen.append(gate)
        return chosen

    def import_path(self, role: str) -> list[str]:
        """The sys.path the worker imports the module of `role` (kernel, reference or inputs) with: its
        start-up path, plus what kgate.loading has added by then (the manifest's folder, and the folders of
        the file references loaded before it: the worker loads the reference, the inputs, then the kernel)."""
        path = list(worker_sys_path(self.manifest.base))

        def add(folder: str) -> None:
            if folder not in path:
                path.insert(0, folder)

        for name, ref in (("reference", self.reference), ("inputs", self.inputs), ("kernel", self.kernel)):
            if not isinstance(ref, Ref):
                continue
            add(str(self.manifest.base))
            if name == role:
                break
            if ref.path is not None:
                add(str(ref.path.parent))
        return path

    def ref_file(self, role: str) -> Path | None:
        """The file of `role`'s reference (kernel, reference or inputs): its path, or its module's file as the
        worker will import it; found without importing anything (None: no reference, not found, compiled)."""
        ref = getattr(self, role)
        if not isinstance(ref, Ref):
            return None
        return ref.path if ref.path is not None else _find_module(ref.module or "", self.import_path(role))

    def source_files(self) -> set[Path]:
        """The files of the kernel's, reference's and inputs' references, as the worker will import them."""
        files = (self.ref_file(role) for role in ("kernel", "reference", "inputs"))
        return {f.resolve() for f in files if f is not None}

    def digest(self) -> str:
        """What a result of this kernel was judged on: its own entry and the manifest's defaults as kgate read
        them (not the text around them: another entry's change, a comment, or an anchor no entry of this kernel
        merges leaves it), the manifest's folder, and the kernel's, reference's and inputs' files (kgate run
        --resume keeps only results recorded under the same digest)."""
        unjudged = {"cache_env"}  # where a library keeps its caches changes nothing judged
        settings = {"version": self.manifest.model.version, "base": str(self.manifest.base),
                    "defaults": self.manifest.model.defaults.model_dump(mode="json", exclude=unjudged),
                    "entry": self.entry.model_dump(mode="json", exclude=unjudged)}
        h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
        for path in sorted(self.source_files()):
            h.update(str(path).encode() + b"\0")
            try:
                h.update(path.read_bytes())
            except OSError:
                h.update(b"(unreadable)")
        h.update(self.name.encode())
        return h.hexdigest()[:32]

    def source_location(self) -> tuple[str | None, int | None]:
        """Where the kernel is defined (file, line), for annotations; found without importing it."""
        path = self.ref_file("kernel")
        if path is None or not path.exists():
            return None, None
        return str(path), _definition_line(path, self.kernel.attr)


def _names(spec: Any, include_only: bool = False) -> list[str]:
    """The gate names a `gates:` setting lists (with `include_only`, those it selects by name)."""
    if spec == "all" or spec is None:
        return []
    if isinstance(spec, list):
        return list(spec)
    return list(spec.include or []) + ([] if include_only else list(spec.exclude))


def _selected(spec: Any, all_names: list[str]) -> list[str]:
    """The gates of `all_names` that a `gates:` setting selects, in their order."""
    if spec == "all":
        return list(all_names)
    if isinstance(spec, list):
        return [g for g in all_names if g in spec]
    chosen = all_names if spec.include is None else [g for g in all_names if g in spec.include]
    return [g for g in chosen if g not in spec.exclude]


class ResolvedCorpus:
    """A `format: kernelbench` entry with its paths resolved against the manifest's folder."""

    def __init__(self, entry: KernelBenchEntry, base: Path):
        self.entry = entry
        self.name = entry.name
        self.problems = base / entry.problems
        self.candidates = base / entry.candidates
        self.index = base / entry.index if entry.index else None


class LoadedManifest:
    def __init__(self, path: Path, model: Manifest, marks: dict[tuple, tuple[int, int]]):
        self.path = path
        self.base = path.parent
        self.model = model
        self._marks = marks
        self.kernels = [ResolvedKernel(e, model.defaults, self, i) for i, e in enumerate(model.kernels)
                        if isinstance(e, KernelEntry)]
        self.kernelbench = [ResolvedCorpus(e, self.base) for e in model.kernels if isinstance(e, KernelBenchEntry)]

    def line_of(self, loc: tuple) -> int | None:
        mark = _nearest_mark(self._marks, loc)
        return mark[0] if mark else None

    def by_name(self, name: str) -> ResolvedKernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)


# --------------------------------------------------------------------------------------------------
# Loading with positions.


def _read(path: Path, file: str) -> str:
    """The manifest's text, read only if it is a regular file within MAX_MANIFEST_BYTES (a device such as
    /dev/zero, a FIFO or a huge file would otherwise be read until memory runs out)."""
    try:
        info = path.stat()
    except (OSError, ValueError) as exc:
        raise ManifestError([Problem(file, None, None, None, f"cannot read manifest: {exc}")]) from None
    if stat.S_ISDIR(info.st_mode):
        raise ManifestError([Problem(file, None, None, None, "the manifest is a folder, not a file",
                                     f"give the file's path, e.g. {path / DEFAULT_MANIFEST}")])
    if not stat.S_ISREG(info.st_mode):
        raise ManifestError([Problem(file, None, None, None,
                                     "the manifest is not a regular file (a device, a FIFO or a socket)",
                                     "give the path of a kgate.yaml file")])
    too_big = Problem(file, None, None, None, f"the manifest is larger than kgate's limit of "
                      f"{MAX_MANIFEST_BYTES // 2**20} MiB", "a manifest lists kernels and their settings, a few "
                      "KiB for hundreds of kernels: generated data (shapes, inputs) belongs in an inputs factory")
    if info.st_size > MAX_MANIFEST_BYTES:
        raise ManifestError([too_big])
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError([Problem(file, None, None, None, f"cannot read manifest: {exc}")]) from None
    if len(data) > MAX_MANIFEST_BYTES:  # it grew since stat, or stat does not know its size (/proc)
        raise ManifestError([too_big])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ManifestError([Problem(file, line, column, None, f"not UTF-8 text: {exc.reason} at byte {exc.start}",
                                     "save the manifest as UTF-8")]) from None


def _syntax_problem(exc: yaml.YAMLError, file: str) -> Problem:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    message = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
    return Problem(file, mark.line + 1 if mark else None, mark.column + 1 if mark else None, None, message,
                   "check indentation and quoting on that line")


_MERGE_TAG = "tag:yaml.org,2002:merge"
# libyaml where PyYAML was built with it: over ten times faster on a manifest of 2000 entries (0.17 s against
# 2.6 s to parse and compose), the same nodes and marks
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_depth(text: str, file: str) -> None:
    """Nesting deeper than MAX_DEPTH is refused before composing (PyYAML's composer recurses per level)."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise ManifestError([_too_deep(file, mark.line + 1, mark.column + 1, None)])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _too_deep(file: str, line: int | None, column: int | None, key: str | None) -> Problem:
    return Problem(file, line, column, key, f"nested deeper than {MAX_DEPTH} levels of mappings and lists",
                   "a manifest needs a few levels (kernels, an entry, its shapes); check the brackets and "
                   "indentation there")


class _Builder:
    """Python data from a composed YAML node graph, with the position of every key. Bounded: aliases may
    repeat at most MAX_EXPANDED values in all (an alias bomb repeats billions), nesting (aliases included)
    is at most MAX_DEPTH, and an alias inside the node it names is refused. Values YAML cannot read (a
    20000-digit number, a bad !!timestamp, an unknown !tag) become problems, and building goes on."""

    def __init__(self, file: str):
        self.file = file
        self.marks: dict[tuple, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self.unreadable: list[str] = []  # keys of values that became problems: no second complaint there
        self.constructor = yaml.constructor.SafeConstructor()
        self.distinct: set[int] = set()
        self.built = 0
        self.open: set[int] = set()

    def fail(self, node: yaml.Node, path: tuple, message: str, hint: str | None) -> ManifestError:
        return ManifestError([Problem(self.file, node.start_mark.line + 1, node.start_mark.column + 1,
                                      _dotted(path) or None, message, hint)])

    def build(self, n: yaml.Node, path: tuple, depth: int = 0) -> Any:
        self.marks.setdefault(path, (n.start_mark.line + 1, n.start_mark.column + 1))
        self.built += 1
        self.distinct.add(id(n))
        if self.built - len(self.distinct) > MAX_EXPANDED:
            raise self.fail(n, path, f"aliases expand to more than {MAX_EXPANDED} values (the anchor is here)",
                            "an alias repeats its anchor's whole value; a manifest needs few of them (a `<<: *base` "
                            "of shared settings per entry)")
        if isinstance(n, yaml.ScalarNode):
            return self.scalar(n, path)
        if depth >= MAX_DEPTH:
            raise ManifestError([_too_deep(self.file, n.start_mark.line + 1, n.start_mark.column + 1,
                                           _dotted(path) or None)])
        if id(n) in self.open:
            raise self.fail(n, path, "an alias refers to the value that contains it (an endless value)",
                            "refer only to anchors whose value is complete before the alias")
        self.open.add(id(n))
        try:
            if isinstance(n, yaml.SequenceNode):
                return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(n.value)]
            return self.mapping(n, path, depth)
        finally:
            self.open.discard(id(n))

    def scalar(self, n: yaml.ScalarNode, path: tuple) -> Any:
        try:
            return self.constructor.construct_object(n, deep=True)
        # PyYAML's scalar constructors raise what they meet: ValueError, IndexError ('!!int' of nothing),
        # AttributeError (a '!!timestamp' that is not one) ...; constructing a scalar has no other effect
        except Exception as exc:
            kind = n.tag.rpartition(":")[2] or n.tag
            text = n.value if len(n.value) <= 40 else f"{n.value[:20]}...({len(n.value)} characters)"
            if "digits" in str(exc):  # Python reads at most 4300 digits of a number
                message, hint = f"a number of {len(n.value)} digits", "no setting needs a number this long"
            else:
                message = f"cannot read {text!r} as {kind}: {getattr(exc, 'problem', None) or exc}"
                hint = "quote the value to make it text"
            self.problems.append(Problem(self.file, n.start_mark.line + 1, n.start_mark.column + 1,
                                         _dotted(path) or None, message, hint))
            self.unreadable.append(_dotted(path))
            return None

    def mapping(self, n: yaml.MappingNode, path: tuple, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        merged: list[yaml.MappingNode] = []
        for key_node, value_node in n.value:
            if key_node.tag == _MERGE_TAG:
                merged += self.merge_sources(value_node, path)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail(key_node, path, "a key must be a name, not a mapping or a list",
                                "write `name: value`; `? [..]` keys are not part of a manifest")
            key = self.scalar(key_node, path + ("?",))
            if key in out:
                self.problems.append(Problem(self.file, key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                                             _dotted(path + (key,)), f"duplicate key {_show(key)}",
                                             "YAML keeps only the last one; remove or rename one of them"))
            self.marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = self.build(value_node, path + (key,), depth + 1)
            self.marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        # `<<: *base` (YAML's merge key): the base's keys, where the mapping does not set them itself; of
        # several bases (`<<: [*a, *b]`) the first that sets a key wins.
        for source in merged:
            for key, value in self.mapping(source, path, depth).items():
                out.setdefault(key, value)
        return out

    def merge_sources(self, value: yaml.Node, path: tuple) -> list[yaml.MappingNode]:
        items = value.value if isinstance(value, yaml.SequenceNode) else [value]
        if all(isinstance(item, yaml.MappingNode) for item in items):
            return list(items)
        raise self.fail(value, path, "`<<` merges a mapping or a list of mappings into this one",
                        "write `<<: *base` where `base` is the anchor of a mapping (`x-base: &base {...}`)")


def _compose(text: str, file: str) -> tuple[Any, dict[tuple, tuple[int, int]], _Builder]:
    try:
        _check_depth(text, file)
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise ManifestError([_syntax_problem(exc, file)]) from None
    builder = _Builder(file)
    data = builder.build(node, ()) if node is not None else None
    return data, builder.marks, builder


def _show(value: Any, limit: int = 60) -> str:
    """repr(value), shortened: a value given in a manifest can be thousands of characters long."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 200:
        return f"a number of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text)} characters)"


def _nearest_mark(marks: dict[tuple, tuple[int, int]], loc: tuple) -> tuple[int, int] | None:
    loc = tuple(loc)
    while loc:
        if loc in marks:
            return marks[loc]
        loc = loc[:-1]
    return marks.get(())


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _model_for(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at `loc` (for 'did you mean' suggestions)."""
    model: Any = Manifest
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or not hasattr(model, "model_fields") or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = _first_model(annotation)
    return model


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _suggest(word: str, options: list[str]) -> str | None:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


@dataclass
class _Located:
    """One pydantic error, its location split into the keys of the YAML and the union members pydantic
    names in between (`list[str]`, `GateSelection`, `KernelEntry`): `members` holds (keys so far, member)."""

    error: dict[str, Any]
    keys: tuple
    members: tuple[tuple[tuple, str], ...]

    def member_at(self, keys: tuple) -> str | None:
        return next((member for where, member in self.members if where == keys), None)


def _locate(error: dict[str, Any], data: Any) -> _Located:
    keys: tuple = ()
    members: list[tuple[tuple, str]] = []
    node = data
    loc = tuple(error["loc"])
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif error["type"] == "missing" and i == len(loc) - 1:
            node = None  # the key that is missing
        else:
            members.append((keys, str(part)))
            continue
        keys += (part,)
    return _Located(error, keys, tuple(members))


def _one_member_per_union(errors: list[_Located]) -> list[_Located]:
    """pydantic reports a value no member of a union accepts once per member. Keep the errors of the
    member the value was meant for, the one that got past the value's kind (into a mapping's keys, a
    list's items); where none did, keep one error that names what the place accepts."""
    by_place: dict[tuple, list[_Located]] = {}
    for e in errors:
        for where, _ in e.members:
            by_place.setdefault(where, []).append(e)
    settled: set[int] = set()  # errors merged into one already: out of the later (inner) unions
    dropped: set[int] = set()
    replaced: dict[int, _Located] = {}
    for where in sorted(by_place, key=len):  # outer unions first
        at = [e for e in by_place[where] if id(e) not in settled and id(e) not in dropped]
        members = list(dict.fromkeys(e.member_at(where) for e in at))
        if len(members) < 2:
            continue  # a discriminated union names only the member it chose
        deeper = {e.member_at(where) for e in at if len(e.keys) > len(where)}
        if deeper:
            dropped.update(id(e) for e in at if e.member_at(where) not in deeper)
            continue
        given = at[0].error.get("input")
        replaced[id(at[0])] = _Located({"type": "union", "loc": where, "input": given, "members": members}, where, ())
        settled.add(id(at[0]))
        dropped.update(id(e) for e in at[1:])
    return [replaced.get(id(e), e) for e in errors if id(e) not in dropped]


def _yaml_item(text: str) -> str:
    """`text` as an item of a YAML flow list: bare where YAML reads it back as the same string, quoted
    otherwise (`*.py` bare would be an alias)."""
    return text if re.fullmatch(r"[A-Za-z_][\w.\-/]*", text) else json.dumps(text)


def _member_text(member: str) -> str:
    """What a union member accepts, in the manifest's words."""
    if member.startswith("literal["):
        return member[len("literal["):-1].replace(",", " or")
    if member.startswith(("list[", "tuple[", "set[")):
        return "a list"
    if member.startswith("dict["):
        return "a mapping"
    models = {m.__name__: m for m in _Strict.__subclasses__()}
    if member in models:
        return "a mapping with keys " + ", ".join(models[member].model_fields)
    return {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}.get(member, member)


def _union_problem(error: dict[str, Any]) -> tuple[str, str | None]:
    options = [_member_text(m) for m in error["members"]]
    expected = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
    given = error.get("input")
    got = {dict: "a mapping", list: "a list"}.get(type(given), repr(given))
    hint = None
    if isinstance(given, str):
        literals = [v for m in error["members"] if m.startswith("literal[") for v in re.findall(r"'([^']+)'", m)]
        hint = _suggest(given, literals)
        if hint is None and any(m.startswith("list[") for m in error["members"]):
            hint = f"for a single item, write a list: [{_yaml_item(given)}]"
    return f"expected {expected} (got {got})", hint


def _owner(item: _Located) -> type[BaseModel] | None:
    """The model whose keys an unknown or missing key at `item` belongs to."""
    models = {m.__name__: m for m in _Strict.__subclasses__()}
    member = item.member_at(item.keys[:-1])
    return models[member] if member in models else _model_for(item.keys[:-1])


def _pydantic_problems(exc: ValidationError, file: str, marks: dict, data: Any) -> list[Problem]:
    errors = _one_member_per_union([_locate(err, data) for err in exc.errors(include_url=False)])
    problems: list[Problem] = []
    seen: set[tuple] = set()
    for item in errors:
        err, loc = item.error, item.keys
        kind = err["type"]
        line, col = _nearest_mark(marks, loc) or (None, None)
        key = _dotted(loc) or None
        hint = None
        given = err.get("input")
        if kind == "union":
            message, hint = _union_problem(err)
            owner = _owner(item)
            if hint is None and owner is not None and loc and loc[-1] in owner.model_fields:
                desc = owner.model_fields[loc[-1]].description
                hint = f"{loc[-1]}: {desc}" if desc else None
        elif kind == "extra_forbidden":
            owner = _owner(item)
            word = str(loc[-1])
            message = f"unknown key {word!r}"
            if owner is Defaults and word in _PER_KERNEL:
                hint = _PER_KERNEL[word]
            elif owner is not None:
                hint = _suggest(word, list(owner.model_fields)) or (
                    "valid keys here: " + ", ".join(owner.model_fields))
        elif kind == "missing":
            message = f"missing required key {str(loc[-1])!r}"
            owner = _owner(item)
            if owner is not None and loc and loc[-1] in owner.model_fields:
                desc = owner.model_fields[loc[-1]].description
                hint = f"{loc[-1]}: {desc}" if desc else None
        elif kind == "value_error" and isinstance((err.get("ctx") or {}).get("error"), ValueError):
            cause = err["ctx"]["error"]  # a validator of this module: its own words, not "Value error, ..."
            message, hint = str(cause), getattr(cause, "hint", None)
        elif kind == "model_type":
            message = f"expected {_member_text((err.get('ctx') or {}).get('class_name', 'dict['))} (got {_show(given)})"
        elif kind == "too_short":
            ctx = err.get("ctx") or {}
            message = f"needs at least {ctx.get('min_length')} item(s), has {ctx.get('actual_length')}"
        else:
            message = err["msg"]
            if kind == "list_type" and isinstance(given, str):
                hint = f"for a single item, write a list: [{_yaml_item(given)}]"
            if kind.startswith("literal_error") and isinstance(given, str):
                options = re.findall(r"'([^']+)'", (err.get("ctx") or {}).get("expected", ""))
                hint = _suggest(given, options)
            if given is not None and not isinstance(given, (dict, list)):
                message += f" (got {_show(given)})"
        if (key, line, message) in seen:
            continue
        seen.add((key, line, message))
        problems.append(Problem(file, line, col, key, message, hint))
    return sorted(problems, key=lambda p: (p.line or 0, p.column or 0))


def load(path: str | Path | None = None, *, check_files: bool = True) -> LoadedManifest:
    """Read, validate and resolve a manifest; raise ManifestError listing every problem."""
    path = Path(path or DEFAULT_MANIFEST)
    file = str(path)
    if not path.exists():
        hint = ("run `kgate run PATH/TO/kgate.yaml`, or create kgate.yaml here (see `kgate schema` and the README)"
                if path.name == DEFAULT_MANIFEST else "check the path")
        raise ManifestError([Problem(file, None, None, None, "manifest not found", hint)])
    text = _read(path, file)
    data, marks, builder = _compose(text, file)
    problems = list(builder.problems)
    if not isinstance(data, dict):
        raise ManifestError(problems + [Problem(
            file, 1, 1, None, "the manifest must be a mapping with 'version' and 'kernels'",
            "start from the example in the README or `kgate schema`")])
    version = data.get("version")
    if version is None and "version" not in builder.unreadable:
        problems.append(Problem(file, 1, 1, "version", "missing 'version'", "add 'version: 1' as the first line"))
    elif type(version) is not int or version not in SUPPORTED_VERSIONS:
        line, col = marks.get(("version",), (None, None))
        if "version" not in builder.unreadable:
            problems.append(Problem(file, line, col, "version", f"unsupported manifest version {_show(version)}",
                                    "this kgate reads version 1; upgrade kgate or write 'version: 1' (the other "
                                    "problems listed are those of version 1)"))
    # the rest is checked as version 1 whatever the version says: one bad line must not hide the others;
    # top-level `x-...` keys are the user's (a place for anchors that entries merge with `<<: *base`)
    data = {**{k: v for k, v in data.items() if not _extension(k)}, "version": SUPPORTED_VERSIONS[0]}
    try:
        model = Manifest.model_validate(data)
    except ValidationError as exc:
        found = _pydantic_problems(exc, file, marks, data)
        raise ManifestError(_in_order(problems + [p for p in found if not _under(p.key, builder.unreadable)])) \
            from None
    loaded = LoadedManifest(path.resolve(), model, marks)
    loaded.path = path
    problems += _semantic_problems(loaded, file, check_files and not problems)
    if problems:
        raise ManifestError(_in_order(problems))
    return loaded


def _no_grad_problems(entry: KernelEntry, file: str, i: int, at: Callable[[tuple], tuple]) -> list[Problem]:
    """`no_grad` names arguments of the gradients' phase: it needs `backward: true`, and with declarative
    inputs each index must be one of them and a floating-point tensor (the others get no gradient anyway)."""
    if not entry.no_grad:
        return []
    line, col = at(("kernels", i, "no_grad"))
    key = f"kernels[{i}].no_grad"
    if not entry.backward:
        return [Problem(file, line, col, key, "no_grad names arguments that get no gradient, but this kernel's "
                        "gradients are not judged (backward is false)",
                        "add `backward: true`, or leave out no_grad")]
    if not isinstance(entry.inputs, list):
        return []  # a factory's arguments are known when it runs (kgate/backward.py checks them there)
    problems = []
    for index in sorted(set(entry.no_grad)):
        if index >= len(entry.inputs):
            problems.append(Problem(file, line, col, key,
                                    f"argument {index} is not one of the {len(entry.inputs)} declared inputs",
                                    f"indices count from 0: 0 to {len(entry.inputs) - 1} here"))
            continue
        spec = entry.inputs[index]
        if spec.value is not None or spec.dtype in INTEGER_DTYPES:
            what = "a Python scalar" if spec.value is not None else f"a tensor of dtype {spec.dtype}"
            problems.append(Problem(file, line, col, key,
                                    f"argument {index} is {what}: only floating-point tensors get gradients",
                                    f"leave {index} out of no_grad"))
    return problems


# text YAML reads as a string where a number was meant: 1e-5 (YAML 1.1 needs 1.0e-5), inf, nan
_READ_AS_TEXT = re.compile(r"^[-+]?(\d+[eE][-+]?\d+|inf(inity)?|nan)$", re.IGNORECASE)


def _yaml_number(text: str) -> str:
    """How to write the number `text` (one _READ_AS_TEXT matches) so that YAML reads a number."""
    number = float(text)
    if math.isnan(number):
        return ".nan"
    if math.isinf(number):
        return "-.inf" if number < 0 else ".inf"
    return re.sub(r"^([-+]?\d+)([eE])", r"\1.0\2", text)


def _extension(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("x-")


def _in_order(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line or 0, p.column or 0))


def _under(key: str | None, keys: list[str]) -> bool:
    """Whether `key` is one of `keys` or lies inside one of them."""
    return key is not None and any(key == k or key.startswith((k + ".", k + "[")) for k in keys)


def _semantic_problems(loaded: LoadedManifest, file: str, check_files: bool) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[str, int] = {}

    def at(loc: tuple) -> tuple[int | None, int | None]:
        mark = _nearest_mark(loaded._marks, loc)
        return mark if mark else (None, None)

    def gate_problems(spec: Any, loc: tuple) -> None:
        if spec == "all" or spec is None:
            return
        unknown = [name for name in _names(spec) if name not in KNOWN_GATES]
        line, col = at(loc)
        for name in unknown:
            problems.append(Problem(file, line, col, _dotted(loc), f"unknown gate {_show(name)}",
                                    _suggest(name, KNOWN_GATES) or "`kgate gates` lists the gates"))
        if not unknown and not _selected(spec, KNOWN_GATES):  # a pass with nothing judged would read as a pass
            problems.append(Problem(file, line, col, _dotted(loc), "selects no gate",
                                    "name at least one gate (`kgate gates` lists them), or leave `gates` out for all"))

    gate_problems(loaded.model.defaults.gates, ("defaults", "gates"))
    for i, kernel in enumerate(loaded.kernels):
        entry = kernel.entry
        if entry.name in seen:
            line, col = at(("kernels", i, "name"))
            problems.append(Problem(file, line, col, f"kernels[{i}].name", f"duplicate kernel name {entry.name!r}",
                                    f"first used by kernels[{seen[entry.name]}]; names must be unique"))
        seen.setdefault(entry.name, i)
        gate_problems(entry.gates, ("kernels", i, "gates"))
        if isinstance(entry.inputs, list):
            for index in entry.inplace:
                if index >= len(entry.inputs):
                    line, col = at(("kernels", i, "inplace"))
                    problems.append(Problem(file, line, col, f"kernels[{i}].inplace",
                                            f"argument {index} is not one of the {len(entry.inputs)} declared inputs",
                                            f"indices count from 0: 0 to {len(entry.inputs) - 1} here"))
        problems += _no_grad_problems(entry, file, i, at)
        for name, value in entry.kwargs.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and _READ_AS_TEXT.match(item):
                    line, col = at(("kernels", i, "kwargs", name))
                    number = _yaml_number(item)
                    problems.append(Problem(file, line, col, f"kernels[{i}].kwargs.{name}",
                                            f"keyword argument {name!r}: {item!r} is read as text, not a number "
                                            "(YAML 1.1 reads a number with an exponent only with a '.', and "
                                            "infinities and NaN only as .inf and .nan)",
                                            f"write {number}"))
        for gate in entry.expect or {}:  # gate ids: a gate name, or NAME[backward] with `backward: true`
            base, backward_id = gate.removesuffix(BACKWARD_SUFFIX), gate.endswith(BACKWARD_SUFFIX)
            if base in KNOWN_GATES and (not backward_id or entry.backward and base in GATE_NAMES):
                continue
            line, col = at(("kernels", i, "expect", gate))
            hint = ("add `backward: true` or drop the [backward] id" if base in GATE_NAMES
                    else f"{base} has no gradients' phase: drop the [backward] id" if base in KNOWN_GATES
                    else _suggest(base, KNOWN_GATES) or "`kgate gates` lists the gates")
            problems.append(Problem(file, line, col, f"kernels[{i}].expect", f"unknown gate id {gate!r}", hint))
        if not check_files:
            continue
        refs = [("kernel", kernel.kernel), ("reference", kernel.reference)]
        if isinstance(kernel.inputs, Ref):
            refs.append(("inputs", kernel.inputs))
        for key, ref in refs:
            line, col = at(("kernels", i, key))
            problem = _check_ref(ref, key, kernel)
            if problem:
                message, hint = problem
                problems.append(Problem(file, line, col, f"kernels[{i}].{key}", message, hint))
            elif key in ("kernel", "reference"):
                for name, message, hint in _kwargs_problems(ref, key, kernel):
                    line, col = at(("kernels", i, "kwargs", name))
                    problems.append(Problem(file, line, col, f"kernels[{i}].kwargs.{name}", message, hint))
    for i, entry in enumerate(loaded.model.kernels):
        if not isinstance(entry, KernelBenchEntry) or not check_files:
            continue
        for key in ("problems", "candidates", "index"):
            value = getattr(entry, key)
            target = loaded.base / value if value else None
            if target is not None and not (target.is_file() if key == "index" else target.is_dir()):
                line, col = at(("kernels", i, key))
                problems.append(Problem(file, line, col, f"kernels[{i}].{key}",
                                        f"{'file' if key == 'index' else 'folder'} not found: {target}",
                                        "paths are relative to the manifest's folder"))
    return problems


# --------------------------------------------------------------------------------------------------
# Checking references without importing them (imports run untrusted code: that happens in workers).


def worker_sys_path(base: Path) -> tuple[str, ...]:
    """The sys.path a worker starts with: kgate.runner's start in the manifest's folder, in this
    environment (PYTHONPATH included), where the folder kgate was started from is not on the path."""
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PYTHON")))
    return _started_sys_path(str(base), settings)


@functools.lru_cache(maxsize=16)
def _started_sys_path(base: str, settings: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    try:  # `python -m site` prints sys.path, one repr a line; nothing of the folder is imported to do it
        done = subprocess.run(kgate_command("site"), cwd=base, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, env=allowed_env())
        lines = done.stdout.splitlines()
        start = lines.index("sys.path = [") + 1
        return tuple(ast.literal_eval(line.strip().rstrip(",")) for line in lines[start:lines.index("]", start)])
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError):
        return tuple(p for p in sys.path[1:] if p)  # this process's, less the entry its own start put first


def _find_module(module: str, search: list[str]) -> Path | None:
    """The file of `module` as an import with sys.path = `search` would find it (None: not found, or not a
    file), without running any of its code."""
    parts = module.split(".")
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        if i < len(parts) - 1:
            search = list(spec.submodule_search_locations or [])
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    return Path(spec.origin)


def _found_on(module: str, search: list[str]) -> str | None:
    """The entry of `search` that `module`'s top-level package is found in."""
    top = module.split(".")[0]
    return next((p for p in search if importlib.machinery.PathFinder.find_spec(top, [p]) is not None), None)


# CPython 3.11's AST constructor keeps its recursion depth in the interpreter state, not per thread: two
# threads parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (gh-106905,
# seen when kgate run's workers' threads looked up their kernels' source lines together).
_PARSE_LOCK = threading.RLock()  # reentrant: a finalizer run during a parse may parse too


def _parse_source(path: Path) -> ast.Module:
    """The module at `path` parsed (OSError, UnicodeDecodeError and SyntaxError as `ast.parse` raises them),
    one parse at a time in this process."""
    source = path.read_text(encoding="utf-8")
    with _PARSE_LOCK:
        return ast.parse(source, filename=str(path))


def _definition_line(path: Path, attr: str) -> int | None:
    try:
        tree = _parse_source(path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    head = attr.split(".")[0]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == head:
            return node.lineno
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == head for t in node.targets):
            return node.lineno
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name) \
                and node.target.id == head:
            return node.lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == head:
                    return node.lineno
    return None


def _defined_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Top-level names a module defines, and whether it may define others dynamically."""
    names: set[str] = set()
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            dynamic = True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("globals", "setattr",
                                                                                                "exec"):
            dynamic = True
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if node.name == "__getattr__":
                dynamic = True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name.split(".")[0]) for a in node.names)
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names, dynamic


def _module_not_found(ref: Ref, kernel: ResolvedKernel) -> tuple[str, str]:
    module = ref.module or ""
    base = kernel.manifest.base
    here = _found_on(module, [p for p in sys.path if p] + [os.getcwd()])
    if here is None:
        return (f"module {module!r} not found on the worker's Python path",
                "the worker imports from the manifest's folder, the folders of file references, PYTHONPATH "
                "and the installed packages: install the package, or name a file: 'path/to/file.py:attr'")
    return (f"module {module!r} not found on the worker's Python path: it imports only from {here}",
            f"{here} is on the path of this process (the folder it was started from, say), not on the worker's, "
            f"which starts in the manifest's folder {base}: install the package (pip install -e), add {here} to "
            "PYTHONPATH, or move the package beside the manifest")


def _check_ref(ref: Ref, role: str, kernel: ResolvedKernel) -> tuple[str, str | None] | None:
    if ref.is_file:
        assert ref.path is not None
        if not ref.path.exists():
            return (f"file not found: {ref.path}", "paths are relative to the manifest's folder")
        path = ref.path
    else:
        if (ref.module or "").split(".")[0] in sys.builtin_module_names:
            return None
        found = kernel.ref_file(role)
        if found is None:
            return _module_not_found(ref, kernel)
        path = found
    if path.suffix != ".py":
        return None  # compiled module: its attributes are checked when the worker imports it
    try:
        tree = _parse_source(path)
    except SyntaxError as exc:
        return (f"{path}:{exc.lineno}: syntax error: {exc.msg}", None)
    except (OSError, UnicodeDecodeError) as exc:
        return (f"cannot read {path}: {exc}", None)
    names, dynamic = _defined_names(tree)
    head = ref.attr.split(".")[0]
    if role in ("kernel", "reference") and ref.attr in _module_classes(tree) and _last_binding(tree, ref.attr) == "class":
        return _module_class_problem(ref, role, tree)
    if head in names or dynamic:
        return None
    public = sorted(n for n in names if not n.startswith("_"))
    hint = _suggest(head, public) or (f"{path.name} defines: {', '.join(public[:12])}" if public else None)
    return (f"attribute {head!r} not found in {path}", hint)


def _kwargs_problems(ref: Ref, role: str, kernel: ResolvedKernel) -> list[tuple[str, str, str]]:
    """(name, message, hint) for each of `kwargs` that the function `ref` names cannot take by keyword, as its
    definition reads (a plain top-level `def` of a Python file; a decorated one, a module, a method or a
    compiled callable is checked when the worker imports it), or that a declarative input fills by position."""
    if not ref.kwargs or "." in ref.attr:
        return []
    path = ref.path if ref.is_file else kernel.ref_file(role)
    try:
        tree = _parse_source(path) if path is not None and path.suffix == ".py" else None
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    binding = None
    for node in tree.body if tree is not None else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == ref.attr:
            binding = node
        elif ref.attr in _bound_names(node):
            binding = None
    if not isinstance(binding, (ast.FunctionDef, ast.AsyncFunctionDef)) or binding.decorator_list:
        return []
    args = binding.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    filled = len(kernel.inputs) if isinstance(kernel.inputs, list) else 0
    found = []
    for name in ref.kwargs:
        where = f"{role} {ref.text}({', '.join(positional + [a.arg for a in args.kwonlyargs])})"
        if name in [a.arg for a in args.posonlyargs]:
            found.append((name, f"keyword argument {name!r}: the {where} takes {name!r} by position only",
                          "give it as a declarative input in its position, or drop the '/' from the signature"))
        elif name in positional and positional.index(name) < filled:
            index = positional.index(name)
            found.append((name, f"keyword argument {name!r} is also argument {index} of the {where}, which the "
                          f"declarative input {index} fills by position: the call would get {name!r} twice",
                          f"drop {name!r} from kwargs or input {index} from inputs"))
        elif name not in positional + [a.arg for a in args.kwonlyargs] and args.kwarg is None:
            found.append((name, f"the {where} takes no keyword argument {name!r}",
                          _suggest(name, positional + [a.arg for a in args.kwonlyargs])
                          or "kwargs go to both the kernel and the reference: both must take each name"))
    return found


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a top-level statement other than a def or class may bind: assigned or imported anywhere in it
    (`if ...: kern = torch.compile(kern)` counts)."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.split(".")[0] for alias in sub.names)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node:
            names.add(sub.name)
    return names


def _module_classes(tree: ast.Module) -> set[str]:
    """The top-level classes of a file that derive from torch.nn.Module (a torch.nn layer, or another
    such class of the file), as far as its imports show."""
    origin: dict[str, str] = {}  # local name -> what it was imported as
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                origin[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                origin[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    found: set[str] = set()

    def is_module(base: ast.expr) -> bool:
        head, _, rest = ast.unparse(base).partition(".")
        name = ".".join(filter(None, [origin.get(head, head), rest]))
        last = name.rsplit(".", 1)[-1]
        return name in found or (name.startswith("torch.nn.") and last[:1].isupper()
                                 and not last.endswith(("Parameter", "Buffer")))

    grew = True
    while grew:
        grew = False
        for name, node in classes.items():
            if name not in found and any(is_module(b) for b in node.bases) and not any(
                    isinstance(n, ast.FunctionDef) and n.name == "__new__" for n in node.body):
                found.add(name)
                grew = True
    return found


def _last_binding(tree: ast.Module, name: str) -> str | None:
    """What binds `name` last at the top level of a file: "class", "other" (an assignment, a def, an import:
    `Softmax = Softmax()` makes the name an instance) or None."""
    kind = None
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            kind = "class" if isinstance(node, ast.ClassDef) else "other"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for target in targets for n in ast.walk(target)):
                kind = "other"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                kind = "other"
    return kind


def _module_class_problem(ref: Ref, role: str, tree: ast.Module) -> tuple[str, str]:
    target = ref.text.rpartition(":")[0]
    instances = [t.id for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                 and ast.unparse(node.value.func) == ref.attr for t in node.targets if isinstance(t, ast.Name)]
    if instances:
        hint = f"name the instance the file makes: '{target}:{instances[0]}'"
    else:
        instance = re.sub(r"(?<!^)(?=[A-Z])", "_", ref.attr).lower()
        instance = instance if instance != ref.attr else f"{instance}_instance"
        hint = f"make one in the file, e.g. `{instance} = {ref.attr}(...)`, and name it: '{target}:{instance}'"
    return (f"{ref.attr!r} is an nn.Module class, but the {role} must be an instance (or a function): kgate "
            f"calls the {role} with the inputs, and calling the class would only construct a module", hint)
