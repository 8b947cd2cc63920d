"""The accumulation gate's emulated low-precision matrix products (kgate.gates.accumulation) in Triton.

The same trees as the gate's torch code, bit for bit, in a few launches where the torch code launches
thousands of small kernels (a product of 512 x 8192 by 8192 x 8192 materialises 3.4e10 products in
hundreds of chunks, each summed level by level; a running sum of K steps launches a handful of kernels
per step). Used on a GPU when asked for (below) and Triton is importable; the torch code stays the
reference (and the CPU's path), and tests compare the two bit for bit (in the Triton interpreter on the
CPU, for real on the H200, where they pass).

- Pairwise order: each program computes the products of a (BM x BK) block of `a` and a (BK x BN) block
  of `b` in float32, rounds them to the accumulator's dtype, and sums each output's BK products as a
  balanced tree (adjacent pairs, every sum computed in float32 and rounded to the accumulator, as torch
  adds two float16 or bfloat16 tensors), writing one partial sum per aligned block of K. The caller sums
  those partial sums with the same tree (kgate's `_pairwise`): a balanced tree over K zero-padded to a
  power of two is the trees of its aligned power-of-two blocks, then a tree over their sums.
- Sequential order: each program keeps a (BM x BN) running sum in float32 and, for every k in turn, adds
  the float32 product and rounds the sum to the accumulator (as the torch code's `round(acc + a_k * b_k)`).
  The kernel is compiled without floating-point contraction: a fused multiply-add would skip the
  product's own rounding, which the torch code performs.

The sequential order takes this path on a GPU by default, the pairwise order with
`KGATE_TRITON_EMULATION=1` (`=0`: neither; kgate.gates.accumulation.triton_orders). In the throughput
benchmark's full-gates pass on one H100 (24 candidates, docs/audit/README.md, "Throughput", `ef5ef63`), both
orders here took the accumulation gate from 131.1 to 89.8 gate-seconds, every verdict equal: the sequential
order 86.7 to 32.6, the pairwise 33.2 to 46.6 (slower: hence not by default). Compiled kernels go to
the worker's private folder (`KGATE_PRIVATE_DIR`, which kgate.runner.supervise makes for each worker and
removes after it), not to the Triton cache the candidates' kernels share: a candidate runs in the same
process and could otherwise leave a forged binary of kgate's kernel there for the next candidate. They
are compiled once per run (`warm`, in a process of kgate's own, before any worker:
kgate.runner.seed_private_folders) and the files are written into every worker's private folder.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional: the torch code then does all of it
    triton = None

BM, BN, BK = 16, 16, 32  # output tile and K block (BM x BK x BN products in registers per program)
MAX_GRID = 65535  # grid dimensions 1 and 2 (K blocks, batch)
BLOCK_SUMS = 1 << 26  # partial sums of K blocks materialised at once (float32: 256 MiB)

if triton is not None:

    @triton.jit
    def _round(x, BF16: tl.constexpr):
        """x (float32) rounded to the accumulator's dtype (nearest, ties to even), kept in float32. bfloat16
        by the bits (Triton's interpreter truncates a conversion to bfloat16; a GPU rounds): add half an ulp
        of bfloat16 less one, plus the lowest kept bit (ties to even), and clear the bits below; NaN as is."""
        if BF16:
            bits = x.to(tl.int32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & -65536
            return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        else:
            return x.to(tl.float16).to(tl.float32)

    # One compiled variant per accumulator and K block: no specialization on the sizes' and strides' values
    # or the pointers' alignment, so a worker compiles (into its private folder) at most what it uses.
    _SIZES = ["M", "N", "K", "s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn"]
    _POINTERS = ["a_ptr", "b_ptr", "out_ptr"]

    def _jit(*sizes: str):
        try:
            return triton.jit(do_not_specialize=list(sizes), do_not_specialize_on_alignment=_POINTERS)
        except TypeError:  # a Triton without do_not_specialize_on_alignment: alignment variants, then
            return triton.jit(do_not_specialize=list(sizes))

    @_jit(*_SIZES, "KB")
    def _pairwise_blocks(a_ptr, b_ptr, out_ptr, M, N, K, KB, s_ab, s_am, s_ak, s_bb, s_bk, s_bn,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, LOG_BK: tl.constexpr,
                         BF16: tl.constexpr):
        tiles_n = tl.cdiv(N, BN)
        pid_m = tl.program_id(0) // tiles_n
        pid_n = tl.program_id(0) % tiles_n
        pid_k = tl.program_id(1)
        batch = tl.program_id(2).to(tl.int64)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = pid_k * BK + tl.arange(0, BK)
        a = tl.load(a_ptr + batch * s_ab + rm[:, None].to(tl.int64) * s_am + rk[None, :].to(tl.int64) * s_ak,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + batch * s_bb + rk[:, None].to(tl.int64) * s_bk + rn[None, :].to(tl.int64) * s_bn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        p = _round(a[:, :, None] * b[None, :, :], BF16)  # (BM, BK, BN): float32 products, rounded
        for level in tl.static_range(LOG_BK):
            q = tl.permute(tl.reshape(p, [BM, BK >> (level + 1), 2, BN]), [0, 1, 3, 2])
            x, y = tl.split(q)  # the even and the odd member of each adjacent pair
            p = _round(x + y, BF16)
        s = tl.reshape(p, [BM, BN])
        offs = ((batch * M + rm[:, None].to(tl.int64)) * N + rn[None, :].to(tl.int64)) * KB + pid_k
        tl.store(out_ptr + offs, s, mask=(rm[:, None] < M) & (rn[None, :] < N))

    @_jit(*_SIZES)
    def _sequential(a_ptr, b_ptr, out_ptr, M, N, K, s_ab, s_am, s_ak, s_bb, s_bk, s_bn,
                    BM: tl.constexpr, BN: tl.constexpr, BF16: tl.constexpr):
        tiles_n = tl.cdiv(N, BN)
        pid_m = tl.program_id(0) // tiles_n
        pid_n = tl.program_id(0) % tiles_n
        batch = tl.program_id(1).to(tl.int64)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        a_row = a_ptr + batch * s_ab + rm.to(tl.int64) * s_am
        b_col = b_ptr + batch * s_bb + rn.to(tl.int64) * s_bn
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K):
            a_k = tl.load(a_row + k * s_ak, mask=rm < M, other=0.0)
            b_k = tl.load(b_col + k * s_bk, mask=rn < N, other=0.0)
            acc = _round(acc + a_k[:, None] * b_k[None, :], BF16)
        offs = (batch * M + rm[:, None].to(tl.int64)) * N + rn[None, :].to(tl.int64)
        tl.store(out_ptr + offs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def usable(a: torch.Tensor, work: torch.dtype, acc: torch.dtype) -> bool:
    """Whether these products can take the Triton path (for the orders kgate.gates.accumulation.triton_orders names):
    Triton importable, a GPU tensor, float32 products, a float16 or bfloat16 accumulator. (Tests call
    `matmul` on CPU tensors in the Triton interpreter.)"""
    return triton is not None and a.is_cuda and work == torch.float32 and acc in (torch.float16, torch.bfloat16)


@contextlib.contextmanager
def _private_cache() -> Iterator[None]:
    """Triton's cache folder for kgate's own kernels: the worker's private folder where there is one."""
    private = os.environ.get("KGATE_PRIVATE_DIR")
    if not private:
        yield
        return
    kept = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(private, "triton")
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = kept


def matmul(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype, order: str, pairwise: Callable[[torch.Tensor], torch.Tensor],
           lead: tuple[int, ...]) -> torch.Tensor:
    """a (..., M, K) @ b (..., K, N), float32, with the K-sum in `acc` in `order` ("pairwise" or
    "sequential"); float32 out, shape lead + (M, N). `pairwise` sums the last dimension as the gate's
    tree does (its `_pairwise`), for the partial sums of the K blocks."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a = a.expand(*lead, m, k).reshape(-1, m, k)
    b = b.expand(*lead, k, n).reshape(-1, k, n)
    batch = a.shape[0]
    out = torch.empty((batch, m, n), dtype=torch.float32, device=a.device)
    if out.numel() == 0:
        return out.reshape(*lead, m, n)
    with _private_cache():
        _fill(out, a, b, acc, order, pairwise)
    return out.reshape(*lead, m, n)


def _fill(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, acc: torch.dtype, order: str,
          pairwise: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """`out` (batch, M, N) = a (batch, M, K) @ b (batch, K, N) as `matmul` says, in launches of at most
    MAX_GRID batches and BLOCK_SUMS partial sums."""
    (batch, m, n), k = out.shape, a.shape[-1]
    tile_grid = triton.cdiv(m, BM) * triton.cdiv(n, BN)
    bf16 = acc == torch.bfloat16
    for b0 in range(0, batch, MAX_GRID):
        sa, sb = a[b0:b0 + MAX_GRID], b[b0:b0 + MAX_GRID]
        nb = sa.shape[0]
        if order == "sequential":
            _sequential[(tile_grid, nb)](sa, sb, out[b0:b0 + nb], m, n, k, *sa.stride(), *sb.stride(),
                                         BM=BM, BN=BN, BF16=bf16, enable_fp_fusion=False)
            continue
        bk = min(BK, 1 << max(0, (k - 1).bit_length()))
        kb = triton.cdiv(k, bk)
        if kb > MAX_GRID:
            raise NotImplementedError(f"K = {k}: more than {MAX_GRID} blocks of {bk}")
        rows = max(1, min(m, BLOCK_SUMS // max(1, nb * n * kb)))
        for r0 in range(0, m, rows):
            ra = sa[:, r0:r0 + rows]
            r = ra.shape[1]
            sums = torch.empty((nb, r, n, kb), dtype=torch.float32, device=a.device)  # each one acc-representable
            _pairwise_blocks[(triton.cdiv(r, BM) * triton.cdiv(n, BN), kb, nb)](
                ra, sb, sums, r, n, k, kb, *ra.stride(), *sb.stride(),
                BM=BM, BN=BN, BK=bk, LOG_BK=int(math.log2(bk)), BF16=bf16, enable_fp_fusion=False)
            out[b0:b0 + nb, r0:r0 + r] = pairwise(sums)


def warm(device: str) -> int:
    """Compile every variant of kgate's kernels that the gate will take on `device` (each accumulator: pairwise
    with each K block, sequential; only the orders kgate.gates.accumulation.triton_orders names) into the
    private folder (KGATE_PRIVATE_DIR), by running each once on a tiny product. Run by
    kgate.runner.seed_private_folders in a process of its own, before any worker: its files are then written
    into every worker's private folder. Returns how many variants ran."""
    from kgate.gates.accumulation import PAIRWISE, SEQUENTIAL, LowPrecisionAccumulation, triton_orders

    orders = triton_orders()
    runs = 0
    for acc in (torch.float16, torch.bfloat16):
        for k in [1 << i for i in range(int(math.log2(BK)) + 1)] if PAIRWISE in orders else []:
            a, b = torch.ones(1, k, device=device), torch.ones(k, 1, device=device)
            matmul(a, b, acc, PAIRWISE, LowPrecisionAccumulation(acc, PAIRWISE)._pairwise, ())
            runs += 1
        if SEQUENTIAL in orders:
            a, b = torch.ones(1, BK, device=device), torch.ones(BK, 1, device=device)
            matmul(a, b, acc, SEQUENTIAL, LowPrecisionAccumulation(acc, SEQUENTIAL)._pairwise, ())
            runs += 1
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return runs


if __name__ == "__main__":  # python -m kgate.gates.lp_triton warm FOLDER DEVICE
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "warm" or triton is None:
        sys.exit("usage: python -m kgate.gates.lp_triton warm FOLDER DEVICE (Triton needed)")
    os.environ["KGATE_PRIVATE_DIR"] = sys.argv[2]
    from kgate.gates import lp_triton  # the kernels as the workers import them (not this __main__ copy)

    print(f"{lp_triton.warm(sys.argv[3])} variant(s) compiled into {sys.argv[2]}")
