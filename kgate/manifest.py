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
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    Tag,
    ValidationError,
    field_validator,
)

from kgate.errors import ManifestError, Problem

SUPPORTED_VERSIONS = (1,)
DEFAULT_MANIFEST = "kgate.yaml"

DTYPE_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64", "f64": "float64",
}
DTYPES = ("float16", "bfloat16", "float32", "float64")
VERDICTS = ("pass", "fail", "error", "skip")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
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
    if _INTEGER_DTYPE_RE.match(value):
        if declarative:
            return InvalidValue(
                f"integer dtype {value!r}: declarative arguments are made in floating-point dtypes only "
                f"({_DTYPE_LIST})",
                "make integer arguments (indices, masks, lengths) in an inputs factory "
                "(`inputs: file.py:make_inputs`); kgate passes integer tensors through unchanged")
        return InvalidValue(
            f"integer dtype {value!r} cannot be swept: `dtypes` are the floating-point precisions a kernel is "
            f"judged in ({_DTYPE_LIST})",
            "kgate casts the floating-point inputs to each one and scales the oracle bound by its eps; integer "
            "tensors (indices, masks) come from an inputs factory and pass through unchanged, and integer "
            "outputs are compared exactly")
    options = list(DTYPES) + list(DTYPE_ALIASES)
    return InvalidValue(f"unsupported dtype {value!r}: kgate judges {_DTYPE_LIST}",
                        _suggest(value, options) or "aliases: " + ", ".join(DTYPE_ALIASES))


def _dtype(value: Any, *, declarative: bool = False) -> Any:
    if isinstance(value, str):
        value = DTYPE_ALIASES.get(value.lower(), value)
        if value not in DTYPES:
            raise _unsupported_dtype(value, declarative=declarative)
    return value


def _argument_dtype(value: Any) -> Any:
    return _dtype(value, declarative=True)


def parse_memory(value: Any) -> int:
    """'8GiB', '512MB', 1073741824 -> bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as '8GiB' or a number of bytes")
    if isinstance(value, int):
        return value
    match = _MEMORY_RE.match(str(value))
    if not match:
        raise ValueError(f"cannot read {value!r} as a size; write e.g. '8GiB', '512MiB' or a number of bytes")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "B").lower()])


def _device(value: Any) -> Any:
    if isinstance(value, str) and not _DEVICE_RE.match(value):
        hint = ("a GPU is 'cuda' (or 'cuda:N')" if "gpu" in value.lower()
                else _suggest(value, ["auto", "cpu", "cuda"]) or "auto: cuda when there is a GPU, else cpu")
        raise InvalidValue(f"device {value!r} is not one of auto, cpu, cuda, cuda:N", hint)
    return value


DType = Annotated[Literal["float16", "bfloat16", "float32", "float64"], BeforeValidator(_dtype)]
ArgumentDType = Annotated[Literal["float16", "bfloat16", "float32", "float64"], BeforeValidator(_argument_dtype)]
Device = Annotated[str, BeforeValidator(_device)]
Memory = Annotated[int, BeforeValidator(parse_memory)]
Verdict = Literal["pass", "fail", "error", "skip"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tolerance(_Strict):
    """How far from the float64 oracle a kernel may be (see docs: the oracle bound).

    bound = factor * max|reference_in_dtype - oracle| + ulps * eps(dtype) * max|oracle| + atol
    """

    factor: float = Field(8.0, gt=0, description="c: multiple of the reference's own error in the kernel's dtype")
    ulps: float = Field(4.0, ge=0, description="floor, in units of eps(dtype) x max|oracle|")
    atol: float = Field(0.0, ge=0, description="absolute floor added to the bound")


class GateSelection(_Strict):
    include: list[str] | None = Field(None, description="gates to run (default: all)")
    exclude: list[str] = Field(default_factory=list, description="gates not to run")


GateSpec = Literal["all"] | list[str] | GateSelection


class ArgSpec(_Strict):
    """A declarative input: one positional argument made by torch.testing.make_tensor."""

    shape: list[int] | None = Field(None, description="shape; omitted = the shape being swept")
    dtype: ArgumentDType | None = Field(None, description="dtype; omitted = the dtype being swept")
    low: float | None = None
    high: float | None = None
    value: float | int | bool | None = Field(None, description="a Python scalar argument instead of a tensor")


class Limits(_Strict):
    timeout: float = Field(300.0, gt=0, description="seconds one gate of one kernel may take")
    memory: Memory = Field(8 * 2**30, description="resident memory of a worker process, e.g. '8GiB'")


class Defaults(_Strict):
    device: Device = "auto"
    dtypes: list[DType] = Field(default_factory=lambda: ["float32"], min_length=1)
    gates: GateSpec = "all"
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    tolerance: Tolerance = Field(default_factory=Tolerance)
    limits: Limits = Field(default_factory=Limits)


class KernelEntry(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-/]+$", description="unique name, used by -k and in reports")
    kernel: str = Field(description="'path/to/file.py:attr' or 'package.module:attr'")
    reference: str = Field(description="the callable that defines the meaning, same reference syntax")
    inputs: str | list[ArgSpec] | None = Field(
        None, description="factory 'file.py:make_inputs' (called as make_inputs(seed, shape=, dtype=, device=)) "
        "or a list of declarative argument specs")
    shapes: list[list[NonNegativeInt]] | None = Field(None, description="shapes passed to the inputs factory")
    dtypes: list[DType] | None = Field(None, min_length=1)
    gates: GateSpec | None = None
    seeds: list[int] | None = Field(None, min_length=1)
    backward: bool = Field(False, description="also judge gradients against float64 autograd of the reference")
    inplace: list[NonNegativeInt] = Field(default_factory=list,
                                          description="indices of arguments the kernel may modify")
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


class KernelBenchEntry(_Strict):
    """A corpus in KernelBench format (problems with Model/get_inputs/get_init_inputs, candidates with
    ModelNew), judged by `kgate audit --manifest` rather than by `kgate run`."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-/]+$", description="unique name, used for the output subfolder")
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
    return schema


# --------------------------------------------------------------------------------------------------
# The resolved manifest: what the runner uses.


class Ref:
    """A parsed 'target:attr' reference, resolved against the manifest's folder."""

    def __init__(self, text: str, base: Path):
        self.text = text
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
        self.kernel = Ref(entry.kernel, base)
        self.reference = Ref(entry.reference, base)
        self.inputs: Ref | list[ArgSpec] | None = (
            Ref(entry.inputs, base) if isinstance(entry.inputs, str) else entry.inputs)
        self.shapes = [tuple(s) for s in entry.shapes] if entry.shapes else [None]
        self.dtypes = list(entry.dtypes or defaults.dtypes)
        self.seeds = list(entry.seeds or defaults.seeds)
        self.gate_spec = entry.gates if entry.gates is not None else defaults.gates
        self.tolerance = entry.tolerance or defaults.tolerance
        self.device = entry.device or defaults.device
        self.limits = entry.limits or defaults.limits
        self.line = manifest.line_of(("kernels", index))

    def selected_gates(self, all_names: list[str]) -> list[str]:
        spec = self.gate_spec
        if spec == "all":
            return list(all_names)
        if isinstance(spec, list):
            return [g for g in all_names if g in spec]
        chosen = all_names if spec.include is None else [g for g in all_names if g in spec.include]
        return [g for g in chosen if g not in spec.exclude]

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
        """What a result of this kernel was judged on: the manifest's text and the kernel's, reference's and
        inputs' files (kgate run --resume keeps only results recorded under the same digest)."""
        h = hashlib.sha256(self.manifest.path.read_bytes() if self.manifest.path.exists() else b"")
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


def _compose(text: str, file: str) -> tuple[Any, dict[tuple, tuple[int, int]], list[Problem]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        message = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
        raise ManifestError([Problem(file, mark.line + 1 if mark else None, mark.column + 1 if mark else None,
                                     None, message, "check indentation and quoting on that line")]) from None
    marks: dict[tuple, tuple[int, int]] = {}
    problems: list[Problem] = []
    constructor = yaml.constructor.SafeConstructor()

    def build(n: yaml.Node, path: tuple) -> Any:
        marks.setdefault(path, (n.start_mark.line + 1, n.start_mark.column + 1))
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in n.value:
                key = constructor.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise ManifestError([Problem(file, key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                                                 _dotted(path) or None, f"a key must be a name, not {key!r}",
                                                 "write `name: value`; `? [..]` keys are not part of a manifest")])
                if key in out:
                    problems.append(Problem(file, key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                                            _dotted(path + (key,)), f"duplicate key {key!r}",
                                            "YAML keeps only the last one; remove or rename one of them"))
                marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                out[key] = build(value_node, path + (key,))
                marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, path + (i,)) for i, item in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    data = build(node, ()) if node is not None else None
    return data, marks, problems


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
    places = sorted({where for e in errors for where, _ in e.members}, key=len)  # outer unions first
    for where in places:
        at = [e for e in errors if e.member_at(where) is not None]
        members = list(dict.fromkeys(e.member_at(where) for e in at))
        if len(members) < 2:
            continue  # a discriminated union names only the member it chose
        deeper = {e.member_at(where) for e in at if len(e.keys) > len(where)}
        if deeper:
            errors = [e for e in errors if e not in at or e.member_at(where) in deeper]
            continue
        given = at[0].error.get("input")
        merged = _Located({"type": "union", "loc": where, "input": given, "members": members}, where, ())
        errors = [merged if e is at[0] else e for e in errors if e is at[0] or e not in at]
    return errors


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
            if owner is not None:
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
            message = f"expected {_member_text((err.get('ctx') or {}).get('class_name', 'dict['))} (got {given!r})"
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
                message += f" (got {given!r})"
        if any((p.key, p.line, p.message) == (key, line, message) for p in problems):
            continue
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
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([Problem(file, None, None, None, f"cannot read manifest: {exc}")]) from None
    data, marks, problems = _compose(text, file)
    if problems:
        raise ManifestError(problems)
    if not isinstance(data, dict):
        raise ManifestError([Problem(file, 1, 1, None, "the manifest must be a mapping with 'version' and 'kernels'",
                                     "start from the example in the README or `kgate schema`")])
    version = data.get("version")
    if version is None:
        raise ManifestError([Problem(file, 1, 1, "version", "missing 'version'",
                                     "add 'version: 1' as the first line")])
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        line, col = marks.get(("version",), (None, None))
        raise ManifestError([Problem(file, line, col, "version", f"unsupported manifest version {version!r}",
                                     "this kgate reads version 1; upgrade kgate or write 'version: 1'")])
    try:
        model = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(_pydantic_problems(exc, file, marks, data)) from None
    loaded = LoadedManifest(path.resolve(), model, marks)
    loaded.path = path
    problems = _semantic_problems(loaded, file, check_files)
    if problems:
        raise ManifestError(problems)
    return loaded


def _semantic_problems(loaded: LoadedManifest, file: str, check_files: bool) -> list[Problem]:
    from kgate.gates import GATE_NAMES

    problems: list[Problem] = []
    seen: dict[str, int] = {}

    def at(loc: tuple) -> tuple[int | None, int | None]:
        mark = _nearest_mark(loaded._marks, loc)
        return mark if mark else (None, None)

    def gate_problems(spec: Any, loc: tuple) -> None:
        if spec == "all" or spec is None:
            return
        names = spec if isinstance(spec, list) else (spec.include or []) + list(spec.exclude)
        for name in names:
            if name not in GATE_NAMES:
                line, col = at(loc)
                problems.append(Problem(file, line, col, _dotted(loc), f"unknown gate {name!r}",
                                        _suggest(name, GATE_NAMES) or "`kgate gates` lists the gates"))

    gate_problems(loaded.model.defaults.gates, ("defaults", "gates"))
    for i, kernel in enumerate(loaded.kernels):
        entry = kernel.entry
        if entry.name in seen:
            line, col = at(("kernels", i, "name"))
            problems.append(Problem(file, line, col, f"kernels[{i}].name", f"duplicate kernel name {entry.name!r}",
                                    f"first used by kernels[{seen[entry.name]}]; names must be unique"))
        seen.setdefault(entry.name, i)
        gate_problems(entry.gates, ("kernels", i, "gates"))
        for gate in entry.expect or {}:  # gate ids: a gate name, or NAME[backward] with `backward: true`
            base, backward_id = gate.removesuffix("[backward]"), gate.endswith("[backward]")
            if base in GATE_NAMES and (entry.backward or not backward_id):
                continue
            line, col = at(("kernels", i, "expect", gate))
            hint = ("add `backward: true` or drop the [backward] id" if base in GATE_NAMES
                    else _suggest(base, GATE_NAMES) or "`kgate gates` lists the gates")
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
    from kgate.runner import kgate_command  # the very command the workers start with
    from kgate.sandbox import allowed_env

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


def _definition_line(path: Path, attr: str) -> int | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
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
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
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
