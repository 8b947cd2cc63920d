"""The kernel x gate tables of the field libraries' runs (bench/field_kgate.sh), as Markdown.

    python bench/field_table.py DIR [--libraries liger,flaggems,fla]

DIR is field_kgate.sh's --out: DIR/LIB/results.jsonl for each library. For each library: one row a kernel
(in the manifest's order), one column a gate (forward, then each gate's backward phase), each cell the
verdict (pass, FAIL, ERROR, skip; `cut` where a stop cancelled it, blank where the run did not reach it), then every failure and error with
kgate's message. Kernels and gates the run did not reach are counted, so a table of a run cut short says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CELL = {"pass": "pass", "fail": "**FAIL**", "error": "**ERROR**", "skip": "skip"}


def manifest_kernels(library: str) -> list[str]:
    data = yaml.safe_load((ROOT / "examples" / "field" / library / "kgate.yaml").read_text())
    return [k["name"] for k in data.get("kernels", [])]


def read_results(path: Path) -> dict[tuple[str, str], dict]:
    """The last result of each (kernel, gate) in a results.jsonl (a resumed run appends)."""
    results: dict[tuple[str, str], dict] = {}
    if not path.exists():
        return results
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a stop
        if isinstance(row, dict) and "kernel" in row and "gate" in row:
            results[(row["kernel"], row["gate"])] = row
    return results


def cut(row: dict) -> bool:
    """A result the run's stop left unjudged (kgate records the gates it cancelled as errors)."""
    return row.get("verdict") == "error" and "cancelled (the run was interrupted)" in str(row.get("message"))


def cell(row: dict | None) -> str:
    if row is None:
        return ""
    return "cut" if cut(row) else CELL.get(row["verdict"], row["verdict"])


def gate_order(gates: set[str]) -> list[str]:
    forward = sorted(g for g in gates if "[" not in g)
    backward = sorted(g for g in gates if "[" in g)
    return forward + backward


def table(library: str, results: dict[tuple[str, str], dict]) -> str:
    kernels = manifest_kernels(library)
    gates = gate_order({g for _, g in results})
    judged = {k for k, _ in results}
    lines = [f"### {library}", "",
             f"{len(judged & set(kernels))} of {len(kernels)} kernels judged, {len(results)} results.", ""]
    if gates:
        lines += ["| kernel | " + " | ".join(gates) + " |", "|---" * (len(gates) + 1) + "|"]
        for kernel in kernels:
            cells = [cell(results.get((kernel, g))) for g in gates]
            lines.append(f"| `{kernel}` | " + " | ".join(cells) + " |")
        lines.append("")
    stopped = sum(cut(r) for r in results.values())
    if stopped:
        lines += [f"`cut`: {stopped} results the run's stop left unjudged.", ""]
    findings = [(k, g, r) for (k, g), r in sorted(results.items())
                if r.get("verdict") in ("fail", "error") and not cut(r)]
    if findings:
        lines += ["Failures and errors:", ""]
        for kernel, gate, row in findings:
            message = " ".join(str(row.get("message", "")).split())
            lines.append(f"- `{kernel}` {gate} ({row['verdict']}): {message[:600]}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="bench/field_kgate.sh's --out folder")
    parser.add_argument("--libraries", default="liger,flaggems,fla", help="comma-separated (default: all three)")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"field_table: {args.dir} is not a folder (bench/field_kgate.sh --out DIR makes one)", file=sys.stderr)
        return 2
    for library in args.libraries.split(","):
        if not (ROOT / "examples" / "field" / library / "kgate.yaml").exists():
            print(f"field_table: no examples/field/{library}/kgate.yaml", file=sys.stderr)
            return 2
        print(table(library, read_results(args.dir / library / "results.jsonl")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
