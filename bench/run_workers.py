"""`kgate run MANIFEST` with workers forked from a template against workers started one by one, side by side.

    python bench/run_workers.py [MANIFEST] [--device cpu] [--repeat 2] [--out DIR] [--json PATH]

Runs `kgate run MANIFEST --device DEVICE` REPEAT times in each mode, alternating (forked, then
KGATE_FORKSERVER=0: every worker a `python -m kgate.worker` of its own, as before templates), and prints
each run's wall time, the median of each mode, their ratio, and whether every run gave the same verdicts
(kernel x gate). MANIFEST defaults to the bundled examples (examples/kgate.yaml). Needs kgate installed
(`pip install -e .`); on a GPU machine pass --device cuda.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"forked": "1", "one by one": "0"}


def one_run(manifest: Path, device: str, mode: str, out: Path) -> tuple[float, dict, int]:
    report = out / "report.json"
    env = {**os.environ, "KGATE_FORKSERVER": MODES[mode]}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kgate", "run", str(manifest), "--device", device, "--out", str(out),
                           "--json", str(report), "-q"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1) or not report.exists():
        sys.exit(f"kgate run ended with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    data = json.loads(report.read_text())
    verdicts = {k["name"]: {g["gate"]: g["verdict"] for g in k["gates"]} for k in data["kernels"]}
    return wall, verdicts, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", nargs="?", type=Path, default=ROOT / "examples" / "kgate.yaml")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2, help="runs in each mode (default 2)")
    parser.add_argument("--out", type=Path, help="keep each run's output here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="kgate-run-workers-"))
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    seen: list[dict] = []
    for i in range(args.repeat):
        for mode in MODES:
            wall, verdicts, code = one_run(args.manifest, args.device, mode, base / f"{mode.replace(' ', '-')}-{i}")
            walls[mode].append(wall)
            seen.append(verdicts)
            print(f"{mode:>10}  run {i + 1}: {wall:7.2f} s  exit {code}  "
                  f"{sum(len(g) for g in verdicts.values())} results", flush=True)
    medians = {m: statistics.median(w) for m, w in walls.items()}
    same = all(v == seen[0] for v in seen)
    ratio = medians["one by one"] / medians["forked"]
    print(f"median: forked {medians['forked']:.2f} s, one by one {medians['one by one']:.2f} s: "
          f"{ratio:.2f}x; verdicts {'the same in every run' if same else 'DIFFER between runs'}")
    if args.json:
        args.json.write_text(json.dumps({"manifest": str(args.manifest), "device": args.device, "walls": walls,
                                         "medians": medians, "ratio": ratio, "same_verdicts": same}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
