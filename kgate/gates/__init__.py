"""The gate registry. Order is the order of the DESIGN table and of every report."""

from __future__ import annotations

import importlib

from kgate.gates.base import ERROR, FAIL, PASS, SKIP, Gate, GateResult

# name -> module under kgate.gates; each module defines exactly one Gate subclass named GATE.
_MODULES = {
    "contract": "contract",
    "oracle": "oracle",
    "special_values": "special_values",
    "determinism": "determinism",
    "shapes": "shapes",
    "layouts": "layouts",
    "distributions": "distributions",
    "accumulation": "accumulation",
    "input_integrity": "input_integrity",
}
GATE_NAMES: list[str] = list(_MODULES)
_cache: dict[str, Gate] = {}


def get(name: str) -> Gate:
    if name not in _cache:
        module = importlib.import_module(f"kgate.gates.{_MODULES[name]}")
        _cache[name] = module.GATE()
    return _cache[name]


def all_gates() -> list[Gate]:
    return [get(n) for n in GATE_NAMES]


__all__ = ["ERROR", "FAIL", "GATE_NAMES", "PASS", "SKIP", "Gate", "GateResult", "all_gates", "get"]
