"""The kernel x gate tables of the field libraries' runs (bench/field_kgate.sh), as Markdown.

    python bench/field_table.py DIR [--libraries liger,flaggems,fla]

DIR is field_kgate.sh's --out: DIR/LIB/results.jsonl for each library. For each library: one row a kernel
(in the manifest's order), one column a gate (forward, then each gate's backward phase), each cell the
verdict (pass, FAIL, ERROR, skip; blank where nothing was judged: a stop cancelled it, or the run did not
reach it), then every failure and error with kgate's message. The results are read as `kgate run --resume`
reads them (kgate.runner.read_judged), so a table of a run cut short counts what it judged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kgate.manifest import load
from kgate.runner import read_judged

ROOT = Path(__file__).resolve().parent.parent
CELL = {"pass": "pass", "fail": "**FAIL**", "error": "**ERROR**", "skip": "skip"}


def manifest_kernels(library: str) -> list[str]:
    return [k.name for k in load(ROOT / "examples" / "field" / library / "kgate.yaml").kernels]


def read_results(path: Path) -> dict[tuple[str, str], dict]:
    """(kernel, gate) -> the result a results.jsonl judged (the last of a resumed run's; none where a stop
    cancelled it), as JSON."""
    judged, _ = read_judged(path.read_text() if path.exists() else "")
    return {(kernel, gate): result.to_json() for kernel, gates in judged.items() for gate, result in gates.items()}


def cell(row: dict | None) -> str:
    return "" if row is None else CELL.get(row["verdict"], row["verdict"])


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
    findings = [(k, g, r) for (k, g), r in sorted(results.items()) if r.get("verdict") in ("fail", "error")]
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
