"""Finding kgate's worker processes from a test (Linux /proc): did one start, is one left running?"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path


def worker_pids(module: str, match: Callable[[Path], bool]) -> list[int]:
    """Pids of processes running `python -m MODULE`, or of kgate's worker templates and what they forked (whose
    command line is the template's, kgate.forkserver), for which `match(/proc/PID)` holds; not the templates
    this test process holds itself (of runs it made in-process) nor what they forked."""
    from kgate import forkserver, procmem

    children = procmem.parents()
    own = {pid for t in list(forkserver._templates.values())
           for pid in (t.proc.pid, *procmem.descendants(t.proc.pid, children))}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in own:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (module.encode() in argv or b"kgate.forkserver" in argv) and match(proc):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def unsandboxed() -> Iterator[None]:
    """Workers started inside run without the sandbox (kgate.sandbox), for tests of something else whose
    kernels keep state in files between workers; the default is back afterwards."""
    from kgate import sandbox

    sandbox.select("none")
    try:
        yield
    finally:
        sandbox.select(None)
