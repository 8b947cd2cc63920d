"""Importing the callables a manifest names. Runs only inside worker processes: it executes user code.

A file reference is loaded as a fresh module for each role (kernel, reference, inputs), so a kernel
that rewrites its own module's globals cannot reach the copy the reference runs from, even when both
live in the same file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from kgate.manifest import Ref


class LoadError(Exception):
    """The callable could not be imported or found; the message says which and why."""


def _add_path(path: Path) -> None:
    text = str(path)
    if text not in sys.path:
        sys.path.insert(0, text)


def load_module_from_file(path: Path, role: str) -> Any:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"kgate_{role}_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    _add_path(path.parent)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def resolve(ref: Ref, role: str, base: Path) -> Any:
    """Import the module of `ref` and return its attribute (dotted attributes allowed)."""
    _add_path(base)
    if ref.is_file:
        assert ref.path is not None
        module = load_module_from_file(ref.path, role)
    else:
        module = importlib.import_module(ref.module or "")
    obj: Any = module
    for part in ref.attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LoadError(f"{ref.text}: {type(obj).__name__} {getattr(obj, '__name__', obj)!r} "
                            f"has no attribute {part!r}") from None
    if not callable(obj):
        raise LoadError(f"{ref.text} is a {type(obj).__name__}, not a callable")
    if role in ("kernel", "reference") and isinstance(obj, type) and _is_module_class(obj):
        # calling the class would construct a module, whose output then fails every gate for a reason
        # that names nothing; the manifest's check sees the classes its file defines, not imported ones
        raise LoadError(f"{ref.text} is the nn.Module class {obj.__name__!r}; the {role} must be an instance "
                        f"(make one in the file, `{obj.__name__.lower()} = {obj.__name__}(...)`, and name it)")
    return obj


def _is_module_class(cls: type) -> bool:
    torch = sys.modules.get("torch")  # a module class needs torch imported already: never import it here
    return torch is not None and issubclass(cls, torch.nn.Module)
