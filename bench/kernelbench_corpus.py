"""Turn a checkout of github.com/yenhao-huang/KernelBench (a KernelBench fork with model-written kernels)
into a corpus `kgate audit` reads: problems/, candidates/ and an index.csv with that harness's labels.

The fork keeps
- reference problems under KernelBench/level{1..4}/{P}_{Name}.py;
- ralph runs: runs/{run}/generated_kernels/level_{L}/problem_{P}.py, labelled in runs/{run}/results.jsonl
  (one JSON object per problem: level, problem_id, generated_kernel_path, eval_result.compiled/correctness);
- eval-results runs: runs/{run}/level_{L}_problem_{P}_sample_{S}_kernel.py, labelled in
  runs/{run}/eval_results.json ({problem_id: [{sample_id, compiled, correctness, ...}]}).
Its harness checked fp32 outputs over 5 trials at atol=rtol=1e-4 on an RTX 4090.

Identical files (same source for the same problem: the retime runs copy ralph kernels) are kept once;
the index lists every run that produced the file in `also_in`. By default only the kernels that
harness accepted are kept (`--all` keeps every labelled kernel).

    python bench/kernelbench_corpus.py .third_party/yenhao-KernelBench .third_party/kb-corpus
    kgate audit --problems .third_party/kb-corpus/problems --candidates .third_party/kb-corpus/candidates \
        --index .third_party/kb-corpus/index.csv ...
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

FIELDS = ["candidate", "problem", "level", "problem_id", "run", "model", "harness_compiled", "harness_correct",
          "source_sha1", "also_in"]


def problem_files(root: Path) -> dict[tuple[int, int], Path]:
    found = {}
    for level_dir in sorted((root / "KernelBench").glob("level*")):
        match = re.fullmatch(r"level(\d+)", level_dir.name)
        if not match:
            continue
        for f in level_dir.glob("*.py"):
            head = f.name.split("_", 1)[0]
            if head.isdigit():
                found[(int(match.group(1)), int(head))] = f
    return found


def labelled_kernels(root: Path):
    """(run, level, problem_id, kernel path, model, compiled, correct) for every labelled kernel."""
    for results in sorted(root.glob("runs/*/results.jsonl")):
        run = results.parent.name
        for line in results.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            path = root / str(row.get("generated_kernel_path", ""))
            ev = row.get("eval_result") or {}
            if row.get("level") is None or not path.is_file():
                continue
            yield (run, int(row["level"]), int(row["problem_id"]), path, row.get("model_name", ""),
                   bool(ev.get("compiled")), bool(ev.get("correctness")))
    for results in sorted(root.glob("runs/*/eval_results.json")):
        run = results.parent.name
        data = json.loads(results.read_text(encoding="utf-8"))
        for problem_id, samples in data.items():
            for sample in samples:
                matches = list(results.parent.glob(f"level_*_problem_{problem_id}_sample_{sample.get('sample_id', 0)}"
                                                   "_kernel.py"))
                if len(matches) != 1:
                    continue
                level = int(re.match(r"level_(\d+)_", matches[0].name).group(1))
                yield (run, level, int(problem_id), matches[0], "", bool(sample.get("compiled")),
                       bool(sample.get("correctness")))


def build(root: Path, out: Path, *, accepted_only: bool = True) -> dict[str, int]:
    problems = problem_files(root)
    if not problems:
        sys.exit(f"{root}: no KernelBench/level*/ problems found (is this a checkout of yenhao-huang/KernelBench?)")
    if out.exists():
        shutil.rmtree(out)
    (out / "problems").mkdir(parents=True)
    rows: dict[tuple[str, int, int], dict[str, str]] = {}
    counts = {"labelled": 0, "accepted": 0, "kept": 0, "duplicates": 0, "no_problem": 0}
    for run, level, pid, path, model, compiled, correct in labelled_kernels(root):
        counts["labelled"] += 1
        counts["accepted"] += correct
        if accepted_only and not correct:
            continue
        problem = problems.get((level, pid))
        if problem is None:
            counts["no_problem"] += 1
            continue
        digest = hashlib.sha1(path.read_bytes()).hexdigest()
        key = (digest, level, pid)
        if key in rows:
            rows[key]["also_in"] = ";".join(filter(None, [rows[key]["also_in"], run]))
            counts["duplicates"] += 1
            continue
        rel = Path("candidates") / run / f"level_{level}" / f"problem_{pid}.py"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / rel)
        target = out / "problems" / f"level{level}" / problem.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(problem, target)
        rows[key] = {"candidate": rel.relative_to("candidates").as_posix(),
                     "problem": f"level{level}/{problem.name}", "level": str(level), "problem_id": str(pid),
                     "run": run, "model": model, "harness_compiled": str(compiled).lower(),
                     "harness_correct": str(correct).lower(), "source_sha1": digest, "also_in": ""}
    with open(out / "index.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(sorted(rows.values(), key=lambda r: r["candidate"]))
    counts["kept"] = len(rows)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fork", type=Path, help="checkout (or `git archive` extract) of yenhao-huang/KernelBench")
    parser.add_argument("out", type=Path, help="corpus folder to (re)create")
    parser.add_argument("--all", action="store_true", help="keep every labelled kernel, not only accepted ones")
    args = parser.parse_args(argv)
    counts = build(args.fork, args.out, accepted_only=not args.all)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(json.dumps({**counts, "bytes": size}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
