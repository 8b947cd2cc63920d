"""determinism, violating control: the result depends on the order partial sums arrive in."""

import os

import torch

SPLIT = 16
# The order blocks finish in: a generator of its own, seeded by the OS (not the caller's random stream, which a
# kernel may not draw from: the isolation gate's probe)
_ARRIVAL = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))


def rowsum_split_any_order(x):
    """Partial sums added in whatever order the blocks finish, as float atomicAdd does on a GPU: the
    rounding changes from call to call. Each result is within the oracle bound; no two need agree."""
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    blocks = list(torch.arange(x.shape[-1], device=x.device).split(SPLIT))
    for i in torch.randperm(len(blocks), generator=_ARRIVAL).tolist():
        total = total + x[..., blocks[i]].sum(dim=-1)
    return total


class _Autotuned:
    """An autotuner that returns the result of the first config it times: the first call sums in blocks of 7,
    every later call in the block size it picked. Each result is within the oracle bound; the first call's
    bits are not the later calls'."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        block = 7 if self.calls == 1 else SPLIT
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for part in torch.arange(x.shape[-1], device=x.device).split(block):
            total = total + x[..., part].sum(dim=-1)
        return total


rowsum_autotuned_first_call = _Autotuned()


class _TunedOneConfigACall:
    """An autotuner that times one config a call on its first three calls (blocks of SPLIT, 7 and 5) and then
    keeps the first one: every call from the fourth on sums as the first did, so only the second and third
    calls show that it computes otherwise while it tunes."""

    configs = (SPLIT, 7, 5)

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        block = self.configs[self.calls - 1] if self.calls <= len(self.configs) else self.configs[0]
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for part in torch.arange(x.shape[-1], device=x.device).split(block):
            total = total + x[..., part].sum(dim=-1)
        return total


rowsum_tuned_first_config_wins = _TunedOneConfigACall()


class _CommitsAfterWarmup:
    """Sums in blocks of SPLIT for its first 100 calls, then commits to blocks of 7 (a variant a tuner settles
    on after a warm-up count of calls): every result within the oracle bound, but from call 101 on not the bits
    its first calls gave on the same inputs."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        block = SPLIT if self.calls <= 100 else 7
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for part in torch.arange(x.shape[-1], device=x.device).split(block):
            total = total + x[..., part].sum(dim=-1)
        return total


rowsum_commits_after_warmup = _CommitsAfterWarmup()
