"""The accumulation gate's emulated low-precision matrix products (kgate.gates.accumulation), timed with
float64 and float32 working precision side by side in one run, on the CPU or a GPU.

The gate's time on KernelBench's GEMM problems is nearly all in these trees (audit records: 1,569 of
2,225 gate-seconds over 96 candidates on the H200). Each row times one emulated product (pairwise and
sequential order, float16 and bfloat16 accumulators), best of --repeat, and checks that both working
precisions give the same results (they may differ by rare double roundings: the count is printed).

    python bench/accumulation_emulation.py [--device cuda] [--sizes 64x4096x1024,16x32768x512]
"""

from __future__ import annotations

import argparse
import time

import torch

from kgate.gates.accumulation import PAIRWISE, SEQUENTIAL, LowPrecisionAccumulation


def _time(fn, device: torch.device, repeat: int) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--sizes", default="64x4096x1024,16x32768x512", help="MxKxN, comma-separated")
    p.add_argument("--orders", default=f"{PAIRWISE},{SEQUENTIAL}")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    print(f"{'M x K x N':>18} {'order':>10} {'acc':>9} {'float64 s':>10} {'float32 s':>10} {'ratio':>6} {'differ':>7}")
    for size in args.sizes.split(","):
        m, k, n = (int(x) for x in size.split("x"))
        a = torch.rand(m, k, generator=gen, dtype=torch.float64).to(device)
        b = ((torch.rand(k, n, generator=gen, dtype=torch.float64) - 0.5) / 64).to(device)
        for order in args.orders.split(","):
            for acc in (torch.float16, torch.bfloat16):
                times, outs = [], []
                for work in (torch.float64, torch.float32):
                    mode = LowPrecisionAccumulation(acc, order)
                    mode.work = work
                    t, out = _time(lambda mode=mode, a=a, b=b: mode.lp_matmul(a, b), device, args.repeat)
                    times.append(t)
                    outs.append(out)
                differ = int((outs[0] != outs[1]).sum())
                print(f"{size:>18} {order:>10} {str(acc).removeprefix('torch.'):>9} {times[0]:10.3f} {times[1]:10.3f} "
                      f"{times[0] / times[1]:6.1f} {differ:7d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
