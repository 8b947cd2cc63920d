"""Judge every KernelBench problem with its own Model as the candidate: an exactly-correct kernel, so every
gate must pass or skip (determinism skips where the reference itself differs run to run). Any other verdict
is a false positive of kgate (or a problem outside what kgate can judge), listed gate by gate.

Each candidate is the one line `ModelNew = Model`: a candidate's globals start as its problem's, as in
KernelBench's harness, so no problem code is copied into a candidate. The corpus is written under --out
(never into the KernelBench checkout), then `kgate audit` runs on it.

    python bench/reference_as_candidate.py --kernelbench /path/to/KernelBench --levels 1,2 \
        --shrink-to 65536 --max-elements 4194304 --device cpu --out /tmp/rac
    python bench/reference_as_candidate.py --kernelbench tests/data/redteam/problems --levels all \
        --device cpu --out /tmp/rac-redteam

--kernelbench is a KernelBench checkout (problems in KernelBench/level1..4) or any folder of problem files.
--max-elements keeps the problems whose inputs (get_inputs() at the problem's own sizes, or at the reduced
ones with --shrink-to) and Model parameters each hold at most that many elements, counted on the meta
device in a subprocess (no memory allocated, the problems' code kept out of this process). Writes OUT/candidates/, OUT/selection.json (what was
kept, what left out and why), OUT/audit/ (the audit's records and logs), OUT/report/ and OUT/failures.json;
--shrink-to N judges copies of the problems (OUT/problems, outside the checkout) with their free size
parameters reduced as kgate's working shape reduces them, for a CPU that cannot run KernelBench's own
sizes. Exits 0 when every gate passed or skipped on every judged problem, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

CANDIDATE = "# The problem's own Model as the candidate (bench/reference_as_candidate.py).\nModelNew = Model  # noqa: F821\n"


def problems_root(path: Path) -> Path:
    """The folder whose level*/ subfolders (or files) are the problems."""
    return path / "KernelBench" if (path / "KernelBench").is_dir() else path


def select_levels(root: Path, levels: str) -> list[Path]:
    """The problem files under `root` of the levels asked for (`all`: every .py file under it)."""
    files = sorted(p for p in root.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts)
    if levels == "all":
        return files
    wanted = {int(x) for x in levels.split(",") if x.strip()}

    def level(p: Path) -> int | None:
        for part in p.relative_to(root).parts[:-1]:
            m = re.fullmatch(r"level[_\-]?(\d+)", part)
            if m:
                return int(m.group(1))
        return None

    return [p for p in files if level(p) in wanted]


def count_sizes(paths: list[Path], timeout: float, shrink_to: int = 0) -> dict[str, dict]:
    """{path: {"inputs": n, "params": n[, "shrunk": {free size: value}, "shrunk_inputs": n]} or {"error": why}},
    counted in a subprocess (see `_count_main`); "shrunk": the free sizes kgate's working shape would take for
    at most `shrink_to` input elements, where they differ from the problem's own."""
    if not paths:
        return {}
    proc = subprocess.run([sys.executable, __file__, "--count", str(shrink_to), *map(str, paths)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"counting problem sizes failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _count_main(paths: list[str], shrink_to: int = 0) -> None:
    import torch

    from kgate.kernelbench import exec_problem, free_dims, input_elements, working_shape

    out: dict[str, dict] = {}
    for path in paths:
        try:
            module = exec_problem(Path(path), "inputs")
            elements = input_elements(module, free_dims(module), None)
            with torch.device("meta"):
                model = module.Model(*module.get_init_inputs())
            params = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
            out[path] = {"inputs": elements, "params": params}
            if shrink_to:
                dims = free_dims(module)
                shape = working_shape(module, dims, shrink_to)
                if shape is not None:
                    out[path]["shrunk"] = dict(zip(dims.names, shape))
                    out[path]["shrunk_inputs"] = input_elements(module, dims, shape)
        except Exception as exc:  # noqa: BLE001 - reported per problem, the others are still counted
            out[path] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(out))


def write_shrunk(root: Path, problems: list[Path], sizes: dict[str, dict], out: Path) -> Path:
    """Copies of the problems under OUT/problems, each with its free size parameters set to the shrunk
    values after its own code (get_inputs() reads them when called; the weights do not depend on them)."""
    folder = out / "problems"
    for problem in problems:
        target = folder / problem.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shrunk = sizes.get(str(problem), {}).get("shrunk") or {}
        tail = "".join(f"{k} = {v}\n" for k, v in shrunk.items())
        note = f"\n\n# Free sizes reduced by bench/reference_as_candidate.py --shrink-to\n{tail}" if tail else ""
        target.write_text(problem.read_text() + note)
    return folder


def write_corpus(root: Path, problems: list[Path], out: Path) -> list[Path]:
    written = []
    for problem in problems:
        target = out / "candidates" / problem.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(CANDIDATE)
        written.append(target)
    return written


def failures(results: Path) -> dict[str, list[dict]]:
    """{candidate id: [gate results that are neither pass nor skip, or the record's error]}."""
    found: dict[str, list[dict]] = {}
    for line in results.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        bad = [{"gate": g["gate"], "verdict": g["verdict"], "message": (g.get("message") or "")[:400],
                "repro": g.get("repro")} for g in record.get("gates") or [] if g["verdict"] not in ("pass", "skip")]
        for key in ("error", "problem_error"):
            if record.get(key):
                bad.append({"gate": key, "verdict": "error", "message": str(record[key])[:400]})
        if (record.get("standard") or {}).get("verdict") not in (None, "pass"):
            bad.append({"gate": "standard_test", "verdict": record["standard"]["verdict"],
                        "message": record["standard"].get("message", "")[:400]})
        if bad:
            found[record["id"]] = bad
    return found


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--count":
        _count_main(sys.argv[3:], int(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernelbench", type=Path, required=True, help="KernelBench checkout or folder of problems")
    ap.add_argument("--levels", default="1,2", help="comma-separated levels, or 'all' (default 1,2)")
    ap.add_argument("--max-elements", type=int, default=None,
                    help="keep problems whose inputs and parameters each hold at most this many elements")
    ap.add_argument("--shrink-to", type=int, default=0,
                    help="judge copies of the problems (under OUT/problems) whose free size parameters (batch, "
                         "sequence, spatial sizes) are reduced until the inputs hold at most this many elements, "
                         "as kgate's working shape does; the weights keep their sizes (default 0: own sizes)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=300, help="kgate audit --timeout (per stage)")
    ap.add_argument("--max-time", type=float, default=None, help="kgate audit --max-time (then --resume)")
    ap.add_argument("--resume", action="store_true", help="keep the audit records OUT/audit already holds")
    ap.add_argument("--gate", default=None, help="only these gates (kgate audit --gate)")
    ap.add_argument("-k", dest="select", default=None, help="only these candidates (kgate audit -k)")
    args = ap.parse_args(argv)

    root = problems_root(args.kernelbench.resolve())  # the index names problems by this path, from OUT
    args.out = args.out.resolve()  # and the shrunk copies by theirs: a relative --out would be read from OUT
    problems = select_levels(root, args.levels)
    if not problems:
        raise SystemExit(f"no problem files for levels {args.levels} under {root}")
    left_out: dict[str, str] = {}
    sizes: dict[str, dict] = {}
    if args.max_elements is not None or args.shrink_to:
        sizes = count_sizes(problems, timeout=600, shrink_to=args.shrink_to)
        kept = []
        for p in problems:
            s = sizes.get(str(p), {"error": "not counted"})
            inputs = s.get("shrunk_inputs") or s.get("inputs")
            if "error" in s or inputs is None:
                left_out[str(p.relative_to(root))] = f"not counted on the meta device: {s.get('error')}"
            elif args.max_elements is not None and max(inputs, s["params"]) > args.max_elements:
                left_out[str(p.relative_to(root))] = f"{inputs} input / {s['params']} parameter elements"
            else:
                kept.append(p)
        problems = kept
    args.out.mkdir(parents=True, exist_ok=True)
    candidates = write_corpus(root, problems, args.out)
    problems_dir = write_shrunk(root, problems, sizes, args.out) if args.shrink_to else root
    (args.out / "selection.json").write_text(json.dumps(
        {"root": str(root), "levels": args.levels, "max_elements": args.max_elements, "shrink_to": args.shrink_to,
         "kept": {str(p.relative_to(root)): sizes.get(str(p), {}) for p in problems}, "left_out": left_out},
        indent=1))
    # An explicit index: KernelBench's own names hold "__" (50_conv_standard_2D__square_input__square_kernel),
    # which name-based pairing reads as candidate X__anything of problem X.
    index = args.out / "index.json"
    index.write_text(json.dumps({str(c.relative_to(args.out / "candidates")): str(problems_dir / p.relative_to(root))
                                 for c, p in zip(candidates, problems)}, indent=1))
    print(f"{len(problems)} problems as their own candidates ({len(left_out)} left out: OUT/selection.json)")
    if not problems:
        return 0

    cmd = [sys.executable, "-m", "kgate", "audit", "--format", "kernelbench", "--problems", str(problems_dir),
           "--candidates", str(args.out / "candidates"), "--index", str(index), "--device", args.device, "--timeout", str(args.timeout),
           "--out", str(args.out / "audit"), "--report", str(args.out / "report"), "-q",
           "--resume" if args.resume else "--fresh"]
    for flag, value in (("--jobs", args.jobs), ("--max-time", args.max_time), ("--gate", args.gate),
                        ("-k", args.select)):
        if value is not None:
            cmd += [flag, str(value)]
    started = time.monotonic()
    code = subprocess.call(cmd)
    took = time.monotonic() - started
    if not (args.out / "audit" / "results.jsonl").is_file():  # kgate audit refused its arguments (it said why)
        print(f"kgate audit exit {code} after {took:.0f} s, no candidate judged", file=sys.stderr)
        return code or 2
    found = failures(args.out / "audit" / "results.jsonl")
    (args.out / "failures.json").write_text(json.dumps(found, indent=1))
    by_gate: dict[str, list[str]] = {}
    for cand, bad in found.items():
        for b in bad:
            by_gate.setdefault(b["gate"], []).append(cand)
    print(f"kgate audit exit {code} after {took:.0f} s; {len(found)} of {len(problems)} problems have a verdict "
          f"other than pass/skip on their own Model (OUT/failures.json)")
    for gate, cands in sorted(by_gate.items()):
        print(f"  {gate}: {len(cands)}: {', '.join(sorted(cands))}")
    if code == 3:
        print("stopped by --max-time with problems left: run again with --resume")
        return 3
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
