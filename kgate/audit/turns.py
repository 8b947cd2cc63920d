"""Turns on a device: at most N audit workers judge on one device at once, while more of them start.

With `kgate audit --prestart`, each device has twice as many workers as judging turns: a worker
starts (Python, torch, kgate, its CUDA context: seconds that the GPU would otherwise spend idle between
candidates) while others judge, then waits for a turn before it loads its candidate. A turn is an
exclusive POSIX lock (`lockf`) on one of N files: the kernel releases it when the worker exits, however
it exits (a crash, a kill at a limit), so a turn is never lost, and a child the worker forked does not
inherit it. Torch-free: the worker takes its turn before it imports anything of the user's.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

POLL_S = 0.05


def open_turns(path: str | Path, count: int) -> list[int]:
    """The descriptors of the `count` turn files in `path` (made where missing). The audit opens them in kgate's
    own process and hands them to the worker: a sandboxed worker cannot write the folder, so no candidate can
    remove or replace a turn file under its neighbours."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return [os.open(path / f"turn{i}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600) for i in range(count)]


def take(fds: list[int]) -> int:
    """Block until one of the turns whose descriptors are `fds` is free and take it; returns the descriptor
    that holds it (kept open for the life of the process: closing it, or exiting, gives the turn back). The
    others are closed."""
    fds = list(fds)
    try:
        while True:
            for fd in fds:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # held by another worker (EAGAIN or EACCES)
                    continue
                fds.remove(fd)
                return fd
            time.sleep(POLL_S)
    finally:
        for fd in fds:
            os.close(fd)
