"""What KernelBench's own check (kgate's replica, `standard_s` in every audit record) costs against the size
of the problem's inputs: a least-squares line, seconds = a + b x (input elements), over the records of an
audit, and the CPU generator's speed that most of `b` is (KernelBench draws every trial's inputs with
torch.rand/randn on the CPU, serially).

    python bench/standard_test_cost.py docs/records/2026-12-04-h200-7d83342/audit/results.jsonl \
        --problems .third_party/kb-corpus/problems
    ... --since 294     # only the records from line 295 on (e.g. the candidates one run judged alone)

Input elements come from each problem's own get_inputs() shapes, worked out on meta tensors (nothing is
allocated), as kgate's audit does for its working shape. Runs on the CPU in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

from kgate import kernelbench as kb


def problem_elements(path: Path) -> int | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return kb.problem_size(path)[0]
    except Exception:  # noqa: BLE001 - a problem that cannot be sized is left out, and counted
        return None


def generator_speed(elements: int = 16 * 4096 * 4095) -> dict[str, float]:
    """Elements per second of torch.rand and torch.randn on the CPU, one call of `elements` each."""
    speed = {}
    for fn in (torch.rand, torch.randn):
        started = time.perf_counter()
        fn(elements)
        speed[fn.__name__] = elements / (time.perf_counter() - started)
    return speed


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="an audit's results.jsonl")
    parser.add_argument("--problems", type=Path, required=True, help="the corpus's problems folder")
    parser.add_argument("--since", type=int, default=0, help="skip the first N records")
    args = parser.parse_args()
    records = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()][args.since:]
    sizes: dict[str, int | None] = {}
    points = []
    for record in records:
        if not record.get("standard_s") or not record.get("problem"):
            continue
        rel = Path(record["problem"]).parts[-2:]  # level folder and file: where the corpus was moved to
        key = "/".join(rel)
        if key not in sizes:
            sizes[key] = problem_elements(args.problems.joinpath(*rel))
        if sizes[key]:
            points.append((sizes[key], float(record["standard_s"])))
    if len(points) < 2:
        raise SystemExit(f"{len(points)} record(s) with a standard test time and a sized problem: nothing to fit")
    a, b = fit([x for x, _ in points], [y for _, y in points])
    elements = sorted(x for x, _ in points)
    median = elements[len(elements) // 2]
    print(f"{len(points)} record(s) of {len(records)} ({sum(v is None for v in sizes.values())} problem(s) unsized)")
    print(f"standard test s = {a:.2f} + {b * 1e9:.1f} x (G input elements): 5 trials at {5 / b / 1e6:.0f} M "
          "elements/s each (generation and copy)")
    print(f"median problem: {median / 1e6:.1f} M input elements, {b * median:.2f} s of inputs; median standard "
          f"test {statistics.median(y for _, y in points):.2f} s")
    speed = generator_speed()
    print("this machine's CPU generator: " + ", ".join(f"{k} {v / 1e6:.0f} M elements/s" for k, v in speed.items()))


if __name__ == "__main__":
    main()
