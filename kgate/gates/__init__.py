"""The gate registry. Order is the order of the DESIGN table and of every report."""

from __future__ import annotations

import importlib

from kgate.gates.base import ERROR, FAIL, PASS, SKIP, Gate, GateResult
from kgate.names import (
    BACKWARD_SUFFIX,
    GATE_NAMES,
    KNOWN_GATES,
    OPTIONAL_GATES,
    base_name,
    is_backward,
    parse_option,
    phase_ids,
)

# name -> module under kgate.gates; each module defines exactly one Gate subclass named GATE.
_MODULES = {name: name for name in KNOWN_GATES}
_cache: dict[str, Gate] = {}


def get(name: str) -> Gate:
    """The gate of a name or gate id (a `[backward]` id gives the same gate)."""
    name = base_name(name)
    if name not in _cache:
        module = importlib.import_module(f"kgate.gates.{_MODULES[name]}")
        _cache[name] = module.GATE()
    return _cache[name]


def all_gates() -> list[Gate]:
    return [get(n) for n in GATE_NAMES]


__all__ = ["BACKWARD_SUFFIX", "ERROR", "FAIL", "GATE_NAMES", "KNOWN_GATES", "OPTIONAL_GATES", "PASS", "SKIP", "Gate", "GateResult", "all_gates",
           "base_name", "get", "is_backward", "parse_option", "phase_ids"]
