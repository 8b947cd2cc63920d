"""The float64 oracle's cost against the reference's, per KernelBench problem, measured side by side in one
process: one call of the problem's Model in its own dtype, and one of kgate's float64 oracle (the Model's
float64 copy, called as the gates call it: `kgate.oracle.DtypeDispatch` inside `oracle_call`), each the
median of --repeat timed calls after one warm-up, the device synchronized after each. With --profile, the
operators that took the most device time in one oracle call. On a GPU, the oracle again with cuDNN
disabled (torch's own convolutions: an im2col and a GEMM), beside it.

    python bench/oracle_cost.py corpus/problems/level3/16_DenseNet201.py corpus/problems/level2/*.py \
        --device cuda --repeat 3 --profile 6
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def timed(fn: Any, device: Any, repeat: int) -> float:
    """Median seconds of `fn()` over `repeat` calls after one warm-up, the device synchronized after each."""
    import torch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def top_operators(fn: Any, device: Any, count: int) -> list[tuple[str, float, int]]:
    """(operator, device seconds, calls) of the `count` operators with the most self device time in one call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        own = getattr(event, "self_device_time_total", None)
        if own is None:
            own = getattr(event, "self_cuda_time_total", 0)
        if device.type != "cuda":
            own = event.self_cpu_time_total
        rows.append((event.key, own / 1e6, event.count))
    return sorted(rows, key=lambda r: -r[1])[:count]


def problems_device(script: str, problems: list[Path], device: str) -> Any:
    """The torch device to measure `problems` on, or None after one line on stderr saying why not (no torch in
    this Python, a problem file missing)."""
    try:
        import torch
    except ImportError:
        print(f"{script}: torch is not installed in this Python (run it with the venv's python)", file=sys.stderr)
        return None
    missing = [str(p) for p in problems if not p.is_file()]
    if missing:
        print(f"{script}: no such problem file: {', '.join(missing)}", file=sys.stderr)
        return None
    return torch.device(device)


def measure(path: Path, device: Any, repeat: int, profile_top: int) -> dict[str, Any]:
    import torch

    from kgate.oracle import DtypeDispatch, oracle_call, upcast

    torch.manual_seed(0)
    space = runpy.run_path(str(path))
    model = space["Model"](*space.get("get_init_inputs", lambda: [])()).to(device).eval()
    inputs = [a.to(device) if isinstance(a, torch.Tensor) else a for a in space["get_inputs"]()]
    dispatch = DtypeDispatch(model)
    wide = upcast(tuple(inputs), device)

    def reference() -> Any:
        with torch.no_grad():
            return model(*inputs)

    def oracle() -> Any:
        with torch.no_grad(), oracle_call(device):
            return dispatch(*wide)

    def oracle_without_cudnn() -> Any:
        with torch.backends.cudnn.flags(enabled=False):
            return oracle()

    row: dict[str, Any] = {"problem": path.name, "reference_s": timed(reference, device, repeat),
                           "oracle_s": timed(oracle, device, repeat)}
    row["oracle_over_reference"] = row["oracle_s"] / row["reference_s"] if row["reference_s"] else None
    if device.type == "cuda":  # torch's own convolutions (im2col and a GEMM) in place of cuDNN's
        row["oracle_without_cudnn_s"] = timed(oracle_without_cudnn, device, repeat)
    if profile_top:
        row["oracle_top"] = top_operators(oracle, device, profile_top)
    return row


def problems_parser(doc: str, device: str, repeat: int, what: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark over KernelBench problem files: the files, --device, --repeat (`what` is timed
    that many times per figure), --json."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path, help="KernelBench problem files (Model, get_inputs)")
    parser.add_argument("--device", default=device)
    parser.add_argument("--repeat", type=int, default=repeat, help=f"timed {what} per figure (default {repeat})")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = problems_parser(__doc__, "cuda", 3, "calls")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="list the N operators with the most device time in one oracle call")
    args = parser.parse_args(argv)
    device = problems_device("oracle_cost.py", args.problems, args.device)
    if device is None:
        return 2
    import torch

    rows = []
    print("| problem | reference s | float64 oracle s | oracle / reference | oracle without cuDNN s |\n"
          "|---|---:|---:|---:|---:|")
    for path in args.problems:
        try:
            row = measure(path, device, args.repeat, args.profile)
        except Exception as exc:  # noqa: BLE001 - a problem that does not build or run here: said, the rest go on
            print(f"| {path.name} | {type(exc).__name__}: {str(exc)[:80]} | | | |")
            continue
        rows.append(row)
        ratio = row["oracle_over_reference"]
        plain = row.get("oracle_without_cudnn_s")
        print(f"| {row['problem']} | {row['reference_s']:.4f} | {row['oracle_s']:.4f} | "
              f"{'' if ratio is None else f'{ratio:.1f}x'} | {'' if plain is None else f'{plain:.4f}'} |")
        if args.json:  # after each problem: a run cut short keeps what it measured
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
        for name, seconds, calls in row.get("oracle_top", []):
            print(f"|   {name[:60]} | | {seconds:.4f} | {calls} calls | |")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
