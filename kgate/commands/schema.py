"""`kgate schema`: print the JSON Schema of kgate.yaml (for editors: yaml-language-server)."""

from __future__ import annotations

import argparse
import json

from kgate.manifest import json_schema


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of kgate.yaml",
                       description="Print the JSON Schema of kgate.yaml, generated from the same model that "
                       "validates manifests. Point your editor at it, e.g. with the first line "
                       "`# yaml-language-server: $schema=kgate.schema.json`.")
    p.add_argument("-o", "--output", metavar="PATH", help="write to PATH instead of standard output")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0
