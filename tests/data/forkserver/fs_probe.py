"""A worker module for tests/test_forkserver.py: each probe tries something a hostile job would (or a correct
one needs) and sends what it found as one `probe` event. Runs as kgate's workers do: `run_job(job)` in a
worker forked from a template, or `python -m fs_probe JOB.json` where workers start on their own."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PLACES = ("/tmp", "/var/tmp", "/dev/shm", "TMPDIR", "HOME", "WRITABLE")


def _places(job):
    out = {}
    for place in PLACES:
        folder = os.environ.get(place) if place in ("TMPDIR", "HOME") else place
        if place == "WRITABLE":
            folder = job.get("writable")
        if folder:
            out[place] = folder
    return out


def _error(call):
    try:
        call()
    except OSError as exc:
        return type(exc).__name__
    return None


def init_access():
    """What reaching into PID 1 (the job's init) gives: its descriptors, its environment, ptrace."""
    libc = ctypes.CDLL(None, use_errno=True)
    found = {"fd": None, "environ": _error(lambda: Path("/proc/1/environ").read_bytes())}
    for fd in os.listdir("/proc/1/fd") if os.access("/proc/1/fd", os.R_OK) else []:
        found["fd"] = found["fd"] or _error(lambda fd=fd: os.readlink(f"/proc/1/fd/{fd}"))
    found["ptrace"] = libc.ptrace(ctypes.c_long(16), ctypes.c_long(1), None, None)  # PTRACE_ATTACH
    return found


def see(job):
    """The processes this job can see, and what signalling others' gives."""
    child = subprocess.Popen(["sleep", "30"])
    own_child = _error(lambda: os.kill(child.pid, signal.SIGTERM))
    child.wait()
    return {"visible": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "own_child_signal": own_child,
            "signals": {str(pid): _error(lambda pid=pid: os.kill(pid, 0)) for pid in job.get("targets", [])},
            "init": init_access() if os.getpid() != 1 else None}


def files(job):
    """Writes a marker file in every writable place (`write`), and lists those places and the folder that
    holds the writable one."""
    found = {}
    for place, folder in _places(job).items():
        if job.get("write"):
            Path(folder, f"marker-{job['write']}").write_text(place)
        found[place] = sorted(os.listdir(folder))
    if job.get("writable"):
        found["WRITABLE_PARENT"] = sorted(os.listdir(os.path.dirname(job["writable"])))
    found["cwd_write"] = _error(lambda: Path("written-by-a-job").write_text("x"))
    found["dev_write"] = _error(lambda: Path("/dev/written-by-a-job").write_text("x"))
    return found


def privileges(job):
    libc = ctypes.CDLL(None, use_errno=True)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    unshare = libc.unshare(ctypes.c_int(0x00020000))  # CLONE_NEWNS
    mounted = libc.mount(b"tmpfs", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None)
    return {**{k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")},
            "unshare": unshare, "mount": mounted,
            "sysctl_write": _error(lambda: Path("/proc/sys/kernel/hostname").write_text("hostile")),
            "init": init_access()}


def daemon(job):
    """Leaves `sleep MARKER` running detached (double fork, setsid), as a daemon would."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", str(job["marker"])])
        os._exit(0)
    os.wait()
    return {"left": job["marker"]}


def child(job):
    """Starts a child and waits for it: nothing left behind."""
    subprocess.run(["sleep", "0.2"], check=True)
    return {"waited": True}


def environment(job):
    return {"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "sys_path": sys.path, "cmdline": Path("/proc/self/cmdline").read_bytes().decode(
        errors="replace").split("\0")}


def crash(job):
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(job):
    time.sleep(3600)


def hog(job):
    held = []
    while True:
        held.append(bytearray(64 * 2**20))
        time.sleep(0.01)


def run_job(job):
    channel = os.fdopen(job["event_fd"], "w", buffering=1)
    channel.write(json.dumps({"event": "started"}) + "\n")
    result = globals()[job["probe"]](job)
    channel.write(json.dumps({"event": "probe", "result": result}) + "\n")
    time.sleep(job.get("linger", 0))  # as a worker goes on with its next gate (kgate looks at its tree meanwhile)
    return 0


if __name__ == "__main__":
    sys.exit(run_job(json.loads(Path(sys.argv[1]).read_text())))
