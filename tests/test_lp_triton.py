"""The accumulation gate's emulated low-precision matrix products in Triton (kgate/gates/lp_triton.py)
against the gate's torch code, bit for bit: the same trees, so the same verdicts.

Without CUDA the kernels run in the Triton interpreter (TRITON_INTERPRET=1) on CPU tensors; with CUDA
they are compiled and run on the GPU, and the gate's own dispatch (`_lp_matmul` on CUDA tensors) is
compared with its torch code on the same GPU.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")  # after TRITON_INTERPRET is set

from kgate.gates import accumulation as A  # noqa: E402
from kgate.gates import lp_triton  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
ACCS = [torch.float16, torch.bfloat16]
ORDERS = [A.PAIRWISE, A.SEQUENTIAL]


def _operands(lead_a, lead_b, m, k, n, seed=0, special=False):
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(*lead_a, m, k, generator=gen, dtype=torch.float64) * 4 - 1
    b = (torch.rand(*lead_b, k, n, generator=gen, dtype=torch.float64) - 0.5) / 8
    if special:  # overflow past the accumulator, subnormal products, signed zeros, infinities and NaN
        flat_a, flat_b = a.view(-1), b.view(-1)
        for i, v in enumerate([float("inf"), float("-inf"), float("nan"), -0.0, 7e4, 3e38, 1e-30]):
            flat_a[(71 * i + 3) % flat_a.numel()] = v  # one per row (K = 70 below)
        flat_b[5 % flat_b.numel()] = 6e4
        flat_b[11 % flat_b.numel()] = 1e-20
    return a.to(torch.float32).to(DEVICE), b.to(torch.float32).to(DEVICE)


def _both(a, b, acc, order):
    mode = A.LowPrecisionAccumulation(acc, order)
    lead = A._broadcast(a.shape[:-2], b.shape[:-2])
    want = _torch_path(mode, a, b)
    got = lp_triton.matmul(a, b, acc, order, mode._pairwise, lead)
    return got, want


def _torch_path(mode, a, b):
    kept = lp_triton.triton
    lp_triton.triton = None  # the gate's torch code, on whichever device
    try:
        return mode._lp_matmul(a, b)
    finally:
        lp_triton.triton = kept


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # bit for bit (bar the sign of zero)


@pytest.mark.parametrize("acc", ACCS, ids=["fp16", "bf16"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("lead_a, lead_b, m, k, n", [
    ((), (), 5, 37, 7),         # K across two blocks, the second partial
    ((), (), 17, 96, 18),       # M and N past one tile
    ((2,), (2,), 3, 64, 5),     # batched
    ((3, 1), (1, 2), 4, 33, 17),  # broadcast batch
    ((), (), 1, 1, 1),
    ((), (), 2, 5, 3),          # K shorter than a block
])
def test_the_triton_products_are_the_torch_code_bit_for_bit(acc, order, lead_a, lead_b, m, k, n):
    _same(*_both(*_operands(lead_a, lead_b, m, k, n), acc, order))


@pytest.mark.parametrize("acc", ACCS, ids=["fp16", "bf16"])
@pytest.mark.parametrize("order", ORDERS)
def test_special_values_round_as_in_the_torch_code(acc, order):
    got, want = _both(*_operands((), (), 9, 70, 6, special=True), acc, order)
    assert torch.isnan(want).any() and torch.isinf(want).any()  # the probe reaches what it is meant to
    _same(got, want)


@pytest.mark.parametrize("acc", ACCS, ids=["fp16", "bf16"])
def test_chunks_of_rows_and_of_batch_change_nothing(monkeypatch, acc):
    a, b = _operands((5,), (5,), 7, 70, 3)
    monkeypatch.setattr(lp_triton, "BLOCK_SUMS", 2 * 3 * 3)  # a few rows of partial sums at a time
    monkeypatch.setattr(lp_triton, "MAX_GRID", 2)  # batches of 2 (and 3 blocks of K: past it, so refused)
    with pytest.raises(NotImplementedError):
        _both(a, b, acc, A.PAIRWISE)
    monkeypatch.setattr(lp_triton, "MAX_GRID", 3)
    for order in ORDERS:
        _same(*_both(a, b, acc, order))


def test_empty_outputs_launch_nothing():
    a, b = _operands((0,), (1,), 3, 8, 2)
    got, want = _both(a, b, torch.float16, A.PAIRWISE)
    assert got.shape == want.shape == (0, 3, 2)


@given(m=st.integers(1, 20), k=st.integers(1, 80), n=st.integers(1, 20), seed=st.integers(0, 99),
       acc=st.sampled_from(ACCS), order=st.sampled_from(ORDERS))
@settings(max_examples=25, deadline=None)
def test_any_small_product_matches(m, k, n, seed, acc, order):
    _same(*_both(*_operands((), (), m, k, n, seed), acc, order))


def test_the_gate_takes_the_triton_path_on_a_gpu_only_and_when_asked(monkeypatch):
    cpu = torch.ones(2, 2)
    monkeypatch.setenv("KGATE_TRITON_EMULATION", "1")
    assert not lp_triton.usable(cpu, torch.float32, torch.float16)
    if ON_GPU:
        gpu = cpu.cuda()
        assert lp_triton.usable(gpu, torch.float32, torch.float16)
        assert not lp_triton.usable(gpu, torch.float64, torch.float32)  # a float64 kernel's float32 accumulator
    assert A.triton_asked() and A.triton_orders() == {A.PAIRWISE, A.SEQUENTIAL}
    monkeypatch.delenv("KGATE_TRITON_EMULATION")
    assert A.triton_orders() == {A.SEQUENTIAL}  # by default the sequential order only (measured faster)
    monkeypatch.setenv("KGATE_TRITON_EMULATION", "0")
    assert not A.triton_asked()  # off: the gate does not even import lp_triton


def test_kgate_kernels_compile_into_the_workers_private_folder(monkeypatch, tmp_path):
    """Not into the Triton cache the candidates' kernels share (a candidate could leave a forged binary of
    kgate's kernel there for the next one); the shared setting is put back after."""
    monkeypatch.setenv("TRITON_CACHE_DIR", "/shared/cache")
    monkeypatch.setenv("KGATE_PRIVATE_DIR", str(tmp_path))
    with lp_triton._private_cache():
        assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert os.environ["TRITON_CACHE_DIR"] == "/shared/cache"
    monkeypatch.delenv("KGATE_PRIVATE_DIR")
    with lp_triton._private_cache():
        assert os.environ["TRITON_CACHE_DIR"] == "/shared/cache"


@pytest.mark.skipif(not ON_GPU, reason="the gate dispatches to Triton on CUDA tensors only")
@pytest.mark.parametrize("order", ORDERS)
def test_the_gate_on_a_gpu_gives_what_its_torch_code_gives(order, monkeypatch, tmp_path):
    monkeypatch.setenv("KGATE_TRITON_EMULATION", "1")
    monkeypatch.setenv("KGATE_PRIVATE_DIR", str(tmp_path))
    a, b = _operands((3,), (), 40, 300, 50)
    for acc in ACCS:
        mode = A.LowPrecisionAccumulation(acc, order)
        _same(mode._lp_matmul(a, b), _torch_path(mode, a, b))


@pytest.mark.skipif(not ON_GPU, reason="the Triton interpreter compiles nothing")
def test_on_a_gpu_kgates_kernels_compile_into_the_private_folder_only(tmp_path):
    """In a fresh process (this one has compiled them already): kgate's kernels land in KGATE_PRIVATE_DIR,
    none in the Triton cache the candidates share."""
    import subprocess
    import sys

    code = ("import torch; from kgate.gates import accumulation as A\n"
            "a = torch.rand(8, 40, device='cuda'); b = torch.rand(40, 8, device='cuda')\n"
            "for order in (A.PAIRWISE, A.SEQUENTIAL):\n"
            "    A.LowPrecisionAccumulation(torch.float16, order)._lp_matmul(a, b)\n"
            "torch.cuda.synchronize()\n")
    env = {**os.environ, "KGATE_TRITON_EMULATION": "1", "KGATE_PRIVATE_DIR": str(tmp_path / "private"),
           "TRITON_CACHE_DIR": str(tmp_path / "shared")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any((tmp_path / "private" / "triton").rglob("*")), "compiled into the private folder"
    assert not any((tmp_path / "shared").rglob("*")), "nothing of kgate's in the shared cache"


def test_warm_runs_every_variant_of_the_orders_taken(monkeypatch):
    """`warm` (kgate.runner.seed_private_folders runs it in a process of its own) runs each accumulator's
    pairwise kernel with every K block and its sequential kernel, of the orders the gate takes in Triton: all
    that a worker can need."""
    monkeypatch.setenv("KGATE_TRITON_EMULATION", "1")
    assert lp_triton.warm(DEVICE) == 2 * (len(range(int(lp_triton.math.log2(lp_triton.BK)) + 1)) + 1)
    monkeypatch.delenv("KGATE_TRITON_EMULATION")
    assert lp_triton.warm(DEVICE) == 2  # by default the sequential kernel of each accumulator
    monkeypatch.setenv("KGATE_TRITON_EMULATION", "0")
    assert lp_triton.warm(DEVICE) == 0


@pytest.mark.skipif(not ON_GPU, reason="the Triton interpreter compiles nothing")
def test_on_a_gpu_the_warmed_files_spare_a_worker_every_compile(tmp_path):
    """The files `python -m kgate.gates.lp_triton warm` leaves, copied into a fresh process's private folder
    (as supervise does), serve every product that process emulates: it compiles nothing more."""
    import shutil
    import subprocess
    import sys

    warmed = tmp_path / "warmed"
    done = subprocess.run([sys.executable, "-m", "kgate.gates.lp_triton", "warm", str(warmed), "cuda"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KGATE_TRITON_EMULATION": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    before = sorted(p.relative_to(warmed) for p in warmed.rglob("*") if p.is_file())
    private = tmp_path / "private"
    shutil.copytree(warmed, private)
    code = ("import torch; from kgate.gates import accumulation as A\n"
            "for k in (3, 20, 33, 300):\n"
            "    a = torch.rand(5, k, device='cuda'); b = torch.rand(k, 7, device='cuda')\n"
            "    for acc in (torch.float16, torch.bfloat16):\n"
            "        for order in (A.PAIRWISE, A.SEQUENTIAL):\n"
            "            A.LowPrecisionAccumulation(acc, order)._lp_matmul(a, b)\n"
            "torch.cuda.synchronize()\n")
    env = {**os.environ, "KGATE_TRITON_EMULATION": "1", "KGATE_PRIVATE_DIR": str(private)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.relative_to(private) for p in private.rglob("*") if p.is_file()) == before
