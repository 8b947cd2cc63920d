"""isolation, CUDA controls: a matmul into a preallocated output on a side stream, with (correct) and
without (violating) making the caller's stream wait for it."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    n = (shape or (2048,))[0]
    a = torch.randn(n, n, generator=gen, dtype=torch.float64) / n ** 0.5
    b = torch.randn(n, n, generator=gen, dtype=torch.float64)
    return (a.to(dtype=dtype, device=device), b.to(dtype=dtype, device=device))


def reference(a, b):
    return a @ b


def _side_stream_matmul(a, b, join):
    current = torch.cuda.current_stream(a.device)
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    side = torch.cuda.Stream(device=a.device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        torch.matmul(a, b, out=out)
    if join:
        current.wait_stream(side)
    return out


def matmul_side_stream_joined(a, b):
    """Side stream, then `current_stream().wait_stream(side)` before returning."""
    return _side_stream_matmul(a, b, join=True)


def matmul_side_stream_unjoined(a, b):
    """Returns while the side stream is still writing `out`: a consumer on the caller's stream reads
    it too early (a device-wide synchronize, as in most tests, hides this)."""
    return _side_stream_matmul(a, b, join=False)
