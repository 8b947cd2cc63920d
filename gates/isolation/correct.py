"""isolation, correct control: computes from its inputs on every call, synchronously, into a fresh
plain tensor, touching nothing global. Also holds the reference and inputs factory."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 40), generator=gen, dtype=torch.float64) * 3
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.softmax(x, dim=-1)


def softmax_stable(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


def softmax_subnormals_flushed(x):
    """Skips subnormal inputs as the flush-to-zero control wants to, but explicitly, on its own tensor:
    the process's floating-point modes stay as the caller set them."""
    tiny = torch.finfo(x.dtype).tiny
    x = torch.where(x.abs() < tiny, torch.zeros_like(x), x)
    return softmax_stable(x)


def softmax_one_thread_restored(x):
    """Runs its small rows on one thread, as the thread-pinning control wants to, and gives the process its
    thread count back on the way out, also when the computation raises."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return softmax_stable(x)
    finally:
        torch.set_num_threads(threads)


def make_features(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Features (rows, 32) for the linear-layer controls."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (6, 32), generator=gen, dtype=torch.float64)
    return (x.to(dtype=dtype, device=device),)


class Linear(torch.nn.Module):
    """A linear layer 32 -> `out_features` (16 by default) with bias, its weights drawn from a fixed seed (kernel
    and reference alike)."""

    def __init__(self, out_features=16):
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        self.weight = torch.nn.Parameter(torch.randn(out_features, 32, generator=gen) / 32 ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(out_features, generator=gen) * 0.1)

    def follow(self, x):
        """Moves the layer to its input's device (the controls' weights are made on the CPU at import)."""
        if self.weight.device != x.device:
            self.to(x.device)

    def forward(self, x):
        self.follow(x)
        return torch.nn.functional.linear(x, self.weight, self.bias)


class LinearCachedTranspose(Linear):
    """Keeps the weight transposed and contiguous for the matmul, rebuilt whenever the weight changes: the
    key is its address and its version counter, which every in-place change through autograd's view of it (an
    optimizer step, copy_, load_state_dict) bumps, and the weight's values are compared with a copy kept
    beside the transpose (a write through .data, or by an optimizer's own CUDA kernel, leaves the version)."""

    def forward(self, x):
        self.follow(x)
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_key", None) != key or not torch.equal(self._weight, self.weight.detach()):
            self._key, self._weight = key, self.weight.detach().clone()
            self._weight_t = self._weight.t().contiguous()
        return x @ self._weight_t + self.bias


class SquareLinearSwappedLayout(Linear):
    """A square layer 32 -> 32 that presents its weight to addmm in the layout the GEMM reads without a transpose:
    it swaps `weight.data` to its transposed view for the call (no copy, no cache to keep fresh) and swaps it
    back in a finally block, so a call that raises (an input of the wrong width) leaves the weight as it was."""

    def __init__(self):
        super().__init__(out_features=32)

    def forward(self, x):
        self.follow(x)
        w = self.weight
        w.data = w.data.t()
        try:
            y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), w)
        finally:
            w.data = w.data.t()
        return y.reshape(*x.shape[:-1], y.shape[-1])


linear_reference = Linear()
square_linear_reference = Linear(out_features=32)
linear_cached_transpose = LinearCachedTranspose()
square_linear_swapped_layout = SquareLinearSwappedLayout()


def softmax_worker_joined(x):
    """Fills the output on a worker thread and waits until it is done, however long that takes."""
    import threading

    out = torch.empty_like(x)
    worker = threading.Thread(target=lambda: out.copy_(softmax_stable(x)), name="softmax-worker")
    worker.start()
    worker.join()
    return out


def make_sum_inputs(seed, shape=None, dtype=torch.float16, device="cpu"):
    """[1024, 0.0667 x 9] (every seed alike): the unversioned probe changes one element other than the first
    to -2x, so the sum moves by 0.2 (an ulp of 1024 is 1), across a rounding boundary of float16: the oracle
    rounded to the dtype moves from 1025 to 1024."""
    return (torch.tensor([1024.0] + [0.0667] * 9, dtype=dtype, device=device),)


def reference_sum(x):
    return x.sum()


def sum_rounded_toward_zero(x):
    """The sum in float32, rounded to the dtype toward zero where finite: within an ulp of the truth (inside
    the oracle bound), and the same 1024 before and after the probe's change. A result within the bound need
    not move with a one-ulp move of the rounded truth: not stale."""
    total = x.float().sum()
    out = total.to(x.dtype)
    away = torch.isfinite(out) & (out.float().abs() > total.abs())
    return torch.where(away, torch.nextafter(out, torch.zeros_like(out)), out)


_ORDER = torch.Generator().manual_seed(0)


def softmax_private_generator(x):
    """Rows handed out in a random order drawn from a generator of its own: the caller's random streams are
    left alone."""
    rows = x.reshape(-1, x.shape[-1])
    order = torch.randperm(rows.shape[0], generator=_ORDER).to(x.device)
    out = torch.empty_like(rows)
    out[order] = softmax_stable(rows[order])
    return out.reshape(x.shape)


_SCHEDULES: dict = {}


def segment_sums_schedule_by_value(values, cu_seqlens):
    """Segment sums through a schedule (every row's segment id) cached on the boundaries' values and the row
    count: refilled boundaries get a schedule of their own."""
    key = (tuple(cu_seqlens.tolist()), values.shape[0], str(values.device))
    if key not in _SCHEDULES:
        rows = torch.arange(values.shape[0], device=values.device)
        _SCHEDULES[key] = torch.searchsorted(cu_seqlens, rows, right=True) - 1
    out = torch.zeros(cu_seqlens.numel() - 1, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, _SCHEDULES[key], values)
