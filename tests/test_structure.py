"""The package reads bottom-up: manifest/inputs/oracle -> subject -> gates -> runner -> reports -> commands.
No module imports one of a higher layer, and no import circle runs through the modules (function-level
imports counted: they form circles too, only later)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("kgate.gates", "kgate.reports", "kgate.commands", "kgate.audit")  # each one node
LAYERS = [
    {"kgate.errors", "kgate.names"},
    {"kgate.manifest", "kgate.inputs", "kgate.oracle", "kgate.compare", "kgate.sandbox", "kgate.procmem"},
    {"kgate.subject"},
    {"kgate.gates"},
    {"kgate.runner", "kgate.report"},
    {"kgate.reports"},
    {"kgate.commands", "kgate.cli"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


# kgate.shrink is the gates' shared machinery (reducing a finding, judging a probe against the oracle gate's
# measure): a part of the gates' layer
GROUPED = {"kgate.shrink": "kgate.gates"}


def _node(module: str) -> str:
    module = GROUPED.get(module, module)
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), module)


def import_graph() -> dict[str, set[str]]:
    """module node -> the module nodes it imports anywhere in its code (kgate's only)."""
    modules = {}
    for path in (ROOT / "kgate").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(_node(name), set())
        for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            target = next((t for t in targets if t in modules), None)
            if target is not None and _node(target) != _node(name):
                edges.add(_node(target))
    return graph


def test_no_module_imports_a_higher_layer():
    wrong = sorted(f"{a} imports {b}" for a, targets in import_graph().items() for b in targets
                   if a in RANK and b in RANK and RANK[b] > RANK[a])
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_circle():
    graph = import_graph()
    circles = []
    for start in graph:  # a path from a module's imports back to it
        seen, todo = set(), [(t, [start, t]) for t in graph[start]]
        while todo:
            here, path = todo.pop()
            if here == start:
                circles.append(" -> ".join(path))
                break
            if here in seen:
                continue
            seen.add(here)
            todo += [(t, path + [t]) for t in graph.get(here, ())]
    assert not circles, "import circles:\n" + "\n".join(circles)
