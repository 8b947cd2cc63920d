"""How long a fresh process takes to make its CUDA context, as an audit's worker does before it loads a candidate
(`torch.cuda.set_device`, then its share of the memory: `set_per_process_memory_fraction`), measured after torch
is imported: alone, with N processes making theirs at the same moment (an audit's judges starting together), and
while another process keeps the GPU busy with large matrix products (a judge starting beside running ones).

    python bench/cuda_context_start.py [--repeat 5] [--concurrent 4] [--json PATH]

Prints the median and the largest of each setting, and the GPU's persistence mode (a GPU not in persistence mode
tears its driver state down when no process holds it, and the next context pays for setting it up again).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time
import torch
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
torch.cuda.set_device(0)
torch.cuda.set_per_process_memory_fraction(0.25, 0)
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
print(f"context {time.perf_counter() - start:.4f}", flush=True)
"""

LOAD = r"""
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda")
print("busy", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    (a @ a).sum().item()
"""


def contexts(count: int) -> list[float]:
    """`count` processes, torch imported in each, then all told at once to make their CUDA context: the seconds
    each took."""
    children = [subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True) for _ in range(count)]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    took = []
    for child in children:
        line = child.stdout.readline().split()
        child.wait()
        took.append(float(line[1]))
    return took


def persistence() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,persistence_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return out or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each setting (default 5)")
    parser.add_argument("--concurrent", type=int, default=4, help="processes starting together (default 4)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"alone": [], f"{args.concurrent} at once": [], "beside a busy GPU": []}
    for _ in range(args.repeat):
        results["alone"] += contexts(1)
        results[f"{args.concurrent} at once"] += contexts(args.concurrent)
        load = subprocess.Popen([sys.executable, "-c", LOAD, "60"], stdout=subprocess.PIPE, text=True)
        load.stdout.readline()
        try:
            results["beside a busy GPU"] += contexts(1)
        finally:
            load.kill()
            load.wait()
    mode = persistence()
    print(f"GPU (name, persistence mode): {mode}")
    for name, values in results.items():
        print(f"{name}: median {statistics.median(values):.3f} s, largest {max(values):.3f} s over {len(values)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": mode, "seconds": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
