"""accumulation: the kernel's error is that of the reference's accumulator, not of an fp16/bf16 one.

The probe runs the reference three ways on inputs crafted so that sums grow (positive values uniform
in [0.5, 1.5), the factory's inputs, positive lognormal values): in float64 (the oracle), in the
kernel's dtype (the reference as written: its own accumulator), and in float64 with every reduction
it performs carried out by an emulated low-precision accumulator (float16 and bfloat16, whose products
and partial sums are held in float32, which rounds to them as float64 would; float32 too for float64
kernels), once in pairwise order (the most favourable a kernel can use) and once
sequentially (a running sum). The emulation is a TorchDispatchMode that replaces the reductions
torch dispatches (sum, mean, mm, bmm, addmm, baddbmm, mv, addmv, dot, softmax, log_softmax,
logsumexp, cumsum, var, std, var_mean, layer_norm, vector 2-norm, and 1- to 3-d convolutions, direct or
transposed, as a product of the weights and the input's patches) by the same computation whose
partial sums are rounded to the accumulator's dtype after every addition.

A probe judges an output where some emulated low-precision accumulator misses the oracle bound by
`SEPARATION` x or more (the inputs make the accumulators measurably different). There the kernel
fails when its error is above the oracle bound and within `CONSISTENT_FACTOR` x of an emulated
low-precision range [pairwise error, sequential error] (of the orders whose emulated error itself
misses the bound); the verdict names the most precise
accumulator whose range holds the error (else the nearest), with every emulated number. An error
above the bound that no emulated accumulator comes near is left to the oracle gate (noted in the
pass message). The verdict is relative, fp16/bf16-vs-fp32 accumulation of the same op on the same
inputs, with no tolerance of its own beyond the oracle bound. Where no probe separates the
accumulators (no floating inputs, no reduction the emulator knows, reductions too short for the
dtype), the gate is skipped and says why.

Every (shape, dtype) the manifest declares is a case, judged with the accumulators above against the
reference in that dtype. Positive values make every reduction grow with none cancelling, so their
probe separates most: it runs first in every case, before any case's other crafted inputs, so that a
search budget spent on one dtype's later probes leaves no other dtype unjudged. A failure names the
dtype; the pass message gives the strongest separation per dtype and names any declared dtype on
which no probe separated the accumulators (not judged there; `details.not_judged`). Where positive
values separate decisively (an emulated low-precision accumulator errs `DECISIVE` x the bound or more)
and the kernel meets the bound at every output (or misses it only by less than a quarter of every
emulated low-precision error there: something other than its accumulator, such as a fast GELU, which
the oracle gate judges), the kernel's accumulator is shown that much more precise than fp16/bf16 on
these very operations: the case is settled and its other crafted inputs are not run (on KernelBench's
level-2 GEMMs each probe costs seconds of emulated sums). The sequential order is emulated
only where it can change the verdict (not for a kernel that meets the bound where pairwise order,
the one most favourable to a low-precision accumulator, already errs `DECISIVE` x the bound). The
pass message says which cases were settled so.

A crafted probe the reference rejects (raises on: positive values for every input may be outside its
domain) is retried with the crafted values in one argument at a time, the others as the factory made
them (`kgate.subject.within_domain`); probes the reference still rejects are skipped and listed.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kgate.compare import clone_tree, flatten, map_tensors
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case, dtype_name
from kgate.oracle import BROKEN_FACTOR, measure
from kgate.shrink import ORACLE, judge_probe
from kgate.subject import Subject, rejected_note, unless_rejected, within_domain

SEPARATION = 2.0
DECISIVE = 100.0
UNIFORM, FACTORY = "positive values uniform in [0.5, 1.5)", "the factory's inputs"
CONSISTENT_FACTOR = 4.0
PAIRWISE, SEQUENTIAL = "pairwise", "sequential"
SEQUENTIAL_MAX_STEPS = 16384  # longer running sums add pairwise-summed blocks, to bound the Python loop
STEP_PRODUCTS = 1 << 16  # a running sum's products made at once, in elements: several steps' for a small output
PRODUCT_CHUNK = 1 << 20  # matmul products materialised at once, in float64 elements (8 MiB: on the CPU a chunk past the
# last-level cache costs several times its share; twice as many float32 elements) ...
PRODUCT_CHUNK_GPU = 1 << 25  # ... and on a GPU (256 MiB), where each chunk costs dozens of kernel launches
# The most products one emulated matrix product (or convolution) may take: beyond it the op runs as usual and
# the gate names it, rather than one probe outlasting the gate's time limit (a timeout would read as the
# kernel's error). A GPU does 1.4e11 (a 128 x 32768 x 32768 linear layer) in seconds; a CPU core far fewer.
EMULATION_BUDGET = {"cpu": 1 << 28, "other": 1 << 38}

aten = torch.ops.aten


def triton_orders() -> frozenset[str]:
    """The orders whose emulated matrix products run in Triton on a GPU (kgate.gates.lp_triton; the same sums,
    bit for bit): by default the sequential order alone, whose running sums the torch code adds a step at a
    time; KGATE_TRITON_EMULATION=1 both orders, =0 neither. Measured on one H100 (docs/audit/README.md,
    "Throughput", `ef5ef63`, both orders in Triton against neither, 24 candidates, every verdict equal): the
    sequential emulation 86.7 against 32.6 gate-seconds, the pairwise trees slower in Triton, 46.6 against
    33.2."""
    asked = os.environ.get("KGATE_TRITON_EMULATION")
    if asked == "1":
        return frozenset((PAIRWISE, SEQUENTIAL))
    if asked == "0":
        return frozenset()
    return frozenset((SEQUENTIAL,))


def triton_asked() -> bool:
    """Whether any emulated product may run in Triton on a GPU (see triton_orders)."""
    return bool(triton_orders())


class _OutOfTime(Exception):
    """The subject's search budget ran out before the probe named by `where`."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


class LowPrecisionAccumulation(TorchDispatchMode):
    """Run the reductions that torch dispatches with a running sum rounded to `acc` after each addition.

    Everything else runs as usual (in the inputs' dtype: float64 under the oracle). A reduction whose
    arguments the emulation does not handle runs as usual too; `emulated` counts what was replaced.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Keeps torch from wrapping __torch_dispatch__ with torch._disable_dynamo: that imports
        # torch._dynamo, which re-wraps torch.manual_seed and would read as the kernel patching torch.
        return False

    def __init__(self, acc: torch.dtype, order: str):
        super().__init__()
        self.acc = acc
        # The dtype the products and partial sums are held in between roundings. For a float16 or bfloat16
        # accumulator float32 does: the sum of two such values, rounded once in float32 and then to the
        # accumulator, is the exactly rounded sum (bar a double rounding when a far smaller term lands the
        # float32 sum on a midpoint, about once in 2^12 sums with a 12-13 binade gap), and products of
        # float32 values are rounded once more (2^-24, against the accumulator's 2^-9 or 2^-12). It halves
        # the memory traffic of the matrix products' trees, most of the gate's time.
        self.work = torch.float32 if acc in (torch.float16, torch.bfloat16) else torch.float64
        self.order = order
        self.emulated: Counter[str] = Counter()
        self.failed: dict[str, str] = {}  # op -> why its emulation failed (it then ran as usual)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        real = func(*args, **kwargs)
        handler = _HANDLERS.get(func.overloadpacket)
        floating = any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)
        if handler is None or not floating:
            return real
        op = str(func.overloadpacket).removeprefix("aten.")
        try:
            emulated = handler(self, *args, **kwargs)
            result = _like(emulated, real)
        except (TypeError, ValueError, RuntimeError, NotImplementedError, IndexError) as exc:
            # arguments the emulation does not handle, or too large for memory: the op runs as usual,
            # and the gate says which ops were left so
            self.failed.setdefault(op, str(exc) if isinstance(exc, NotImplementedError) else type(exc).__name__)
            return real
        self.emulated[op] += 1
        return result

    # -- the low-precision building blocks ----------------------------------------------------------

    def round(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.acc).to(self.work)

    def add_rounded(self, acc: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        """A running sum's step: `acc` (held in the accumulator's own dtype) + `term` (in `work`), computed in
        `work` and rounded to the accumulator, written over `acc`: one kernel, where `round(acc + term)` with
        the sum held in `work` took three (an add and two conversions) and twice the memory traffic. The same
        numbers: an accumulator value is exact in `work`, the sum is rounded once in `work` and once to the
        accumulator either way."""
        return torch.add(acc, term, out=acc)

    def reduce_last(self, y: torch.Tensor) -> torch.Tensor:
        """Sum over the last dimension of `y` with the accumulator in `self.acc` (float64 out)."""
        return self._reduce_last(y).to(torch.float64)

    def _reduce_last(self, y: torch.Tensor) -> torch.Tensor:
        n = y.shape[-1]
        if n == 0:
            return torch.zeros(y.shape[:-1], dtype=torch.float64, device=y.device)
        if self.order == SEQUENTIAL and n > SEQUENTIAL_MAX_STEPS:
            block = math.ceil(n / SEQUENTIAL_MAX_STEPS)
            y = torch.nn.functional.pad(y, (0, (-n) % block)).unflatten(-1, (-1, block))
            y = self._pairwise(y)
            n = y.shape[-1]
        if self.order == PAIRWISE:
            return self._pairwise(y)
        acc = y[..., 0].to(self.acc, copy=True)
        for k in range(1, n):
            self.add_rounded(acc, y[..., k])
        return acc.to(self.work)

    def _pairwise(self, y: torch.Tensor) -> torch.Tensor:
        # The tree is summed in the accumulator's own dtype: torch adds two float16 or bfloat16 tensors in
        # float32 and rounds once to the dtype, which is the exactly rounded sum bar a rare double
        # rounding (see `work`); float32 and float64 sums are exactly rounded as they are. One kernel per
        # level on two-byte elements, where an add in `work` and a rounding after it took three kernels.
        y = y.to(self.acc)
        while y.shape[-1] > 1:
            if y.shape[-1] % 2:
                y = torch.nn.functional.pad(y, (0, 1))
            y = y[..., 0::2] + y[..., 1::2]
        return y[..., 0].to(self.work)

    def lp_sum(self, x: torch.Tensor, dims: Any = None, keepdim: bool = False) -> torch.Tensor:
        x = x.to(self.work)
        nd = x.dim()
        if nd == 0:
            return self.round(x)
        dims = list(range(nd)) if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) \
            else sorted({d % nd for d in ([dims] if isinstance(dims, int) else dims)})
        keep = [d for d in range(nd) if d not in dims]
        y = x.permute(keep + dims).reshape([x.shape[d] for d in keep] + [-1])
        out = self.reduce_last(y)
        if keepdim:
            out = out.reshape([1 if d in dims else x.shape[d] for d in range(nd)])
        return out

    def lp_matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a (..., M, K) @ b (..., K, N) with the K-sum in the low-precision accumulator (float64 out)."""
        return self._lp_matmul(a.to(self.work), b.to(self.work)).to(torch.float64)

    def _lp_matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k = a.shape[-1]
        m, n = a.shape[-2], b.shape[-1]
        lead = _broadcast(a.shape[:-2], b.shape[:-2])
        batch = math.prod(lead)
        _within_budget(batch * m * k * n, a.device)
        if k == 0:
            return a.new_zeros(lead + (m, n))
        if a.is_cuda and (self.order == PAIRWISE or k <= SEQUENTIAL_MAX_STEPS) and self.order in triton_orders():
            from kgate.gates import lp_triton  # imported on a GPU only: Triton is optional

            if lp_triton.usable(a, self.work, self.acc):  # the same trees in a few launches
                return lp_triton.matmul(a, b, self.acc, self.order, self._pairwise, lead)
        if self.order == SEQUENTIAL and k <= SEQUENTIAL_MAX_STEPS:
            # the products of `steps` consecutive k at once (one kernel), each added in its turn: fewer launches
            # where an output is small; a large one is multiplied step by step (products kept in cache)
            steps = max(1, min(k, STEP_PRODUCTS // max(1, batch * m * n)))
            acc = None
            for i in range(0, k, steps):
                products = a[..., :, i:i + steps].transpose(-1, -2).unsqueeze(-1) * b[..., i:i + steps, :].unsqueeze(-2)
                for j in range(products.shape[-3]):
                    if acc is None:
                        acc = products[..., j, :, :].to(self.acc, copy=True)
                    else:
                        self.add_rounded(acc, products[..., j, :, :])
            return acc.to(self.work)
        if self.order == SEQUENTIAL:
            return self._blocked_sequential_matmul(a, b, batch)
        budget = _product_chunk(a)
        rows = max(1, budget // max(1, batch * k * n))
        cols = n if batch * k * n <= budget else max(1, budget // max(1, batch * k))
        # K itself too long for one column's products: aligned power-of-two blocks of K summed pairwise,
        # then their sums pairwise; the same tree (zero padding is exact), in bounded memory
        kb = k if batch * k <= budget else 1 << (max(1, budget // max(1, batch))).bit_length() - 1
        parts = []
        for start in range(0, m, rows):
            sub = a[..., start:start + rows, :]
            row_parts = []
            for c0 in range(0, n, cols):
                bc = b[..., :, c0:c0 + cols]
                sums = [self._pairwise((sub[..., :, i:i + kb].unsqueeze(-1) * bc[..., i:i + kb, :].unsqueeze(-3))
                                       .transpose(-1, -2)) for i in range(0, k, kb)]  # each (..., r, cols)
                row_parts.append(sums[0] if len(sums) == 1 else self._pairwise(torch.stack(sums, dim=-1)))
            parts.append(torch.cat(row_parts, dim=-1))
        return torch.cat(parts, dim=-2) if parts else a.new_zeros(a.shape[:-1] + (n,))

    def _blocked_sequential_matmul(self, a: torch.Tensor, b: torch.Tensor, batch: int) -> torch.Tensor:
        """The sequential K-sum of more than SEQUENTIAL_MAX_STEPS terms, as `reduce_last` does it (blocks of
        the zero-padded K summed pairwise, the block sums added in a running sum), one block of every
        output at a time: SEQUENTIAL_MAX_STEPS steps in all, not that many per chunk of rows."""
        k, m, n = a.shape[-1], a.shape[-2], b.shape[-1]
        block = math.ceil(k / SEQUENTIAL_MAX_STEPS)
        pad = (-k) % block
        a = torch.nn.functional.pad(a, (0, pad))
        b = torch.nn.functional.pad(b, (0, 0, 0, pad))
        rows = max(1, _product_chunk(a) // max(1, batch * block * n))
        parts = []
        for start in range(0, m, rows):
            sub = a[..., start:start + rows, :]
            acc = None
            for i in range(0, k + pad, block):
                prods = sub[..., :, i:i + block].unsqueeze(-1) * b[..., i:i + block, :].unsqueeze(-3)  # (..., r, blk, N)
                step = self._pairwise(prods.transpose(-1, -2))
                acc = step.to(self.acc, copy=True) if acc is None else self.add_rounded(acc, step)
            parts.append(acc.to(self.work))
        return torch.cat(parts, dim=-2) if parts else a.new_zeros(a.shape[:-1] + (n,))

    def _count(self, x: torch.Tensor, dims: Any) -> int:
        if isinstance(dims, bool):
            raise TypeError("an `unbiased` flag, not dimensions")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            return x.numel()
        dims = [dims] if isinstance(dims, int) else dims
        return math.prod(x.shape[d] for d in dims)

    def _var(self, x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False):
        n = self._count(x, dim)
        mean = self.lp_sum(x, dim, keepdim=True) / n
        c = 1 if correction is None else correction
        var = self.lp_sum((x.to(torch.float64) - mean) ** 2, dim, keepdim) / max(n - c, 0)
        return var, (mean if keepdim else mean.reshape(var.shape))


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of `shapes` (torch.broadcast_shapes' rule; its first call imports sympy, half a second
    of a worker's time). Incompatible shapes raise RuntimeError: the op then runs as usual."""
    out = []
    for sizes in itertools.zip_longest(*(reversed(tuple(s)) for s in shapes), fillvalue=1):
        other = {n for n in sizes if n != 1}
        if len(other) > 1:
            raise RuntimeError(f"shapes {shapes} do not broadcast")
        out.append(other.pop() if other else 1)
    return tuple(reversed(out))


def _within_budget(products: int, device: torch.device) -> None:
    budget = EMULATION_BUDGET["cpu" if device.type == "cpu" else "other"]
    if products > budget:
        raise NotImplementedError(f"{products:.3g} products, more than kgate emulates on {device.type} "
                                  f"({budget:.3g})")


def _product_chunk(like: torch.Tensor) -> int:
    """How many products of `like`'s dtype and device to materialise at once (the same bytes in any dtype)."""
    return (PRODUCT_CHUNK if like.device.type == "cpu" else PRODUCT_CHUNK_GPU) * 8 // like.element_size()


def _like(emulated: Any, real: Any) -> Any:
    """`emulated` with `real`'s dtypes; a different structure or shape is an error (the caller falls back)."""
    if isinstance(real, torch.Tensor):
        if not isinstance(emulated, torch.Tensor) or tuple(emulated.shape) != tuple(real.shape):
            raise ValueError("emulation does not match the real result")
        return emulated.to(real.dtype)
    if isinstance(real, (tuple, list)) and isinstance(emulated, (tuple, list)) and len(real) == len(emulated):
        return type(real)(_like(e, r) for e, r in zip(emulated, real))
    raise ValueError("emulation does not match the real result")


def _sum(m, x, dim=None, keepdim=False, *, dtype=None):
    return m.lp_sum(x, dim, keepdim)


def _mean(m, x, dim=None, keepdim=False, *, dtype=None):
    return m.lp_sum(x, dim, keepdim) / m._count(x, dim)


def _mm(m, a, b):
    return m.lp_matmul(a, b)


def _addmm(m, bias, a, b, *, beta=1, alpha=1):
    return beta * bias.to(torch.float64) + alpha * m.lp_matmul(a, b)


def _mv(m, a, v):
    return m.lp_matmul(a, v.unsqueeze(-1)).squeeze(-1)


def _addmv(m, bias, a, v, *, beta=1, alpha=1):
    return beta * bias.to(torch.float64) + alpha * _mv(m, a, v)


def _dot(m, a, b):
    return m.lp_sum(a.to(torch.float64) * b.to(torch.float64))


def _softmax(m, x, dim, half_to_float=False):
    x = x.to(torch.float64)
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / m.lp_sum(e, dim, keepdim=True)


def _log_softmax(m, x, dim, half_to_float=False):
    x = x.to(torch.float64)
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - torch.log(m.lp_sum(torch.exp(shifted), dim, keepdim=True))


def _logsumexp(m, x, dim, keepdim=False):
    x = x.to(torch.float64)
    top = x.amax(dim, keepdim=True)
    out = top + torch.log(m.lp_sum(torch.exp(x - top), dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


def _cumsum(m, x, dim, *, dtype=None):
    y = x.to(torch.float64).movedim(dim, -1)
    outs = []
    acc = torch.zeros(y.shape[:-1], dtype=torch.float64, device=y.device)
    for k in range(y.shape[-1]):
        acc = m.round(acc + y[..., k])
        outs.append(acc)
    return torch.stack(outs, -1).movedim(-1, dim) if outs else y.movedim(-1, dim)


def _var(m, x, dim=None, *, correction=None, keepdim=False):
    return m._var(x, dim, correction=correction, keepdim=keepdim)[0]


def _std(m, x, dim=None, *, correction=None, keepdim=False):
    return torch.sqrt(_var(m, x, dim, correction=correction, keepdim=keepdim))


def _var_mean(m, x, dim=None, *, correction=None, keepdim=False):
    return m._var(x, dim, correction=correction, keepdim=keepdim)


def _layer_norm(m, x, normalized_shape, weight, bias, eps):
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    var, mean = m._var(x, dims, correction=0, keepdim=True)
    rstd = 1 / torch.sqrt(var + eps)
    out = (x.to(torch.float64) - mean) * rstd
    if weight is not None:
        out = out * weight.to(torch.float64)
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out, mean, rstd


def _vector_norm(m, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if ord != 2:
        raise NotImplementedError("only the 2-norm is emulated")
    return torch.sqrt(m.lp_sum(x.to(torch.float64).abs() ** 2, dim, keepdim))


def _convolution(m, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """aten.convolution (1-, 2- and 3-d, grouped, dilated, transposed) as a matrix product of the
    weights and the input's patches (im2col), the sum over input channels x window in the accumulator.
    A transposed convolution is the direct one over the input spread by the stride (zeros between its
    values: adding an exact zero changes no running sum), padded by dilation x (kernel - 1) - padding,
    with the kernel flipped and its channel axes swapped."""
    x, w = x.to(torch.float64), w.to(torch.float64)
    nd = x.dim() - 2
    if nd < 1 or w.dim() != nd + 2:
        raise NotImplementedError("convolution over 1 to 3 spatial dimensions, batched")
    stride, padding, dilation = (list(v) * (nd if len(v) == 1 else 1) for v in (stride, padding, dilation))
    kernel = list(w.shape[2:])
    if transposed:
        output_padding = list(output_padding) * (nd if len(output_padding) == 1 else 1)
        n, c = x.shape[:2]
        spread = x.new_zeros((n, c, *[(size - 1) * st + 1 for size, st in zip(x.shape[2:], stride, strict=True)]))
        spread[(slice(None), slice(None), *[slice(None, None, st) for st in stride])] = x
        x = spread
        # (C_in, O/g, *K) -> (O, C_in/g, *K), the window flipped
        cin, og = w.shape[:2]
        w = w.reshape(groups, cin // groups, og, *kernel).transpose(1, 2).reshape(groups * og, cin // groups, *kernel)
        w = w.flip(list(range(2, nd + 2)))
        pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
                for k, p, d, op in zip(kernel, padding, dilation, output_padding, strict=True)]
        stride = [1] * nd
    else:
        pads = [(p, p) for p in padding]
    x = torch.nn.functional.pad(x, [v for pair in reversed(pads) for v in pair])
    for i, (k, st, d) in enumerate(zip(kernel, stride, dilation, strict=True)):
        x = x.unfold(2 + i, (k - 1) * d + 1, st)[..., ::d]  # (..., out_i, ..., k_i) appended last
    # x: (N, C, *Out, *K) -> (N, groups, C/g * prod(K), prod(Out)); checked before the patches are copied
    n, c, out = x.shape[0], x.shape[1], list(x.shape[2:2 + nd])
    _within_budget(n * w.shape[0] * math.prod(out) * (c // groups) * math.prod(kernel), x.device)
    cols = x.reshape(n, groups, c // groups, math.prod(out), math.prod(kernel)).permute(0, 1, 2, 4, 3)
    cols = cols.reshape(n, groups, (c // groups) * math.prod(kernel), math.prod(out))
    o = w.shape[0]
    weights = w.reshape(groups, o // groups, -1)  # (groups, O/g, C/g * prod(K)), the same (c, k) order
    y = m.lp_matmul(weights, cols).reshape(n, o, *out)
    if bias is not None:
        y = y + bias.to(torch.float64).reshape(1, o, *([1] * nd))
    return y


_HANDLERS = {
    aten.convolution: _convolution,
    aten.sum: _sum, aten.mean: _mean, aten.mm: _mm, aten.bmm: _mm, aten.addmm: _addmm, aten.baddbmm: _addmm,
    aten.mv: _mv, aten.addmv: _addmv, aten.dot: _dot, aten._softmax: _softmax, aten._log_softmax: _log_softmax,
    aten.logsumexp: _logsumexp, aten.cumsum: _cumsum, aten.var: _var, aten.std: _std, aten.var_mean: _var_mean,
    aten.native_layer_norm: _layer_norm, aten.linalg_vector_norm: _vector_norm,
}


# -- the gate ------------------------------------------------------------------------------------------------

def crafted_inputs(args: tuple, seed: int, skip: int = 0) -> Iterator[tuple[str, tuple]]:
    """The probes' inputs, made one at a time as they are taken: positive values (every sum grows, none
    cancels: the one probe that can settle a case), the factory's own, then positive values with a wide range.
    `skip`: start at that probe; the values of the later ones are the same (the generator is advanced
    through the skipped draws a tensor at a time, without keeping them)."""
    gen = torch.Generator().manual_seed(seed)
    draws = [
        (UNIFORM, lambda t: 0.5 + torch.rand(t.shape, generator=gen, dtype=torch.float64)),
        (FACTORY, None),
        ("positive lognormal values (sigma 1)", lambda t: torch.exp(torch.randn(t.shape, generator=gen,
                                                                              dtype=torch.float64))),
    ]
    for index, (label, draw) in enumerate(draws):
        if index < skip:
            if draw is not None:  # each tensor's draw made and dropped: the generator moves on as if it were kept
                map_tensors(args, lambda t, draw=draw: (draw(t), t)[1] if t.is_floating_point() else t)
            continue
        if draw is None:
            yield label, clone_tree(args)
        else:
            yield label, map_tensors(args, lambda t, draw=draw: draw(t).to(dtype=t.dtype, device=t.device)
                                     if t.is_floating_point() else t.clone())


def accumulators(dtype: str) -> list[torch.dtype]:
    lows = [torch.float16, torch.bfloat16]
    return lows + [torch.float32] if dtype == "float64" else lows


@dataclass
class _Tally:
    """What one check has gathered so far, across its cases and probes."""

    covered: Counter = field(default_factory=Counter)  # op -> emulated calls
    separating: list = field(default_factory=list)  # (dtype, power, unexplained outputs) per separating probe
    dtypes: list = field(default_factory=list)  # the dtypes of the cases with floating-point inputs, in order
    rejected: list = field(default_factory=list)  # probes the reference rejects
    settles: list = field(default_factory=list)  # cases a decisive positive-values probe settled
    ambiguous: list = field(default_factory=list)  # failures whose accumulator the inputs cannot name
    failed: dict = field(default_factory=dict)  # op -> why its emulation failed (it then ran as usual)
    seconds: Counter = field(default_factory=Counter)  # phase -> seconds: where the gate's time goes
    probes: int = 0  # crafted inputs run


class Accumulation(Gate):
    name = "accumulation"
    summary = "error consistent with the reference's accumulator, not with fp16/bf16 accumulation (relative)"
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        tally = _Tally()
        result = self._verdict(subject, tally)
        # where the time went (the reference and oracle runs, each emulated order), for the audit's benchmarks
        result.details["seconds"] = {phase: round(t, 6) for phase, t in tally.seconds.items()}
        result.details["probes"] = tally.probes
        return result

    def _verdict(self, subject: Subject, tally: _Tally) -> GateResult:
        covered, separating, rejected, settles = tally.covered, tally.separating, tally.rejected, tally.settles
        failed = tally.failed
        try:
            found = self._search(subject, tally)
        except _OutOfTime as stop:
            found, cut = (tally.ambiguous[0] if tally.ambiguous else None), stop.where
        else:
            cut = None
        if found is not None:
            return found
        judged, unexplained = len(separating), sum(n for _, _, n in separating)
        stopped = (f"; the search budget (kgate.worker.SEARCH_SHARE of the gate's time limit) ran out before "
                   f"the probe {cut}: not every crafted input was tried" if cut else "")
        left = ("; not emulated: " + ", ".join(f"{op} ({why})" for op, why in sorted(failed.items()))
                + " (those ran as usual)") if failed else ""
        stopped = left + stopped
        if judged == 0:
            note = f" (skipped {len(rejected)} probe(s) the reference rejects)" if rejected else ""
            if not covered and not cut:
                if failed:
                    return self.skipped("kgate could not emulate the reference's reductions with a low-precision "
                                        f"accumulator: nothing to separate{note}{left}")
                return self.skipped("the reference performs no reduction that kgate emulates with a low-precision "
                                    f"accumulator (or has no floating-point inputs): nothing to separate{note}")
            return self.skipped(f"the crafted inputs never made fp16/bf16 accumulation of the reference measurably "
                                f"worse than its own error ({_ops(covered)} emulated; reductions may be too short "
                                f"for the dtype): nothing to judge{note}{stopped}")
        per_dtype: dict[str, list[float]] = {}
        for dtype, power, _ in separating:
            per_dtype.setdefault(dtype, []).append(power)
        message = (f"no sign of low-precision accumulation in {judged} separating probe(s) ({_ops(covered)}); "
                   f"the strongest: low-precision accumulation would err "
                   + ", ".join(f"{max(p):.3g} x the bound on {d} ({len(p)} probe(s))" for d, p in per_dtype.items()))
        unjudged = [d for d in dict.fromkeys(tally.dtypes) if d not in per_dtype]
        if unjudged:
            # a declared dtype none of whose probes separates the accumulators is not judged: said, not hidden
            message += (f"; not judged on {', '.join(unjudged)}: no crafted input made fp16/bf16 accumulation "
                        f"measurably worse than the reference's own error there (reductions too short for the "
                        f"dtype{', or the search budget ran out first' if cut else ''})")
        if unexplained:
            message += (f"; {unexplained} output(s) miss the bound by an amount no emulated accumulator gives "
                        f"(the oracle gate judges those)")
        if settles:
            message += (f"; settled by positive values alone (low-precision accumulation >= {DECISIVE:g} x the bound "
                        f"there) in {len(settles)} case(s): their other crafted inputs were not tried")
        return self.passed(message + rejected_note(rejected) + stopped, details={
            "dtypes": {d: {"separating": len(p), "strongest": max(p)} for d, p in per_dtype.items()},
            "not_judged": unjudged})

    def _search(self, subject: Subject, tally: _Tally) -> GateResult | None:
        """Every case's crafted probes (raises _OutOfTime once the subject's search budget is spent): first
        positive values (the probe that separates most) in every case, every dtype and shape, then the other
        crafted inputs of the cases those did not settle, so that a budget spent on one dtype's later probes
        does not leave another dtype unjudged. Appends (dtype, power, unexplained outputs) of each separating
        probe to `tally.separating` and the cases a decisive positive-values probe settled to
        `tally.settles`; returns a failure (the first failure found, when none of the later ones names its
        accumulator unambiguously: those go to `tally.ambiguous` meanwhile)."""
        cases = subject.first_seed_cases()
        settled: set[Case] = set()
        for first in (True, False):
            for case in cases:
                if case in settled:
                    continue
                base = subject.baseline(case)
                floats = [i for i, a in enumerate(base.args)
                          if any(isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0
                                 for _, t in flatten(a))]
                if not floats:
                    continue
                if first:
                    tally.dtypes.append(case.dtype)
                probes = crafted_inputs(base.args, case.seed, skip=0 if first else 1)
                for label, crafted in (itertools.islice(probes, 1) if first else probes):
                    outcome = self._crafted(subject, tally, case, base.args, floats, label, crafted)
                    if isinstance(outcome, GateResult):
                        return outcome
                    if outcome:
                        tally.settles.append(case.label())
                        settled.add(case)
                        break
        return tally.ambiguous[0] if tally.ambiguous else None

    def _crafted(self, subject: Subject, tally: _Tally, case: Case, args: tuple, floats: list[int], label: str,
                 crafted: tuple) -> GateResult | bool:
        """One crafted input of a case, as given and, where the reference rejects it, one argument at a time:
        a failure that names its accumulator, or whether the probe settled the case."""
        def judge(inputs: tuple, argument: int | None):
            where = _alone(label, argument)
            if argument is not None:
                where += " (the others as the factory made them)"
            if subject.out_of_time():
                raise _OutOfTime(f"{where} ({case.label()})")
            return self._probe(subject, case, where, inputs, tally)

        # The factory's inputs change nothing: no argument to retry alone.
        settled = False
        for argument, _, outcome in within_domain(args, crafted, [] if label == FACTORY else floats, judge,
                                                  subject.conform):
            if outcome is None:
                tally.rejected.append(f"{_alone(label, argument)} ({case.label()})")
                continue
            if isinstance(outcome, GateResult):
                if not outcome.details.get("also_consistent_with"):
                    return outcome
                # a failure whose accumulator these inputs cannot name: kept, while the other crafted inputs
                # are tried for one that tells the accumulators apart
                tally.ambiguous.append(outcome)
                continue
            if outcome is not False:
                tally.separating.append((case.dtype, outcome[0], len(outcome[1])))
                # an output that misses the bound by far less than any low-precision accumulator would (a
                # fast GELU, an epilogue's own rounding) leaves the accumulator settled: the oracle gate
                # judges that miss; one above that range does not
                settled = (label == UNIFORM and argument is None and outcome[0] >= DECISIVE
                           and not outcome[2])
        return settled

    def _probe(self, subject: Subject, case: Case, label: str, crafted: tuple,
               tally: _Tally) -> GateResult | tuple[float, list] | bool | None:
        """A failure; or (separation power, outputs off the bound by an amount no accumulator explains,
        those of them not far below every accumulator's error) of a probe that passes; False when the probe cannot judge (nothing emulated, no output separates the
        accumulators); None when the reference rejects it. `label` gains the argument for a probe whose
        crafted values are in one argument alone (the others as the factory made them)."""
        covered = tally.covered
        emulated: dict[tuple[torch.dtype, str], Any] = {}
        here: Counter = Counter()
        tally.probes += 1

        def emulate(order: str) -> None:
            start = time.perf_counter()
            try:
                for acc in accumulators(case.dtype):
                    mode = LowPrecisionAccumulation(acc, order)
                    with mode:
                        emulated[(acc, order)] = subject.oracle(crafted)
                    here.update(mode.emulated)
                    for op, why in mode.failed.items():
                        tally.failed.setdefault(op, why)
            finally:
                tally.seconds[order] += time.perf_counter() - start

        def run() -> tuple:
            start = time.perf_counter()
            reference = subject.run_reference(clone_tree(crafted))
            oracle = subject.oracle(crafted)
            tally.seconds["reference and oracle"] += time.perf_counter() - start
            emulate(PAIRWISE)
            return reference, oracle

        outputs = unless_rejected(run)
        if outputs is None:
            return None
        reference, oracle = outputs
        covered.update(here)
        if not here:
            return False
        finding, leaves = judge_probe(subject, crafted, reference, oracle)
        if finding is not None and finding.kind != ORACLE:
            result = self.failed(subject, f"on {label} ({case.dtype}): {finding.message}", case=case,
                                 expected=finding.expected, got=finding.got, where=finding.where, broken=True,
                                 details={**finding.details, "kind": finding.kind, "dtype": case.dtype})
            result.tolerance_free = True
            return result
        refs = dict(flatten(reference))
        wants = dict(flatten(oracle))
        judged = [leaf for leaf in leaves
                  if isinstance(refs.get(leaf.path), torch.Tensor) and refs[leaf.path].is_floating_point()]

        def errors(order: str) -> dict[tuple[str, torch.dtype], float]:
            out = {}
            for acc in accumulators(case.dtype):
                tree = dict(flatten(emulated[(acc, order)]))
                for leaf in judged:
                    emu = tree.get(leaf.path)
                    out[(leaf.path, acc)] = (measure(emu.to(refs[leaf.path].dtype), None, wants[leaf.path],
                                                     path=leaf.path, factor=1, ulps=0, atol=0).err
                                             if isinstance(emu, torch.Tensor) else 0.0)
            return out

        pairwise = errors(PAIRWISE)
        # Pairwise order is the most favourable to a low-precision accumulator. Where the kernel meets the
        # bound everywhere and pairwise alone already errs DECISIVE x the bound at some output, the
        # sequential order (larger errors still) cannot change the verdict: the probe settles its case
        # either way (the power reported is then pairwise's, a lower bound). Otherwise both orders count.
        strongest = max((pairwise[(leaf.path, acc)] / leaf.bound for leaf in judged if leaf.bound > 0
                         for acc in accumulators(case.dtype)), default=0.0)
        sequential = pairwise
        if any(leaf.err > leaf.bound for leaf in judged) or strongest < DECISIVE:
            before = Counter(here)
            done = unless_rejected(lambda: emulate(SEQUENTIAL) or True)  # the reference took these inputs
            covered.update(here - before)
            if done:
                sequential = errors(SEQUENTIAL)
        powers: list[float] = []
        unexplained: list = []  # outputs off the bound by an amount no emulated accumulator gives ...
        above: list = []  # ... those of them not far below every low-precision accumulator's error
        for leaf in judged:
            low: dict[torch.dtype, tuple[float, float]] = {
                acc: (pairwise[(leaf.path, acc)], sequential[(leaf.path, acc)]) for acc in accumulators(case.dtype)}
            # An accumulator is distinguishable from the reference's where its emulation misses the bound.
            distinct = {acc: e for acc, e in low.items() if max(e) > leaf.bound > 0}
            if not any(max(e) >= SEPARATION * leaf.bound for e in distinct.values()):
                continue
            if leaf.err > leaf.bound:
                # Only an order whose emulated error misses the bound can explain a kernel that misses it:
                # an order that meets it (a nonlinearity after the sum, such as a saturating tanh, can hide
                # one order's error) says nothing, and must not stretch the accumulator's range down to it.
                over = {acc: [(order, x) for order, x in zip((PAIRWISE, SEQUENTIAL), e) if x > leaf.bound]
                        for acc, e in distinct.items()}
                consistent = {acc: es for acc, es in over.items()
                              if min(x for _, x in es) / CONSISTENT_FACTOR <= leaf.err
                              <= max(x for _, x in es) * CONSISTENT_FACTOR}
                if consistent:
                    return self._fail(subject, case, label, leaf, low, consistent, covered)
                unexplained.append(leaf)
                if not all(leaf.err < min(x for _, x in es) / CONSISTENT_FACTOR for es in over.values()):
                    above.append(leaf)
            powers.append(max(max(e) for e in distinct.values()) / leaf.bound)
        return (max(powers), unexplained, above) if powers else False

    def _fail(self, subject: Subject, case: Case, label: str, leaf, low: dict, consistent: dict,
              covered: Counter) -> GateResult:
        # `consistent`: per accumulator, the (order, emulated error) pairs above the bound. The most precise
        # accumulator whose emulated range holds the kernel's error (the smallest precision loss that
        # explains it) names the verdict; failing that, the nearest emulated error (in ratio).
        inside = [a for a, es in consistent.items()
                  if min(x for _, x in es) <= leaf.err <= max(x for _, x in es)]
        if inside:
            acc = min(inside, key=lambda a: torch.finfo(a).eps)
            others = [dtype_name(a) for a in inside if a != acc]
        else:
            others = []
            acc = min(consistent, key=lambda a: min(_log_ratio(leaf.err, x) for _, x in consistent[a]))
        order, nearest = min(consistent[acc], key=lambda ox: _log_ratio(leaf.err, ox[1]))
        ranges = "; ".join(f"{dtype_name(a)} accumulator {e[0]:.3g} (pairwise) to {e[1]:.3g} (sequential)"
                           for a, e in low.items())
        ref = "unknown" if leaf.ref_err is None else f"{leaf.ref_err:.3g}"
        message = (f"{leaf.where} on {case.dtype} inputs: kernel error {leaf.err:.3g} is consistent with {dtype_name(acc)} accumulation (nearest: "
                   f"{order} order, {nearest:.3g}"
                   f"{'; also within the range of ' + ' and '.join(others) + ': these inputs do not tell them apart' if others else ''}"
                   f"), while the reference in "
                   f"{case.dtype} errs {ref} (bound {leaf.bound:.3g}); the reference emulated with a low-precision "
                   f"accumulator errs: {ranges}; inputs: {label} ({_ops(covered)} emulated)")
        return self.failed(subject, message, case=case, expected=f"{leaf.expected!r} (float64 oracle)",
                           got=repr(leaf.got), where=leaf.where, broken=leaf.ratio > BROKEN_FACTOR,
                           details={"dtype": case.dtype, "consistent_with": dtype_name(acc), "order": order,
                                    "also_consistent_with": others, "kernel_err": leaf.err, "bound": leaf.bound,
                                    "inputs": label,
                                    "emulated": {dtype_name(a): list(e) for a, e in low.items()}})


def _alone(label: str, argument: int | None) -> str:
    """The label of crafted inputs, naming the argument when only that one holds them."""
    return label if argument is None else f"{label} in argument {argument} alone"


def _log_ratio(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if a <= 0 or b <= 0 or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(math.log(a / b))


def _ops(covered: Counter) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(covered.items())) or "nothing"


GATE = Accumulation
