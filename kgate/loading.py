"""Importing the callables a manifest names. Runs only inside worker processes: it executes user code.

A file reference is loaded as a fresh module for each role (kernel, reference, inputs), so a kernel
that rewrites its own module's globals cannot reach the copy the reference runs from, even when both
live in the same file.

The manifest's `kwargs:` are bound here, once, to the kernel and the reference as they are imported
(`bind`): every caller (the gates through `kgate.subject.Subject`, the float64 oracle, the backward pass,
the compute-sanitizer's subprocess) calls them with the inputs only and gets the keyword arguments too.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
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
    return bind(obj, ref.kwargs, f"the {role} {ref.text}") if ref.kwargs else obj


def bind(fn: Any, kwargs: dict[str, Any], what: str) -> Any:
    """`fn` called with `kwargs` added to every call. An `nn.Module` stays itself (the oracle converts a
    module reference to float64, the backward pass and the parameter probes read its parameters): a
    forward pre-hook adds them, and copies of the module (`copy.deepcopy`) keep it. Any other callable
    becomes a `functools.partial` that looks like it (name, module, `__wrapped__`), so what finds a
    kernel's compiled code or module through it still does. Raises LoadError where the signature shows
    that `fn` takes some name by no keyword."""
    _check_accepts(fn, kwargs, what)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(fn, torch.nn.Module):
        bound = dict(kwargs)

        def add_kwargs(_module: Any, args: tuple, given: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
            return args, {**bound, **given}

        fn.register_forward_pre_hook(add_kwargs, with_kwargs=True)
        return fn
    partial = functools.partial(fn, **kwargs)
    try:
        functools.update_wrapper(partial, fn)
    except (AttributeError, TypeError):  # a callable without a __dict__ to copy: the partial as it is
        pass
    return partial


def _check_accepts(fn: Any, kwargs: dict[str, Any], what: str) -> None:
    torch = sys.modules.get("torch")
    target = fn.forward if torch is not None and isinstance(fn, torch.nn.Module) else fn
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin or an extension's function: its own call says
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    by_keyword = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY)}
    missing = [name for name in kwargs if name not in by_keyword]
    if missing:
        raise LoadError(f"{what} takes no keyword argument {missing[0]!r} (kwargs: in the manifest passes "
                        f"{', '.join(map(repr, kwargs))} to both the kernel and the reference); it takes "
                        f"{', '.join(sorted(by_keyword)) or 'none'} by keyword")


def _is_module_class(cls: type) -> bool:
    torch = sys.modules.get("torch")  # a module class needs torch imported already: never import it here
    return torch is not None and issubclass(cls, torch.nn.Module)
