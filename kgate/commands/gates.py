"""`kgate gates`: list the gates with one line each."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from kgate import gates as registry


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gates", help="list the gates", description="List every gate: name, whether its verdict "
                       "depends on a tolerance, and the property it checks.")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    table = Table(header_style="bold")
    table.add_column("gate")
    table.add_column("tolerance-free", justify="center")
    table.add_column("property")
    for gate in registry.all_gates():
        table.add_row(gate.name, "yes" if gate.tolerance_free else "no", gate.summary)
    Console(highlight=False).print(table)
    return 0
