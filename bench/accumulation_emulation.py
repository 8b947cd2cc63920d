"""The accumulation gate's emulated low-precision matrix products (kgate.gates.accumulation), timed side
by side in one run against a baseline, on the CPU or a GPU.

The gate's time on KernelBench's GEMM problems is nearly all in these trees (audit records: 1,569 of
2,225 gate-seconds over 96 candidates on the H200). Each row times one emulated product (pairwise and
sequential order, float16 and bfloat16 accumulators), best of --repeat, for the baseline and for the
current code, and counts the outputs where they differ (rare double roundings).

The baseline is another version of the module (`--against FILE`, e.g. `git show
bf1241f:kgate/gates/accumulation.py > /tmp/old_accumulation.py`), or else the current code with its
working precision forced to float64.

On a GPU the current code takes the Triton path (kgate/gates/lp_triton.py; the gate takes it for the
sequential order by default, for both with KGATE_TRITON_EMULATION=1, which this script sets unless it is
set; =0 times the torch code) where Triton is importable; the best of --repeat
leaves its compile time out, the first call's time (`first s`) has it.
`--chunks 25,27` then times the current torch code (Triton off) once more for each of those chunk sizes
(2^N float64 elements of products materialised at once; the gate's own is
kgate.gates.accumulation.PRODUCT_CHUNK_GPU on a GPU, PRODUCT_CHUNK on the CPU): fewer, larger chunks
launch fewer kernels for the same tree. Every row counts the outputs that differ from the current code's.

    python bench/accumulation_emulation.py [--device cuda] [--against FILE] [--sizes 64x4096x1024,16x32768x512] \
        [--chunks 25,27,28]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

from kgate.gates import accumulation, lp_triton


def _time(fn, device: torch.device, repeat: int) -> tuple[float, float, torch.Tensor]:
    """The best of `repeat` calls, the first call's time (a Triton kernel's compile included), and the last
    output."""
    best, first, out = float("inf"), 0.0, None
    for i in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - start
        if i == 0:
            first = took
        best = min(best, took)
    return best, first, out


def _baseline(path: Path | None):
    """A factory (acc, order) -> mode of the baseline, and its name."""
    if path is None:
        def forced(acc, order):
            mode = accumulation.LowPrecisionAccumulation(acc, order)
            mode.work = torch.float64
            return mode
        return forced, "float64 work"
    spec = importlib.util.spec_from_file_location("baseline_accumulation", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there while it runs
    spec.loader.exec_module(module)
    return module.LowPrecisionAccumulation, path.name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--against", type=Path, metavar="FILE", help="the baseline: another accumulation.py")
    p.add_argument("--sizes", default="64x4096x1024,16x32768x512", help="MxKxN, comma-separated")
    p.add_argument("--orders", default=f"{accumulation.PAIRWISE},{accumulation.SEQUENTIAL}")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--chunks", default="", help="log2 chunk sizes (float64 elements) to time the current code at")
    args = p.parse_args()
    device = torch.device(args.device)
    os.environ.setdefault("KGATE_TRITON_EMULATION", "1")
    baseline, name = _baseline(args.against)
    gen = torch.Generator().manual_seed(0)
    triton_path = accumulation.triton_asked() and lp_triton.usable(torch.empty(0, device=device), torch.float32,
                                                                     torch.float16)
    print(f"baseline: {name}; {device}; current: {'Triton' if triton_path else 'torch'} code")
    print(f"{'M x K x N':>18} {'order':>10} {'acc':>9} {'baseline s':>10} {'current s':>10} {'ratio':>6} {'differ':>7} "
          f"{'first s':>8}")
    for size in args.sizes.split(","):
        m, k, n = (int(x) for x in size.split("x"))
        a = torch.rand(m, k, generator=gen, dtype=torch.float64).to(device)
        b = ((torch.rand(k, n, generator=gen, dtype=torch.float64) - 0.5) / 64).to(device)
        for order in args.orders.split(","):
            for acc in (torch.float16, torch.bfloat16):
                times, outs = [], []
                for make in (baseline, accumulation.LowPrecisionAccumulation):
                    mode = make(acc, order)
                    t, first, out = _time(lambda mode=mode, a=a, b=b: mode.lp_matmul(a, b), device, args.repeat)
                    times.append(t)
                    outs.append(out)
                differ = int((outs[0] != outs[1]).sum())
                print(f"{size:>18} {order:>10} {str(acc).removeprefix('torch.'):>9} {times[0]:10.3f} {times[1]:10.3f} "
                      f"{times[0] / times[1]:6.2g} {differ:7d} {first:8.3f}", flush=True)
                for log2 in filter(None, args.chunks.split(",")):
                    t, out = _chunked(int(log2), device, acc, order, a, b, args.repeat)
                    print(f"{'':>18} {'':>10} {'chunk 2^' + log2:>9} {'':>10} {t:10.3f} {times[1] / t:6.2g} "
                          f"{int((out != outs[1]).sum()):7d}", flush=True)
    return 0


def _chunked(log2: int, device: torch.device, acc: torch.dtype, order: str, a: torch.Tensor, b: torch.Tensor,
             repeat: int) -> tuple[float, torch.Tensor]:
    """The current torch code's time and output (Triton off) with 2^log2 float64 elements of products per chunk."""
    name = "PRODUCT_CHUNK" if device.type == "cpu" else "PRODUCT_CHUNK_GPU"
    kept, kept_triton = getattr(accumulation, name), lp_triton.triton
    setattr(accumulation, name, 1 << log2)
    lp_triton.triton = None
    try:
        mode = accumulation.LowPrecisionAccumulation(acc, order)
        best, _, out = _time(lambda: mode.lp_matmul(a, b), device, repeat)
        return best, out
    finally:
        setattr(accumulation, name, kept)
        lp_triton.triton = kept_triton


if __name__ == "__main__":
    raise SystemExit(main())
