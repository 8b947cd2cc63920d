"""Find which GDN stage faults on the GPU: runs forward and backward stage by stage, synchronizing after
each, one case per subprocess (a fault poisons the CUDA context), and prints the first stage that
raised. With --sanitizer, runs each failing case again under compute-sanitizer (memcheck), which names
the kernel, the thread and the address.

    python bench/gdn_memcheck.py [--sanitizer] [--case B,T,H,DK,DV,dtype,member] ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ["2,1000,4,128,128,bfloat16,deltanet", "1,45,2,64,128,float16,deltanet",
         "1,8192,16,128,128,bfloat16,gated_deltanet", "2,300,2,128,64,float32,gated_deltanet",
         "1,777,3,64,64,bfloat16,gated_deltanet"]
MEMBERS = {"linear_attention": ("none", False), "retnet": ("head", False), "mamba2_gla": ("data", False),
           "deltanet": ("none", True), "gated_deltanet": ("data", True)}


def one(case: str) -> int:
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT))
    from fixtures.gdn import chunk as gk
    B, T, H, DK, DV, dt, member = case.split(",")
    B, T, H, DK, DV = map(int, (B, T, H, DK, DV))
    dtype = getattr(torch, dt)
    gate, delta = MEMBERS[member]
    dev = "cuda"
    q = F.normalize(torch.randn(B, T, H, DK, device=dev), dim=-1).to(dtype)
    k = F.normalize(torch.randn(B, T, H, DK, device=dev), dim=-1).to(dtype)
    v = torch.randn(B, T, H, DV, device=dev).to(dtype)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev) + 2) if gate == "data" else None
    beta = torch.rand(B, T, H, device=dev) if delta else None
    h0 = torch.randn(B, H, DK, DV, device=dev) * 0.2
    do = torch.randn_like(v)
    dht = torch.randn_like(h0) * 0.1
    scale = DK ** -0.5
    stage = "start"

    def sync(name):
        nonlocal stage
        torch.cuda.synchronize()
        stage = name

    try:
        if delta:
            G, Ai, w, u = gk.chunk_prepare_wy_fwd(k, v, beta, g)
        else:
            G = gk.chunk_local_cumsum(g) if g is not None else None
            Ai = w = None
            u = v
        sync("prepare_wy_fwd")
        h, vn, ht = gk.chunk_state_fwd(k, w, u, G, h0, True, delta)
        sync("state_fwd")
        o = gk.chunk_out_fwd(q, k, vn if delta else v, h, G, scale)
        sync("out_fwd")
        dh, dvn, dh0 = gk.chunk_state_bwd(q, k, w, G, do, dht, scale, True, delta)
        sync("state_bwd (dv_local + reverse state)")
        gk.chunk_grad_bwd(q, k, v, beta, G, Ai, h, dh, vn, do, dvn, scale, delta)
        sync("grad_bwd")
    except Exception as exc:  # noqa: BLE001
        print(f"{case}: FAULT after stage '{stage}' (in the next one): {type(exc).__name__}: {str(exc)[:120]}")
        return 1
    print(f"{case}: ok ({float(o.float().abs().max()):.3g})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append")
    ap.add_argument("--one")
    ap.add_argument("--sanitizer", action="store_true")
    a = ap.parse_args()
    if a.one:
        return one(a.one)
    bad = []
    for case in a.case or CASES:
        r = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True, timeout=300)
        print((r.stdout or r.stderr[-400:]).strip(), flush=True)
        if r.returncode:
            bad.append(case)
    if a.sanitizer:
        for case in bad[:2]:
            r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--print-limit", "4", sys.executable,
                                __file__, "--one", case], capture_output=True, text=True, timeout=400,
                               env=dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1"))
            print(f"--- compute-sanitizer {case}\n" + "\n".join(r.stdout.splitlines()[:60]), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
