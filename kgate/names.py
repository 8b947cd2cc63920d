"""Gate names and gate ids: what the manifest, the CLI and the reports need of the gates without importing
them (the gates import torch; these do not import anything of kgate but its errors).

The registry (`kgate.gates`) maps each name to its module; the order is the order of the DESIGN table and
of every report.
"""

from __future__ import annotations

from kgate.errors import UsageError

GATE_NAMES: list[str] = [
    "contract", "oracle", "special_values", "determinism", "shapes", "layouts", "distributions", "accumulation",
    "input_integrity", "initialization", "bounds", "isolation",
]

# Gates a kernel gets only when asked: by name (`gates:`, `--gate`) or, for `resources`, by declaring a
# budget (`resources:` in the manifest). `all` is GATE_NAMES. They have no gradients' phase.
OPTIONAL_GATES: list[str] = ["resources"]
KNOWN_GATES: list[str] = GATE_NAMES + OPTIONAL_GATES

# A gate's result on the gradients (`backward: true`) has the gate's name plus this suffix.
BACKWARD_SUFFIX = "[backward]"


def base_name(gate_id: str) -> str:
    """'oracle[backward]' -> 'oracle'; also an audit's per-precision id, 'oracle[float16]' -> 'oracle'."""
    return gate_id.removesuffix(BACKWARD_SUFFIX).partition("[")[0]


def is_backward(gate_id: str) -> bool:
    return gate_id.endswith(BACKWARD_SUFFIX)


def phase_ids(names: list[str], backward: bool) -> list[str]:
    """The gate ids a kernel gets: its gates, then (backward: true) the same gates on the gradients."""
    return list(names) + ([n + BACKWARD_SUFFIX for n in names if n not in OPTIONAL_GATES] if backward else [])


def parse_option(values: list[str], phases: bool = True) -> list[str]:
    """The gates a repeatable, comma-separated `--gate` option names, checked: a gate name selects both
    phases; with `phases`, NAME[backward] selects the gradients' phase alone (`Runner.gates_for`)."""
    chosen = [v.strip() for value in values for v in value.split(",") if v.strip()]
    for g in chosen:
        if (base_name(g) if phases else g) not in KNOWN_GATES:
            known = ", ".join(KNOWN_GATES) + (f" (NAME{BACKWARD_SUFFIX}: the gradients' phase alone)" if phases else "")
            raise UsageError(f"--gate {g}: unknown gate; known: {known}")
    return chosen
