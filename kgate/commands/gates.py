"""`kgate gates`: list the gates with one line each."""

from __future__ import annotations

import argparse
import ast
import importlib.util
from typing import Any

from kgate.names import GATE_NAMES, OPTIONAL_GATES

_FIELDS = ("name", "tolerance_free", "summary")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gates", help="list the gates", description="List every gate: name, whether its verdict "
                       "depends on a tolerance, and the property it checks. The twelve of `all` first, then the "
                       "opt-in ones, which a kernel gets only when its manifest names them or, for resources, "
                       "declares a budget (`resources:`).")
    p.set_defaults(func=main)


def describe(name: str) -> tuple[str, bool, str]:
    """(name, tolerance_free, summary) of a gate, read from its module's source: importing the gates imports
    torch, seconds that listing them should not cost. A gate whose class does not set them as plain values is
    imported after all."""
    spec = importlib.util.find_spec(f"kgate.gates.{name}")
    try:
        assert spec is not None and spec.origin is not None
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            values: dict[str, Any] = {}
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                        and stmt.targets[0].id in _FIELDS:
                    values[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            if values.get("name") == name and set(values) == set(_FIELDS):
                return name, bool(values["tolerance_free"]), str(values["summary"])
    except (AssertionError, OSError, SyntaxError, ValueError):
        pass
    from kgate import gates as registry

    gate = registry.get(name)
    return gate.name, gate.tolerance_free, gate.summary


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(header_style="bold")
    table.add_column("gate", no_wrap=True)
    table.add_column("tolerance-free", justify="center")
    table.add_column("property")
    for name, tolerance_free, summary in map(describe, GATE_NAMES + OPTIONAL_GATES):
        opt_in = " (opt-in: not in `all`)" if name in OPTIONAL_GATES else ""
        table.add_row(name, "yes" if tolerance_free else "no", summary + opt_in)
    Console(highlight=False).print(table)
    return 0
