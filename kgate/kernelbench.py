"""The KernelBench format: problems (`Model`, `get_inputs()`, `get_init_inputs()`) and candidates
(`ModelNew`), how they pair, and how one pair becomes a gate `Subject` inside a worker.

Pairing: candidate `X.py` or `X__anything.py` goes with problem `X.py`, the longest such `X` a problem has
(upstream problem names hold `__` too). A candidate in a subfolder
first looks for the problem under the same relative folder (`level1/X.py`), then anywhere under the
problems folder; an index file (JSON or CSV with `candidate` and `problem` columns) overrides both.

Loading (in the worker only: it runs untrusted code). The problem file is executed twice, as two
module objects that are not left in `sys.modules`: one copy builds the reference `Model` (and its
float64 oracle twin), the other makes the inputs. Both are fingerprinted before the candidate is
imported and checked again after every stage, so a candidate that rewrites the problem's constants,
functions or `get_inputs()` is caught rather than believed. Weights match KernelBench's way: seed,
build `Model`, seed again with the same seed, build `ModelNew`.

Shapes. A KernelBench problem has one shape: whatever `get_inputs()` makes. Its *free size
parameters* are the module-level integers that change the shapes `get_inputs()` makes while leaving
`get_init_inputs()` (so the weights) unchanged, typically `batch_size`, sequence lengths or spatial
sizes. For the gates, a problem's "shape" is the tuple of those parameters' values, in the order the
module defines them; a gate that sweeps shapes sets them (on the inputs copy only) and calls
`get_inputs()` again. A problem without free size parameters cannot be swept, and the report says so.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.util
import json
import re
import secrets
import shlex
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgate.errors import UsageError

PAIR_SEP = "__"
DEFAULT_SEED = 42  # KernelBench's seed_num default
_LEVEL_RE = re.compile(r"level[_\-]?(\d+)", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------
# Discovery and pairing (parent process: reads files, runs nothing).


@dataclass
class Pair:
    """One candidate and the problem it is judged against (None: unpaired, `problem_error` says why)."""

    id: str
    candidate: Path
    problem: Path | None
    level: int | None = None
    problem_error: str | None = None
    labels: dict[str, str] = field(default_factory=dict)  # extra index columns (e.g. a harness's verdict)

    @property
    def problem_name(self) -> str | None:
        return self.problem.stem if self.problem else None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "candidate": str(self.candidate), "problem": str(self.problem) if self.problem else None,
                "level": self.level, "problem_error": self.problem_error, "labels": self.labels}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Pair:
        return cls(data["id"], Path(data["candidate"]), Path(data["problem"]) if data.get("problem") else None,
                   data.get("level"), data.get("problem_error"), dict(data.get("labels") or {}))


def level_of(*paths: Path | str | None) -> int | None:
    """The KernelBench level named in a path (`level1/`, `level_2/`, `level-3`), if any."""
    for path in paths:
        if path is None:
            continue
        for part in reversed(Path(path).parts):
            match = _LEVEL_RE.fullmatch(part) or _LEVEL_RE.match(part)
            if match:
                return int(match.group(1))
    return None


def problem_keys(candidate: Path) -> list[str]:
    """The problem names a candidate may go with, longest first: its whole stem, then the stem cut at each
    `__` from the right. `A__b__sample3.py` -> [`A__b__sample3`, `A__b`, `A`]: upstream problem names hold
    `__` themselves (`50_conv_standard_2D__square_input__square_kernel.py`), so the longest name that a
    problem has wins."""
    stem = candidate.stem
    keys = [stem]
    while PAIR_SEP in keys[-1]:
        keys.append(keys[-1].rsplit(PAIR_SEP, 1)[0])
    return [k for k in keys if k]


def _python_files(root: Path) -> list[Path]:
    """The .py files under `root`, hidden folders (.ipynb_checkpoints, .git), __pycache__ and package
    markers (__init__.py) left out: none of them is a problem or a candidate."""
    def kept(p: Path) -> bool:
        parts = p.relative_to(root).parts
        return (p.is_file() and p.name != "__init__.py"
                and not any(part.startswith(".") or part == "__pycache__" for part in parts))
    return sorted(p for p in root.rglob("*.py") if kept(p))


def _candidate_id(path: Path, root: Path) -> str:
    return path.relative_to(root).with_suffix("").as_posix()


def discover(problems: Path, candidates: Path, index: Path | None = None) -> list[Pair]:
    """Every candidate under `candidates` (or listed in `index`), paired with its problem."""
    problems, candidates = Path(problems), Path(candidates)
    for label, folder in (("--problems", problems), ("--candidates", candidates)):
        if not folder.is_dir():
            raise UsageError(f"{label} {folder}: not a folder (it must hold KernelBench .py files)")
    if index is not None:
        return _pairs_from_index(Path(index), problems, candidates)
    by_relpath = {p.relative_to(problems).with_suffix("").as_posix(): p for p in _python_files(problems)}
    by_stem: dict[str, list[Path]] = {}
    for p in by_relpath.values():
        by_stem.setdefault(p.stem, []).append(p)
    pairs = []
    for cand in _python_files(candidates):
        rel = cand.relative_to(candidates)
        keys = problem_keys(cand)
        problem: Path | None = None
        error = None
        for key in keys:  # the longest name a problem has: in the same subfolder, else anywhere
            problem = by_relpath.get((rel.parent / key).as_posix())
            if problem is not None:
                break
            found = by_stem.get(key, [])
            if len(found) == 1:
                problem = found[0]
                break
            if len(found) > 1:
                error = (f"problem name {key!r} is ambiguous: {', '.join(str(f) for f in found)}; put the candidate "
                         f"in the same subfolder as its problem or pair them with --index")
                break
        if problem is None and error is None:
            names = " or ".join(f"{k}.py" for k in keys)
            error = (f"no problem {names} under {problems} (a candidate X.py or X__anything.py goes with "
                     f"problem X.py; use --index to pair other names)")
        pairs.append(Pair(_candidate_id(cand, candidates), cand, problem, level_of(problem, rel), error))
    if not pairs:
        raise UsageError(f"--candidates {candidates}: no .py files found")
    return pairs


def read_index(path: Path) -> list[tuple[str, dict[str, str]]]:
    """Rows of an index file, each with where it is for messages (a JSON entry's number, a CSV row's line):
    JSON (a list of objects, or {candidate: problem}; a file named .json or whose text starts with `[` or
    `{`) or CSV with a header naming `candidate` and `problem`."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a spreadsheet's byte-order mark is not a column name
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--index {path}: cannot read: {exc}") from None
    rows: list[dict[str, str]]
    is_json = path.suffix.lower() == ".json" or text.lstrip()[:1] in ("[", "{")
    if is_json:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--index {path}: not valid JSON: {exc}") from None
        if isinstance(data, dict):
            rows = [{"candidate": str(k), "problem": str(v)} for k, v in data.items()]
        elif isinstance(data, list) and all(isinstance(r, dict) for r in data):
            rows = [{str(k): "" if v is None else str(v) for k, v in r.items()} for r in data]
        else:
            raise UsageError(f"--index {path}: expected a list of {{\"candidate\": ..., \"problem\": ...}} objects "
                             "or one {candidate: problem} object")
    else:
        reader = csv.DictReader(text.splitlines())
        header = [name.strip() for name in reader.fieldnames or []]
        if "candidate" not in header or "problem" not in header:
            raise UsageError(f"--index {path}: line 1 must be a comma-separated header naming the columns "
                             f"'candidate' and 'problem' (found {header}); or give a JSON list of objects")
        reader.fieldnames = header
        rows = []
        for i, r in enumerate(reader):
            if None in r:
                raise UsageError(f"--index {path}: line {i + 2} has more fields than the header ({len(header)})")
            rows.append({k: v.strip() if isinstance(v, str) else v for k, v in r.items()})
    located = [(f"entry {i + 1}" if is_json else f"line {i + 2}", row) for i, row in enumerate(rows)]
    for where, row in located:
        if not row.get("candidate") or not row.get("problem"):
            raise UsageError(f"--index {path}: {where} needs both 'candidate' and 'problem' (got {row})")
    return located


def _locate(text: str, bases: list[Path]) -> Path | None:
    candidate = Path(text)
    if candidate.is_absolute():
        return candidate if candidate.is_file() else None
    for base in bases:
        for option in (base / text, base / f"{text}.py"):
            if option.is_file():
                return option
    return None


def _pairs_from_index(path: Path, problems: Path, candidates: Path) -> list[Pair]:
    pairs: list[Pair] = []
    seen: dict[str, str] = {}
    for where, row in read_index(path):
        cand = _locate(row["candidate"], [candidates, path.parent])
        if cand is None:
            raise UsageError(f"--index {path}: {where}: candidate {row['candidate']!r} not found under "
                             f"{candidates} or {path.parent}")
        problem = _locate(row["problem"], [problems, path.parent])
        error = None if problem else f"problem {row['problem']!r} (from {path}) not found under {problems}"
        try:
            ident = _candidate_id(cand.resolve(), candidates.resolve())
        except ValueError:
            ident = Path(row["candidate"]).with_suffix("").as_posix()
        if ident in seen:
            raise UsageError(f"--index {path}: candidate {ident!r} listed twice ({seen[ident]} and {where})")
        seen[ident] = where
        labels = {k: v for k, v in row.items() if k not in ("candidate", "problem") and v is not None}
        level = int(labels["level"]) if labels.get("level", "").isdigit() else level_of(problem, row["candidate"])
        pairs.append(Pair(ident, cand, problem, level, error, labels))
    if not pairs:
        raise UsageError(f"--index {path}: no entries")
    return pairs


def source_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# Loading inside the worker.


class ProblemError(Exception):
    """The problem file itself is unusable (not the candidate's fault)."""


def exec_problem(path: Path, role: str, sizes: dict[str, int] | None = None) -> types.ModuleType:
    """A fresh copy of the problem module, under a random name, not left in sys.modules. With `sizes`, the problem
    as if written with those module-level integers (`sized_source`): what the module derives from them at import
    (a bias shape `(out_channels, 1, 1)`) follows."""
    name = f"_kgate_kb_problem_{role}_{secrets.token_hex(6)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"cannot import problem {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # some code (dataclasses, typing) looks itself up while it executes
    try:
        if sizes:
            exec(compile(sized_source(path, sizes), str(path), "exec"), vars(module))  # noqa: S102 - the problem's own code
        else:
            spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - reported as the problem's fault, with the cause
        raise ProblemError(f"problem {path.name} failed to import: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules.pop(name, None)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(getattr(module, attr, None)):
            raise ProblemError(f"problem {path.name} defines no callable {attr!r} (KernelBench problems define "
                               "Model, get_inputs and get_init_inputs)")
    return module


def sized_source(path: Path, sizes: dict[str, int]) -> Any:
    """The problem's parsed source with each top-level integer of `sizes` given that value instead where it is
    bound: `NAME = <int>`, `NAME: int = <int>`, and each name of `A, B = <int>, <int>`."""
    import ast

    def sized(target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name) and target.id in sizes and isinstance(value, ast.Constant) and \
                type(value.value) is int:
            value.value = sizes[target.id]
        elif isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) and \
                len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                sized(t, v)

    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                sized(target, node.value)
        elif isinstance(node, ast.AnnAssign):
            sized(node.target, node.value)
    return tree


def exec_candidate(path: Path, problem: Path | None = None) -> types.ModuleType:
    """Import the candidate as a real module (Triton and inspect need its file); may raise anything.

    With `problem`, the candidate's globals start as the problem's, as KernelBench's harness has them:
    it executes the problem's source and then the candidate's in one namespace, so a candidate may use
    what only the problem imports or defines (`math`, `F`, `batch_size`, even `Model`); its own
    definitions replace those. The names come from a copy of the problem module of its own (not the
    reference's or the inputs' copies), so rebinding them changes nothing kgate judges with; a
    problem that fails to import here is reported by its own load."""
    name = f"kgate_kb_candidate_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import candidate {path}")
    module = importlib.util.module_from_spec(spec)
    if problem is not None:
        try:
            context = exec_problem(problem, "candidate_context")
        except ProblemError:
            context = None
        if context is not None:
            module.__dict__.update({k: v for k, v in vars(context).items() if not k.startswith("__")})
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fingerprint(module: types.ModuleType) -> dict[str, str]:
    """What a candidate must not change in a problem module: every global's value or code."""
    out: dict[str, str] = {}
    for key, value in sorted(vars(module).items()):
        if key.startswith("__") and key not in ("__dict__",):
            continue
        out[key] = _describe(value)
    return out


def _describe(value: Any) -> str:
    if isinstance(value, types.FunctionType):
        code = value.__code__
        return f"function {id(value)} {id(code)} {hashlib.sha1(code.co_code).hexdigest()} {value.__defaults__!r}"
    if isinstance(value, type):
        members = []
        for k, v in sorted(vars(value).items()):
            if isinstance(v, types.FunctionType):
                members.append(f"{k}:{id(v)}:{hashlib.sha1(v.__code__.co_code).hexdigest()}")
        return f"class {id(value)} {' '.join(members)}"
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__} {id(value)}"
    if isinstance(value, (int, float, str, bytes, bool, tuple, type(None), list, dict)):
        return f"{type(value).__name__} {value!r}"[:2000]
    return f"{type(value).__name__} {id(value)}"


def tampering(before: dict[str, str], module: types.ModuleType) -> str | None:
    """A one-line account of what changed in a problem module since `before`, or None."""
    after = fingerprint(module)
    changed = [k for k in before if after.get(k) != before[k]]
    added = [k for k in after if k not in before]
    if not changed and not added:
        return None
    parts = []
    if changed:
        parts.append("changed " + ", ".join(changed[:6]))
    if added:
        parts.append("added " + ", ".join(added[:6]))
    return "the candidate modified the problem module: " + "; ".join(parts)


def torch_fingerprint() -> dict[str, int]:
    """Identity of every public callable of torch's main namespaces, Tensor methods and nn.Module:
    a candidate that swaps one (say torch.relu, which the reference also calls) fools the reference and
    the oracle alike, so the worker compares this before the candidate is imported and after."""
    import torch
    import torch.nn.functional as F

    spaces = {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
              "torch._C.TensorBase": torch._C.TensorBase, "torch.nn.Module": torch.nn.Module,
              "torch.linalg": torch.linalg, "torch.fft": torch.fft, "torch.special": torch.special}
    # torch's own wrapper that turns dynamo off for a function (torch._dynamo wraps torch.manual_seed so when it is
    # first imported: a model built on the meta device or a decomposition imports it): the function it wraps
    disabled = getattr(torch._disable_dynamo(_identity), "__code__", None)

    def identity(value: Any) -> int:
        for _ in range(8):  # (torch may wrap a wrapper: unwrapped to the function under all of them)
            wrapped = getattr(value, "__wrapped__", None)
            if wrapped is None or getattr(value, "__code__", None) is not disabled:
                break
            value = wrapped
        return id(value)

    out = {}
    for label, space in spaces.items():
        for key, value in list(vars(space).items()):
            if not key.startswith("__") and callable(value):
                out[f"{label}.{key}"] = identity(value)
    for name in dir(torch.nn):
        cls = getattr(torch.nn, name, None)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module) and "forward" in vars(cls):
            out[f"torch.nn.{name}.forward"] = identity(vars(cls)["forward"])
    return out


def _identity(value: Any) -> Any:
    return value


def torch_tampering(before: dict[str, int]) -> str | None:
    after = torch_fingerprint()
    changed = [k for k, v in before.items() if after.get(k) != v]
    if not changed:
        return None
    return "the candidate replaced torch functions the reference uses too: " + ", ".join(changed[:8])


def _meta_signature(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), str(obj.dtype))
    if isinstance(obj, (list, tuple)):
        return tuple(_meta_signature(o) for o in obj)
    return repr(obj)


def _call_on_meta(fn: Callable[[], Any]) -> Any:
    import torch

    with torch.device("meta"):
        return _meta_signature(fn())


@dataclass
class FreeDims:
    names: list[str]
    defaults: list[int]
    note: str | None = None  # why there are none, when there are none


def free_dims(module: types.ModuleType) -> FreeDims:
    """The module-level ints that change get_inputs() shapes but not get_init_inputs(), found by
    perturbing each one and calling both on the meta device (no memory is allocated)."""
    try:
        base_inputs = _call_on_meta(module.get_inputs)
        base_init = _call_on_meta(module.get_init_inputs)
    except Exception as exc:  # noqa: BLE001
        return FreeDims([], [], f"get_inputs()/get_init_inputs() cannot run on the meta device "
                                f"({type(exc).__name__}: {exc}); the problem's own shape only")
    names, defaults = [], []
    g = vars(module)
    for key, value in list(g.items()):
        if key.startswith("_") or type(value) is not int or value < 2:
            continue
        changed = False
        for trial in (value + 1, value * 2):
            g[key] = trial
            try:
                changed = _call_on_meta(module.get_inputs) != base_inputs and \
                    _call_on_meta(module.get_init_inputs) == base_init
                break
            except Exception:  # noqa: BLE001 - that value is not legal for this problem: try another
                continue
            finally:
                g[key] = value
        if changed:
            names.append(key)
            defaults.append(value)
    note = None if names else ("no module-level size parameter changes get_inputs() without changing "
                               "get_init_inputs() (the weights): the problem's own shape only")
    return FreeDims(names, defaults, note)


# Model sizes. The module-level integers that size the weights (they change get_init_inputs() or the
# shapes of the Model's parameters and buffers) are never free size parameters: the shapes gate cannot sweep
# them, and a kernel whose tail over a weight dimension is wrong (a vectorised update of a parameter of
# numel % 8 != 0, a hidden size that is no multiple of its block) passes at the problem's own sizes, which
# are usually powers of two. The shapes gate builds both models again at other such sizes
# (`model_size_variants`): each size + 1, all of them at once first, then each alone, halved (each halved
# size + 1) until the Model's parameters and the inputs hold at most MODEL_ELEMENTS elements. Where the inputs
# have no free size, so that their sizes follow the weights' alone, one size more: all of them grown together
# (each + 1) until the inputs pass MANY_INPUT_ELEMENTS (a path a kernel takes above a size threshold: a statistic
# estimated on a sample of the first 64K elements, a split over threads above a million), within MODEL_ELEMENTS.
MODEL_ELEMENTS = 1 << 22
MANY_INPUT_ELEMENTS = 1 << 20  # as the shapes gate's `many_shape` for inputs of a free size
MIN_MODEL_SIZE = 8  # smaller integers are kernel sizes, strides, groups, dimensions: not sizes of a weight
MAX_MODEL_SIZES = 3


@dataclass
class ModelSize:
    """Other values of the integers that size the weights: `overrides` name -> value, `label` for messages."""

    overrides: dict[str, int]
    label: str


@contextlib.contextmanager
def overridden(modules: list[types.ModuleType], overrides: dict[str, int],
               defaults: dict[str, int]) -> Iterator[None]:
    """`overrides` set in each module's globals that holds the name at its default value (a candidate's own
    different binding is its own), put back after."""
    saved = []
    for module in modules:
        g = vars(module)
        for name, value in overrides.items():
            if type(g.get(name)) is int and g[name] == defaults[name]:
                saved.append((g, name, g[name]))
                g[name] = value
    try:
        yield
    finally:
        for g, name, value in reversed(saved):
            g[name] = value


def meta_model(module: types.ModuleType) -> Any:
    """The problem's Model built from its get_init_inputs() on the meta device (no memory); None where it is no
    nn.Module. Raises what the problem's code raises."""
    import torch

    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
    return model if isinstance(model, torch.nn.Module) else None


def held_elements(model: Any) -> int:
    """Elements of a module's parameters and buffers."""
    return sum(t.numel() for t in [*model.parameters(), *model.buffers()])


def _model_signature(module: types.ModuleType) -> Any:
    """The shapes of the Model's parameters and buffers, built on the meta device."""
    model = meta_model(module)
    if model is None:
        return None
    return tuple((n, tuple(t.shape)) for n, t in [*model.named_parameters(), *model.named_buffers()])


def init_dims(module: types.ModuleType, free: FreeDims) -> FreeDims:
    """The module-level integers of at least MIN_MODEL_SIZE, not free size parameters, whose value + 1
    changes what get_init_inputs() gives or the shapes of the Model's weights, with get_inputs() and the
    Model still made on the meta device."""
    try:
        base = (_call_on_meta(module.get_init_inputs), _model_signature(module))
    except Exception as exc:  # noqa: BLE001
        return FreeDims([], [], f"the Model cannot be built on the meta device ({type(exc).__name__})")
    names, defaults = [], []
    for key, value in list(vars(module).items()):
        if key.startswith("_") or type(value) is not int or value < MIN_MODEL_SIZE or key in free.names:
            continue
        with overridden([module], {key: value + 1}, {key: value}):
            try:
                _call_on_meta(module.get_inputs)
                changed = (_call_on_meta(module.get_init_inputs), _model_signature(module)) != base
            except Exception:  # noqa: BLE001 - not legal at value + 1 alone: not swept
                changed = False
        if changed:
            names.append(key)
            defaults.append(value)
    return FreeDims(names, defaults, None if names else "no module-level integer sizes the weights")


def model_elements(module: types.ModuleType, dims: FreeDims, shape: tuple[int, ...] | None) -> int | None:
    """Elements of the Model's parameters and buffers plus the inputs at `shape`, counted on the meta device
    with the module's globals as they are; None where either cannot be made there."""
    counted = _counted(module, dims, shape)
    return None if counted is None else counted[1]


def _counted(module: types.ModuleType, dims: FreeDims, shape: tuple[int, ...] | None) -> tuple[int, int] | None:
    """(elements of the inputs at `shape`, those plus the Model's parameters and buffers), as `model_elements`."""
    try:
        inputs = input_elements(module, dims, shape)
        model = meta_model(module)
    except Exception:  # noqa: BLE001
        return None
    return None if inputs is None else (inputs, inputs + (held_elements(model) if model is not None else 0))


def model_size_variants(module: types.ModuleType, dims: FreeDims, init: FreeDims, shape: tuple[int, ...] | None,
                        budget: int = MODEL_ELEMENTS) -> list[ModelSize]:
    """At most MAX_MODEL_SIZES other sizes of the weights (see MODEL_ELEMENTS): all of `init`'s integers at
    once, then each alone; each size + 1 (a tail of one past every power of two), else halved first, each
    halved size + 1 again, until the meta-device count (`model_elements`) is within `budget`. Where the inputs
    have no free size (`dims`), then one large size (`_large_model_size`): their sizes follow the weights'."""
    defaults = dict(zip(init.names, init.defaults, strict=True))
    groups = [list(init.names)] if len(init.names) > 1 else []
    groups += [[n] for n in init.names]
    out: list[ModelSize] = []
    for group in groups:
        for halvings in range(32):
            trial = {n: (defaults[n] >> halvings) + 1 for n in group}
            if any(v < MIN_MODEL_SIZE for v in trial.values()):
                break
            with overridden([module], trial, defaults):
                counted = model_elements(module, dims, shape)
            if counted is not None and counted <= budget:
                if all(trial != m.overrides for m in out):
                    label = (", ".join(f"{n}={v}" for n, v in trial.items()) + " (the problem's "
                             + ", ".join(str(defaults[n]) for n in trial) + ")")
                    out.append(ModelSize(trial, label))
                break
        if len(out) >= MAX_MODEL_SIZES:
            break
    if not dims.names and init.names:
        large = _large_model_size(module, dims, defaults, budget)
        if large is not None:
            out.append(large)
    return out


def _large_model_size(module: types.ModuleType, dims: FreeDims, defaults: dict[str, int],
                      budget: int) -> ModelSize | None:
    """All of the integers that size the weights grown together by a factor of 2^(1/4) at a time (each + 1)
    until the inputs hold more than MANY_INPUT_ELEMENTS elements, as long as the Model's parameters and the
    inputs hold at most `budget`; None where no such size is found (the weights grow faster than the inputs)."""
    for step in range(1, 128):
        trial = {n: int(v * 2 ** (step / 4)) + 1 for n, v in defaults.items()}
        with overridden([module], trial, defaults):
            counted = _counted(module, dims, None)
        if counted is None or counted[1] > budget:
            return None
        inputs = counted[0]
        if inputs > MANY_INPUT_ELEMENTS:
            label = (", ".join(f"{n}={v}" for n, v in trial.items()) + " (the problem's "
                     + ", ".join(str(defaults[n]) for n in trial) + f"; inputs of {inputs:,} elements)")
            return ModelSize(trial, label)
    return None


# The audit's working shape. KernelBench problems run at their own sizes take up to ~90 GiB and
# inputs of 10^9 elements; every probe of a sweeping gate costs a float64 oracle at that size. The
# gates that judge behaviour at the problem's own size (contract, oracle, determinism) and the
# standard test keep it; the probing gates (special values, layouts, distributions, ...) run at a
# working shape: the free size parameters halved, largest first, until the inputs hold at most
# WORK_ELEMENTS elements. The shapes gate sweeps around the working shape.
WORK_ELEMENTS = 1 << 22
FULL_SHAPE_GATES = ("contract", "oracle", "determinism")


def input_elements(module: types.ModuleType, dims: FreeDims, shape: tuple[int, ...] | None) -> int | None:
    """Elements in the tensors get_inputs() makes at `shape` (None: its own), counted on the meta device;
    None when it cannot run there."""
    import torch

    from kgate.compare import tensors

    try:
        with torch.device("meta"):
            return sum(t.numel() for t in tensors(ProblemInputs(module, dims)(0, shape)))
    except Exception:  # noqa: BLE001 - that shape is not legal for this problem
        return None


def problem_size(path: Path) -> tuple[int | None, int | None, int | None]:
    """(elements its get_inputs() makes at the problem's own shape, weighted layers of its Model: leaf modules
    holding a parameter of >= 2 dimensions, elements of its Model's parameters and buffers), all on the meta
    device, nothing allocated; None for what cannot be counted. Executes the problem's code: call it in a
    worker (kgate.audit.worker's `sizes`)."""
    module = exec_problem(path, "inputs")
    elements = input_elements(module, free_dims(module), None)
    try:
        model = meta_model(module)
    except Exception:  # noqa: BLE001 - a Model that cannot be built on the meta device: no layer count
        return elements, None, None
    if model is None:
        return elements, None, None
    layers = sum(1 for m in model.modules() if not any(True for _ in m.children())
                 and any(p.dim() >= 2 for p in m.parameters(recurse=False)))
    return elements, layers, held_elements(model)


def working_shape(module: types.ModuleType, dims: FreeDims, budget: int = WORK_ELEMENTS) -> tuple[int, ...] | None:
    """Free sizes at which the inputs hold at most `budget` elements (largest size halved first), or None
    when the problem's own inputs already do, it has no free size, or no smaller legal shape exists."""
    if not dims.names or budget <= 0:
        return None
    shape = list(dims.defaults)
    elements = input_elements(module, dims, tuple(shape))
    if elements is None or elements <= budget:
        return None
    for _ in range(256):
        order = sorted(range(len(shape)), key=lambda i: -shape[i])
        for i in order:  # halve the largest size that can be halved to a legal shape
            if shape[i] < 2:
                continue
            trial = list(shape)
            trial[i] = shape[i] // 2
            counted = input_elements(module, dims, tuple(trial))
            if counted is not None and counted < elements:
                shape, elements = trial, counted
                break
        else:
            break
        if elements <= budget:
            break
    return tuple(shape) if shape != list(dims.defaults) else None


UPPER, LOWER, DIAGONAL, SYMMETRIC = "upper-triangular", "lower-triangular", "diagonal", "symmetric"
ZERO_STRUCTURES = (UPPER, LOWER, DIAGONAL)  # the structures with declared zeros a kernel may skip


def matrix_structure(t: Any) -> str | None:
    """The structure a problem's `get_inputs()` gave a floating tensor of square matrices (last two dims
    n x n, n >= 2): exact zeros below or above the diagonal, or equal to its transpose. KernelBench's
    triangular, diagonal and symmetric matmul problems state their inputs' domain only this way; a
    kernel may rely on it (skip the known-zero half, read A^T for A)."""
    import torch

    if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2
            and t.shape[-1] == t.shape[-2] >= 2 and t.numel() > 0):
        return None
    lower_zero = not bool(t.tril(-1).any())
    upper_zero = not bool(t.triu(1).any())
    if lower_zero and upper_zero:
        return DIAGONAL if bool(t.diagonal(dim1=-2, dim2=-1).any()) else None
    if lower_zero:
        return UPPER
    if upper_zero:
        return LOWER
    return SYMMETRIC if torch.equal(t, t.mT) else None


def conform(original: tuple, probe: tuple) -> tuple:
    """`probe` (a gate's changed copy of `original`) with each top-level argument given the matrix
    structure of its counterpart in `original` (`matrix_structure`): the probes stay inside the
    problem's input domain, as its reference is only meant for such inputs."""
    import torch

    out = list(probe)
    for i, (before, after) in enumerate(zip(original, probe)):
        kind = matrix_structure(before)
        if kind is None or not isinstance(after, torch.Tensor) or after.shape != before.shape:
            continue
        if kind == UPPER:
            out[i] = after.triu()
        elif kind == LOWER:
            out[i] = after.tril()
        elif kind == DIAGONAL:
            out[i] = torch.diag_embed(after.diagonal(dim1=-2, dim2=-1))
        else:
            out[i] = after.triu() + after.triu(1).mT
    return tuple(out)


class ProblemInputs:
    """The problem's get_inputs() as a kgate inputs factory: `shape` sets the free size parameters.

    get_inputs() runs with `device` as torch's default device, so its tensors are drawn where the
    gates use them (KernelBench's own sizes reach 10^9 elements: drawing them on the host and copying
    costs seconds per call and host memory per worker). The standard test does not come here: it
    draws on the host as KernelBench does."""

    def __init__(self, module: types.ModuleType, dims: FreeDims):
        self.module = module
        self.dims = dims

    def _make(self, device: Any) -> Any:
        import torch

        if device is None:
            return self.module.get_inputs()
        with torch.device(device):
            return self.module.get_inputs()

    def __call__(self, seed: int, shape: tuple[int, ...] | None = None, device: Any = None) -> Any:
        g = vars(self.module)
        if shape is None or list(shape) == self.dims.defaults:
            return self._make(device)
        if len(shape) != len(self.dims.names):
            names = ", ".join(self.dims.names) or "none"
            raise ValueError(f"shape {tuple(shape)} has {len(shape)} size(s); this KernelBench problem has "
                             f"{len(self.dims.names)} free size parameter(s) ({names})")
        saved = {k: g[k] for k in self.dims.names}
        try:
            g.update(dict(zip(self.dims.names, (int(s) for s in shape), strict=True)))
            return self._make(device)
        finally:
            g.update(saved)

    def factory(self) -> Callable[..., Any]:
        """What the gates call: this object, or, for a problem with no free size parameter, a factory
        without a `shape` keyword, so that shape sweeps skip it (with the reason in the report)."""
        if self.dims.names:
            return self

        def problem_inputs(seed: int, device: Any = None) -> Any:
            return self._make(device)

        return problem_inputs


class NoGrad:
    """ModelNew called as KernelBench calls it: under torch.no_grad(). With `seed`, every call draws from
    torch's generators seeded with it (`kgate.oracle.seeded`), as the reference's `DtypeDispatch` with the
    same seed does: a problem whose forward draws its own random tensors (the initial states of the LSTM
    and GRU problems) gives both models the same draws, on every call."""

    def __init__(self, model: Any, seed: int | None = None):
        self.model = model
        self.seed = seed

    def __call__(self, *args: Any) -> Any:
        import torch

        from kgate.oracle import seeded

        with torch.no_grad(), seeded(self.seed):
            return self.model(*args)


def set_seed(seed: int) -> None:
    """KernelBench's set_seed: the CPU generator and the current CUDA device's."""
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def to_device(values: Any, device: Any, dtype: Any = None) -> list[Any]:
    """KernelBench's input processing: every floating-point tensor cast to the precision (when given), every
    tensor moved. Integer and boolean tensors (class indices, masks) keep their dtype and values: KernelBench
    casts them too, and a cross-entropy problem's own Model then raises on float targets, so neither of
    its candidates could be judged."""
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            v = (v.to(dtype=dtype) if dtype is not None and v.is_floating_point() else v).to(device=device)
        out.append(v)
    return out


def build_reference(reference_module: types.ModuleType, device: Any, seed: int = DEFAULT_SEED,
                    precision: Any = None) -> tuple[Any, list[Any]]:
    """KernelBench's construction of the reference, done before the candidate is imported (as
    KernelBench does): seed, init inputs (cast to `precision`, float32 by default, and moved); seed,
    Model, moved to `device`. Returns the model and the init inputs; raises ProblemError."""
    import torch

    precision = precision or torch.float32
    try:
        set_seed(seed)
        init_inputs = to_device(reference_module.get_init_inputs(), device, precision)
        with torch.no_grad():
            set_seed(seed)
            reference = reference_module.Model(*init_inputs)
            reference = reference.to(device=device, dtype=precision)
    except Exception as exc:  # noqa: BLE001
        raise ProblemError(f"the problem's Model could not be built: {type(exc).__name__}: {exc}") from exc
    return reference, init_inputs


def build_candidate(model_new: type, init_inputs: list[Any], device: Any, seed: int = DEFAULT_SEED,
                    precision: Any = None) -> Any:
    """Seed with the same seed, ModelNew(*init_inputs), moved: so both models draw the same weights.
    An exception propagates (it is the candidate's)."""
    import torch

    precision = precision or torch.float32
    with torch.no_grad():
        set_seed(seed)
        candidate = model_new(*init_inputs)
        return candidate.to(device=device, dtype=precision)


def build_models(reference_module: types.ModuleType, model_new: type, device: Any, seed: int = DEFAULT_SEED,
                 precision: Any = None) -> tuple[Any, Any]:
    """Both models, the KernelBench way (build_reference, then build_candidate)."""
    reference, init_inputs = build_reference(reference_module, device, seed, precision)
    return reference, build_candidate(model_new, init_inputs, device, seed, precision)


# --------------------------------------------------------------------------------------------------
# The manifest-shaped view of a pair that Subject and the gates read.


class PairEntry:
    """Duck-types `ResolvedKernel` for one KernelBench pair: name, entry (a KernelEntry with defaults),
    tolerance, shapes, dtypes, seeds."""

    def __init__(self, pair_id: str, candidate: Path, problem: Path, shapes: list[tuple[int, ...] | None],
                 seeds: list[int], dtypes: list[str], *, timeout: float = 300.0, memory: int | None = None,
                 device: str = "auto"):
        from kgate.manifest import KernelEntry, Limits, Tolerance

        safe = re.sub(r"[^A-Za-z0-9_.\-/]", "_", pair_id) or "candidate"
        self.name = pair_id
        self.entry = KernelEntry(name=safe, kernel=f"{candidate.name}:ModelNew", reference=f"{problem.name}:Model")
        self.tolerance = Tolerance()
        self.limits = Limits(timeout=timeout, **({"memory": memory} if memory else {}))
        self.shapes = shapes
        self.seeds = seeds
        self.dtypes = dtypes
        self.device = device
        self.gate_spec = "all"
        self.inputs = None
        self.kwargs: dict = {}  # a KernelBench Model takes its inputs positionally
        self.resources = None  # no budget: `--gate resources` reports the figures
        self.cache_env: list[str] = []  # a candidate's caches are kgate's own (kgate.audit.evaluate.worker_env)


# --dtypes: the precisions a candidate is judged at (KernelBench's fp32/fp16/bf16: floating inputs and both
# models' parameters cast to it, integer inputs untouched), and the standard test's tolerances at each
# (KernelBench's get_tolerance_for_precision; float32 keeps v0/v0.1's 1e-2 first, its later 1e-4 recorded).
AUDIT_DTYPES = ("float32", "float16", "bfloat16")
STANDARD_TOLERANCES = {"float32": (1e-2, 1e-4), "float16": (1e-2,), "bfloat16": (1e-2,)}


def gate_ids(gates: list[str], dtypes: list[str]) -> list[str]:
    """The result ids of an audit's gates: the gate names at the default float32 alone, else one id per
    gate and precision, `oracle[float16]`, precision by precision."""
    if list(dtypes) == ["float32"]:
        return list(gates)
    return [f"{g}[{d}]" for d in dtypes for g in gates]


def dtype_of_id(gate_id: str) -> str:
    """The precision a result id judged (`oracle[float16]` -> float16; a plain name: float32)."""
    _, bracket, rest = gate_id.partition("[")
    return rest.rstrip("]") if bracket else "float32"


def repro_command(audit_args: list[str], pair_id: str, gate: str | None) -> str:
    args = list(audit_args)
    if gate and "[" in gate and "--dtypes" in args:  # that one precision alone
        at = args.index("--dtypes")
        del args[at:at + 2]
    parts = ["kgate", "audit", *args, "-k", pair_id]
    if gate:
        name = gate.partition("[")[0]
        if name != gate:
            parts += ["--dtypes", dtype_of_id(gate)]
        parts += ["--gate", name]
    return shlex.join(parts)
