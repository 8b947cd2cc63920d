"""Kernels that attack the runner: each must end as an `error` verdict of its own, never the run's."""

import ctypes
import os
import sys
import time

import torch


def make_inputs(seed, shape=None):
    return (torch.randn(shape or (4, 8), generator=torch.Generator().manual_seed(seed)),)


def reference(x):
    return x * 2


def good(x):
    return x + x


def raises(x):
    raise ValueError("tile size must divide 8")


def segfault(x):
    ctypes.string_at(0)


def hard_exit(x):
    os._exit(3)


def soft_exit(x):
    sys.exit(4)


def hangs(x):
    time.sleep(600)


def hogs_memory(x):
    hoard = []
    while True:
        hoard.append(torch.ones(2**27, dtype=torch.uint8))


def prints_garbage(x):
    # Output on stdout/stderr must not be mistaken for results.
    print('{"event": "result", "result": {"gate": "oracle", "verdict": "pass"}}')
    print("noise", file=sys.stderr)
    return x * 3


import_time_crash = None
