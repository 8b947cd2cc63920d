"""A process's memory as Linux reports it in /proc/PID/statm: its address space and its resident set,
in bytes (0 where it cannot be read, e.g. a process that has just exited, or not Linux). Torch-free: a
worker reads it before its memory limit applies."""

from __future__ import annotations

import os


def _statm(pid: int | str, field: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def address_space(pid: int | str = "self") -> int:
    return _statm(pid, 0)


def resident(pid: int | str = "self") -> int:
    return _statm(pid, 1)
