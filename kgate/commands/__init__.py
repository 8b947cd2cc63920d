"""The CLI's subcommands, one module each (`kgate.cli` wires them)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from kgate.errors import UsageError
from kgate.manifest import MAX_SEED, MAX_TIMEOUT


def number(kind: type[int] | type[float], minimum: float, *, above: bool = False,
           maximum: float = math.inf) -> Callable[[str], float]:
    """An argparse `type` for a finite number of `kind` at least `minimum` (greater than it with `above`) and
    at most `maximum`: a value out of range is a usage error at once (exit 2), not a failure blamed on a
    kernel later."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {'an integer' if kind is int else 'a number'}") \
                from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(f"{text} must be {'greater than' if above else 'at least'} {minimum:g}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text[:40]} must be at most {maximum:g}")
        return value
    return parse


SECONDS = number(float, 0, above=True, maximum=MAX_TIMEOUT)  # a time limit
SEED = number(int, 0, maximum=MAX_SEED)
COUNT = number(int, 1)  # workers, builds


def writable(path: str | Path | None, option: str, *, folder: bool = False) -> None:
    """A usage error now, before anything is judged, when `path` (given as `option`) cannot be written: a
    folder where a file is wanted or the other way round, a file where one of its folders should be, or a
    folder kgate may not write in. Found only at the end, it cost the whole run."""
    if path is None:
        return
    p = Path(path)
    if folder and p.exists() and not p.is_dir():
        raise UsageError(f"{option} {path}: a file is there; give a folder")
    if not folder and p.is_dir():
        raise UsageError(f"{option} {path}: a folder is there; give a file's path")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{option} {path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError(f"{option} {path}: kgate may not write in {parent}")
            return


def add_sandbox_option(p: argparse.ArgumentParser) -> None:
    """--sandbox, the same for every verb that starts workers (kgate.sandbox)."""
    p.add_argument("--sandbox", choices=("auto", "require", "none"), default=None,
                   help="confine every worker with bubblewrap (own PID and network namespaces, read-only file "
                        "system but its scratch folder, environment allow-list, killed with all it started): "
                        "auto (default, or $KGATE_SANDBOX) uses it where it works and says loudly where it does "
                        "not; require stops with exit 2 where it cannot; none does not try")
