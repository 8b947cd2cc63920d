"""The gate registry. Order is the order of the DESIGN table and of every report."""

from __future__ import annotations

import importlib

from kgate.errors import UsageError
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
    "initialization": "initialization",
    "bounds": "bounds",
    "isolation": "isolation",
}
GATE_NAMES: list[str] = list(_MODULES)
_cache: dict[str, Gate] = {}


# A gate's result on the gradients (`backward: true`) has the gate's name plus this suffix.
BACKWARD_SUFFIX = "[backward]"


def base_name(gate_id: str) -> str:
    """'oracle[backward]' -> 'oracle'; also an audit's per-precision id, 'oracle[float16]' -> 'oracle'."""
    return gate_id.removesuffix(BACKWARD_SUFFIX).partition("[")[0]


def is_backward(gate_id: str) -> bool:
    return gate_id.endswith(BACKWARD_SUFFIX)


def phase_ids(names: list[str], backward: bool) -> list[str]:
    """The gate ids a kernel gets: its gates, then (backward: true) the same gates on the gradients."""
    return list(names) + ([n + BACKWARD_SUFFIX for n in names] if backward else [])


def parse_option(values: list[str], phases: bool = True) -> list[str]:
    """The gates a repeatable, comma-separated `--gate` option names, checked: a gate name selects both
    phases; with `phases`, NAME[backward] selects the gradients' phase alone (`Runner.gates_for`)."""
    chosen = [v.strip() for value in values for v in value.split(",") if v.strip()]
    for g in chosen:
        if (base_name(g) if phases else g) not in GATE_NAMES:
            known = ", ".join(GATE_NAMES) + (f" (NAME{BACKWARD_SUFFIX}: the gradients' phase alone)" if phases else "")
            raise UsageError(f"--gate {g}: unknown gate; known: {known}")
    return chosen


def get(name: str) -> Gate:
    """The gate of a name or gate id (a `[backward]` id gives the same gate)."""
    name = base_name(name)
    if name not in _cache:
        module = importlib.import_module(f"kgate.gates.{_MODULES[name]}")
        _cache[name] = module.GATE()
    return _cache[name]


def all_gates() -> list[Gate]:
    return [get(n) for n in GATE_NAMES]


__all__ = ["BACKWARD_SUFFIX", "ERROR", "FAIL", "GATE_NAMES", "PASS", "SKIP", "Gate", "GateResult", "all_gates",
           "base_name", "get", "is_backward", "parse_option", "phase_ids"]
