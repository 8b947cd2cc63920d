"""isolation, violating controls: right answers for the wrong reasons."""

import threading
import time

import torch

_cache = {}


def softmax_stable(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


def softmax_memo_by_address(x):
    """Caches results keyed on (data_ptr, shape, dtype), "the same tensor again", as an inference
    engine might for constant weights. Wrong as soon as the caller writes new values into the same
    buffer, or the allocator hands a freed address to another tensor."""
    key = (x.data_ptr(), tuple(x.shape), x.dtype)
    if key not in _cache:
        _cache[key] = softmax_stable(x)
    return _cache[key].clone()


def softmax_side_thread(x):
    """Returns at once and fills the output from a worker thread (a "pipelined" launcher): whoever
    reads the result before the thread is done reads the allocator's garbage."""
    out = torch.empty_like(x)

    def work():
        time.sleep(0.05)  # the worker is busy with the previous batch first
        out.copy_(softmax_stable(x))

    threading.Thread(target=work, name="softmax-pipeline", daemon=True).start()
    return out


def _routed_softmax(input, dim=None, dtype=None, **kwargs):
    return softmax_stable(input if dtype is None else input.to(dtype))


def softmax_registers_itself(x):
    """Installs itself as torch.softmax so that "the whole model" uses it. The reference calls
    torch.softmax too, so from then on every comparison compares the kernel with itself."""
    torch.softmax = _routed_softmax
    return softmax_stable(x)


def softmax_patches_timer(x):
    """Makes benchmarks look 2x faster by halving time.perf_counter."""
    if not getattr(time.perf_counter, "_halved", False):
        real = time.perf_counter

        def halved():
            return real() / 2

        halved._halved = True
        time.perf_counter = halved
    return softmax_stable(x)


class DeferredTensor(torch.Tensor):
    """The kind of wrapper lazy / deferred-execution kernels return instead of a plain tensor."""


def softmax_deferred(x):
    return softmax_stable(x).as_subclass(DeferredTensor)


def softmax_flush_denormals(x):
    """Subnormal arithmetic is up to 100x slower on x86, so it switches the CPU to flush-to-zero /
    denormals-are-zero before computing, and never switches back: every later computation of the process
    (the caller's, the reference's) now reads and writes subnormals as 0."""
    torch.set_flush_denormal(True)
    return softmax_stable(x)


def softmax_pins_one_thread(x):
    """Small rows run faster on one thread than with the pool's fork/join, so it pins torch to one thread and
    never gives the others back: every later computation of the process runs single-threaded. Invisible in a
    process that had one thread already, as a judging worker on a busy machine may."""
    torch.set_num_threads(1)
    return softmax_stable(x)


class _SeededLinear(torch.nn.Module):
    """A linear layer's weight and bias, seeded (11) as correct.py's Linear draws them, made on the CPU at import
    and moved to the input's device at the first call (`follow`)."""

    def __init__(self, out_features: int, in_features: int):
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features, generator=gen) / in_features ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(out_features, generator=gen) * 0.1)

    def follow(self, x):
        if self.weight.device != x.device:
            self.to(x.device)


class LinearCachedByAddress(_SeededLinear):
    """Keeps the weight transposed and contiguous, keyed on the weight's data_ptr, "the same weights
    again", as an inference engine might: an optimizer step, copy_ or load_state_dict changes the weights
    in place, at the same address, and the layer goes on computing with the old ones."""

    def __init__(self):
        super().__init__(16, 32)

    def forward(self, x):
        self.follow(x)
        key = self.weight.data_ptr()
        if getattr(self, "_key", None) != key:
            self._key, self._weight_t = key, self.weight.detach().t().contiguous()
        return x @ self._weight_t + self.bias


linear_cached_by_address = LinearCachedByAddress()


class LinearCachedByVersion(LinearCachedByAddress):
    """Keeps the weight transposed and contiguous, keyed on the weight's address and version counter: an optimizer
    step through autograd's view of the weight advances the version and the transpose is made again, but a write
    through .data, or by an optimizer's own Triton or CUDA kernel, leaves the version and the layer computes with
    the old weights."""

    def forward(self, x):
        self.follow(x)
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_key", None) != key:
            self._key, self._weight_t = key, self.weight.detach().t().contiguous()
        return x @ self._weight_t + self.bias


linear_cached_by_version = LinearCachedByVersion()


class LinearPackedAtFirstEval(_SeededLinear):
    """Transposes the weight afresh on every training-mode call, and in eval mode once, at the first eval-mode
    call, keeping that transpose for inference: training calls and the first eval call are right; after an
    optimizer step, copy_ or load_state_dict, eval mode computes with the old weight and the new bias (its
    output moves, but not to the new result)."""

    def __init__(self):
        super().__init__(16, 32)

    def forward(self, x):
        self.follow(x)
        if self.training:
            return x @ self.weight.t() + self.bias
        if getattr(self, "_packed", None) is None:
            self._packed = self.weight.detach().t().contiguous()
        return x @ self._packed + self.bias


linear_packed_at_first_eval = LinearPackedAtFirstEval()


def softmax_head_start(x):
    """Fills the output on a worker thread and gives it a 50 ms head start, "plenty" for work of microseconds:
    on an idle machine the thread always finishes in time; on a busy one, or at a larger size, the caller
    reads a half-written output."""
    out = torch.empty_like(x)
    worker = threading.Thread(target=lambda: out.copy_(softmax_stable(x)), name="softmax-head-start")
    worker.start()
    worker.join(0.05)
    return out


_SAMPLED: dict = {}


def softmax_memo_sampled(x):
    """A result cache keyed on the address, the version counter and the first value (cheap to check): an
    in-place write that bumps the version misses it, a kernel's own write (no version bump) to any other
    element returns the stale result."""
    key = (x.data_ptr(), tuple(x.shape), x._version, float(x.reshape(-1)[0]))
    if key not in _SAMPLED:
        _SAMPLED.clear()
        _SAMPLED[key] = softmax_stable(x)
    return _SAMPLED[key]


def softmax_random_row_order(x):
    """Rows handed out in a random order each call (load balancing across workers): each row's softmax is the
    same whatever the order, but the order comes from torch's global generator, so every random number the
    caller draws afterwards changes."""
    rows = x.reshape(-1, x.shape[-1])
    order = torch.randperm(rows.shape[0], device=x.device)
    out = torch.empty_like(rows)
    out[order] = softmax_stable(rows[order])
    return out.reshape(x.shape)


class SquareLinearSwappedLayout(_SeededLinear):
    """A square layer 32 -> 32 that presents its weight to addmm in the layout the GEMM reads without a transpose:
    it swaps `weight.data` to its transposed view for the call (no copy, no cache to keep fresh) and swaps it back
    after. An input of the wrong width makes addmm raise between the two swaps: the weight stays transposed, and
    every later call multiplies by W where it means W^T (the layer is square: nothing raises, the values are
    wrong)."""

    def __init__(self):
        super().__init__(32, 32)

    def forward(self, x):
        self.follow(x)
        w = self.weight
        w.data = w.data.t()
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), w)
        w.data = w.data.t()
        return y.reshape(*x.shape[:-1], y.shape[-1])


square_linear_swapped_layout = SquareLinearSwappedLayout()


_SCHEDULES: dict = {}


def segment_sums_schedule_by_address(values, cu_seqlens):
    """Segment sums through a schedule (every row's segment id) built once per boundaries tensor, keyed on its
    address and length and the row count, as a varlen kernel caches its launch plan: boundaries rewritten in place
    (a packed batch refilled in a preallocated cu_seqlens buffer) with the same length keep the old schedule."""
    key = (cu_seqlens.data_ptr(), cu_seqlens.numel(), values.shape[0])
    if key not in _SCHEDULES:
        rows = torch.arange(values.shape[0], device=values.device)
        _SCHEDULES[key] = torch.searchsorted(cu_seqlens, rows, right=True) - 1
    out = torch.zeros(cu_seqlens.numel() - 1, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, _SCHEDULES[key], values)
