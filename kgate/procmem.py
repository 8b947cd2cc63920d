"""Processes as Linux reports them in /proc: a process's memory (its address space and resident set from
/proc/PID/statm, in bytes; 0 where it cannot be read, e.g. a process that has just exited, or not Linux), the
process tree below a worker and its memory, the members of a process session, and what a sandboxed worker
left detached.
Torch-free: a worker reads it before its memory limit applies."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator


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


def _stat(pid: int | str) -> tuple[str, list[bytes]] | None:
    """The name of a process and the fields of /proc/PID/stat after it (state, ppid, ...)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.find(b"(") + 1:stat.rfind(b")")].decode(errors="replace"), stat[stat.rfind(b")") + 2:].split()


def processes() -> Iterator[tuple[int, str, list[bytes]]]:
    """(pid, name, the fields of /proc/PID/stat after the name: state, ppid, pgrp, process session, ...) of
    every process /proc lists (none where there is no /proc)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if entry.isdigit() and (found := _stat(entry)) is not None:
            yield int(entry), found[0], found[1]


def _field(fields: list[bytes], index: int) -> int | None:
    try:
        return int(fields[index])
    except (ValueError, IndexError):
        return None


def parents() -> dict[int, list[int]]:
    """ppid -> pids, for every process /proc lists (one walk: give it to the functions below that take
    `children`, to ask several questions of one moment's process tree)."""
    children: dict[int, list[int]] = {}
    for pid, _, fields in processes():
        ppid = _field(fields, 1)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    return children


def session_members(sid: int) -> list[int]:
    """Pids whose process session (setsid) is `sid`."""
    return [pid for pid, _, fields in processes() if _field(fields, 3) == sid]


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below `pid` in the process tree (its children, theirs, ...)."""
    children = parents() if children is None else children
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return out


def proportional(pid: int | str) -> int:
    """The process's proportional set size (its resident pages, each shared page divided among the processes
    that share it), in bytes; 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_memory(pid: int, limit: int | None = None, children: dict[int, list[int]] | None = None,
                skip: Iterable[int] = ()) -> int:
    """The memory of `pid` and every process below it: their resident sets summed, or, where that sum passes
    `limit`, their proportional set sizes summed instead (processes forked from one parent share its pages,
    which the plain sum would count once per process). `skip`: processes of the tree not counted, those below
    them still are (kgate.forkserver's leader and init of a job, forks of the template that run none of the
    job's code)."""
    skipped = set(skip)
    tree = [p for p in [pid, *descendants(pid, children)] if p not in skipped]
    total = sum(resident(p) for p in tree)
    if limit is not None and total > limit and (len(tree) > 1 or skipped):
        total = sum(proportional(p) or resident(p) for p in tree)
    return total


def detached(sandbox_pid: int, children: dict[int, list[int]] | None = None) -> list[str]:
    """In a bubblewrap sandbox whose outer process is `sandbox_pid` (its child is the PID namespace's init,
    whose first child is the worker): the processes that init reaped as orphans, i.e. that something in the
    worker started and left running detached from it (a double fork, `setsid`), as "PID (name)". kgate sees
    this from outside, where the code under judgment cannot forge it."""
    children = parents() if children is None else children
    found = []
    for init in children.get(sandbox_pid, []):
        started = []
        for pid in children.get(init, []):
            stat = _stat(pid)
            if stat is not None and len(stat[1]) > 19:
                started.append((int(stat[1][19]), pid, stat[0]))  # starttime, in clock ticks after boot
        found += [f"{pid} ({name})" for _, pid, name in sorted(started)[1:]]  # the first is the worker
    return found


def machine_memory() -> int:
    """This machine's physical memory in bytes (0 where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
