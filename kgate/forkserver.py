"""Workers forked from a template: a process that has imported Python, torch and kgate's worker modules once
and forks a fresh child for each job, so that a worker starts in milliseconds instead of the seconds that
starting Python and importing torch cost.

The template (`Template`, one per worker module, view (the folders shown, whichever of them is the job's
working folder) and environment; up to MAX_TEMPLATES kept) runs no code under judgment. It imports torch
without touching CUDA and without running a torch operation (no CUDA context, no OpenMP threads: nothing
that a fork would break); each child makes its own CUDA context. With the sandbox (kgate.sandbox) the template runs inside bubblewrap with the very view a
worker gets, but in a user namespace of its own holding the capabilities it needs to make one more sandbox
per job (`sandbox.TEMPLATE_CAPS`; none over the host). For each job it forks:

- a leader, which makes new mount, PID, network, IPC, UTS and cgroup namespaces, mounts fresh, empty
  in-memory file systems over the temporary folders, /dev/shm, /dev/pts and the folder of all scratch
  folders (new ones: nothing a job leaves in them reaches the next job), shows again read-only the folders
  the worker reads that lie inside those, hides the credentials again, and binds this job's scratch folder
  and its writable folders (the folders that hold those, writable for the template, show the job its own
  folders only, read-only). It then waits for the job's init and reports how the worker ended;
- the job's init, PID 1 of the new PID namespace: it mounts a /proc of that namespace alone (with
  /proc/sys and the like read-only, as bubblewrap does), brings up the loopback interface, drops every
  capability (bounding, ambient, effective, permitted, inheritable), sets no_new_privs, and forks
- the worker, which starts a process session of its own, closes every descriptor but its own (its log, its
  event pipe, the descriptors the caller passes), takes the job's environment, working folder and argv, and
  runs the module's `run_job(job)`. When it ends the init ends, and with it, by the kernel, every process of
  the namespace: nothing a job starts outlives it, and no job sees another job's processes, files, sockets
  or scratch folder, or the template.

kgate supervises the job from outside as it supervises a worker it started itself (kgate.runner.supervise):
the leader's pid in kgate's own PID namespace comes with its first message (SCM_CREDENTIALS, translated by
the kernel), and the job's process tree, its memory, what it leaves detached (children of the init other
than the worker) and the kill of it all are read from /proc as for a bubblewrap worker.

Without the sandbox (`--sandbox none`, or auto where bubblewrap cannot run) the template runs unsandboxed,
dies with kgate (parent-death signal), and each job's leader starts a process session of its own with the
worker in it, which dies with the leader: a worker keeps what an unsandboxed worker has (its own
process session and process group, the parent-death signal, the limits, the environment's allow-list).

Where a template cannot be started or used (no user namespaces for it, a failed import, a mount refused),
that job, and every later one where the template could not start, is started the old way (its own
`python -m MODULE` under bubblewrap), and the run says why (`describe`). A template that dies is started
again. `KGATE_FORKSERVER=0` starts every worker the old way.
"""

from __future__ import annotations

import array
import atexit
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SWITCH_ENV = "KGATE_FORKSERVER"  # 0: every worker is a process of its own (`python -m MODULE JOB.json`)
# Variables a job may set otherwise than its template, read after the start (caches, scratch folders, the
# GPU a judge slot is pinned to: CUDA reads it when the job makes its context): other variables name another
# template, which imports torch under them.
PER_JOB_ENV = frozenset({"HOME", "TMPDIR", "XDG_CACHE_HOME", "KGATE_PRIVATE_DIR", "TORCH_EXTENSIONS_DIR",
                         "TRITON_CACHE_DIR", "CUDA_VISIBLE_DEVICES", "MAX_JOBS"})
# What the template imports before it serves (none of these imports Triton, touches CUDA or starts threads).
# The template imports the worker module too, and what that module lists in TEMPLATE_WARM.
WARM = ("torch", "kgate.gates", "kgate.inputs", "kgate.loading", "kgate.manifest", "kgate.subject",
        "kgate.oracle", "kgate.standard_test", "kgate.kernelbench", "kgate.backward", "kgate.faults",
        "kgate.shrink", "kgate.gates.contract", "kgate.gates.oracle", "kgate.gates.special_values",
        "kgate.gates.determinism", "kgate.gates.shapes", "kgate.gates.layouts", "kgate.gates.distributions",
        "kgate.gates.input_integrity", "kgate.gates.initialization", "kgate.gates.bounds",
        "kgate.gates.isolation", "kgate.gates.accumulation", "torch.utils._device")
MAX_TEMPLATES = 4  # templates kept at once (an idle one is ended to start another)
START_TIMEOUT_S = 120.0  # for a template to import torch and kgate (as long as a worker's load budget)
JOB_START_TIMEOUT_S = 30.0  # for a job's sandbox to be made
MAX_FDS = 200  # descriptors one job may pass (SCM_RIGHTS carries at most 253)


class TemplateError(Exception):
    """A template could not be started or could not start a job: the job starts the old way."""


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "no", "false", "off")


# ---------------------------------------------------------------------------------------------------------
# kgate's side

_lock = threading.Lock()
_templates: dict[tuple, Template] = {}


class _Spawner:
    """The one thread that starts every template process. A template dies with the thread that started it,
    not with kgate's process (bubblewrap's --die-with-parent and the unsandboxed template's own parent-death
    signal are both PR_SET_PDEATHSIG, which the kernel ties to the creating thread): started from a judge's
    thread, or a thread of a pool that ends with a kernel's gates, it was killed as that thread ended, and the
    next job paid for a new one (seconds each) although its template was kept. This thread lives as long as
    the process does."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[tuple[Any, dict[str, Any]]] = []
        self._thread: threading.Thread | None = None

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen:
        box: dict[str, Any] = {}
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="kgate-template-spawner", daemon=True)
                self._thread.start()
            self._queue.append(((command, kwargs), box))
            self._cond.notify_all()
            while "done" not in box:
                self._cond.wait()
        if "error" in box:
            raise box["error"]
        return box["proc"]

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                (command, kwargs), box = self._queue.pop(0)
            try:
                box["proc"] = subprocess.Popen(command, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                box["error"] = exc
            with self._cond:
                box["done"] = True
                self._cond.notify_all()


_spawner = _Spawner()
_failed: list[str] = []  # why templates could not be used (the last said first by describe)
_said: set[str] = set()


def describe(active: bool) -> str:
    """How this process starts its workers, for the sandbox's description in every report."""
    if not enabled():
        return f"each worker started on its own ({SWITCH_ENV}=0)"
    if _failed:
        return f"workers started one by one where the template failed: {_failed[-1]}"
    return "workers forked from a sandboxed template" if active else "workers forked from an unsandboxed template"


def _register() -> None:
    from kgate import sandbox

    if describe not in sandbox.STARTS:
        sandbox.STARTS[:] = [describe]


_register()


def _failure(reason: str) -> None:
    with _lock:
        _failed.append(reason)
        if reason not in _said:
            _said.add(reason)
            print(f"kgate: a worker template failed, so workers start one by one where it did: {reason}",
                  file=sys.stderr, flush=True)


class Job:
    """A job forked by a template, as kgate.runner.supervise watches it (Popen's poll, wait, returncode): `pid`
    is its leader's pid in this process's PID namespace, the root of the job's process tree."""

    def __init__(self, sock: socket.socket, pid: int, sandboxed: bool, template: Template, said: bytes = b""):
        self.sock, self.pid, self.sandboxed, self.template = sock, pid, sandboxed, template
        self.returncode: int | None = None
        self._buffer = said
        self._lines()

    def own(self, children: Mapping[int, list[int]]) -> list[int]:
        """kgate's own processes in the job's tree (the leader and, sandboxed, the init: forks of the template,
        whose shared pages are not the job's memory)."""
        return [self.pid, *(children.get(self.pid, []) if self.sandboxed else [])]

    def _read(self, timeout: float) -> None:
        if self.returncode is not None:
            return
        if not select.select([self.sock], [], [], max(0.0, timeout))[0]:
            return
        try:
            chunk = self.sock.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:  # the leader is gone without a word: killed (by kgate, or with the template)
            self._finish(-signal.SIGKILL)
            return
        self._buffer += chunk
        self._lines()

    def _lines(self) -> None:
        while b"\n" in self._buffer and self.returncode is None:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exit" in message:
                self._finish(int(message["exit"]))

    def _finish(self, code: int) -> None:
        self.returncode = code
        self.sock.close()
        self.template.done()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("worker template job", timeout or 0)
            self._read(min(left, 1.0))
        return self.returncode


class Template:
    """One template process and the socket kgate sends it jobs on."""

    def __init__(self, key: tuple, box: Any, module: str, cwd: Path, env: Mapping[str, str],
                 readable: Iterable[Path], parents: list[str]):
        from kgate import sandbox

        self.key, self.box = key, box
        self.sandboxed = bool(box.active)
        self.busy = 0
        self.used = time.monotonic()
        self.send_lock = threading.Lock()
        self.cell = sandbox.Cell(box)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = ours
        template_env = {k: v for k, v in env.items() if k not in PER_JOB_ENV}
        template_env.update({k: v for k, v in self.cell.env(env).items() if k in ("HOME", "TMPDIR", "XDG_CACHE_HOME")})
        temporary, shown, secret = sandbox.layout(cwd, env, readable)
        argv = sandbox.kgate_command("kgate.forkserver", str(theirs.fileno()))
        command = self.cell.command(argv, cwd=cwd, env=template_env, readable=readable, writable=parents,
                                    template=True)
        self.log = self.cell.root / "template.log"
        try:
            with open(self.log, "wb") as log:
                self.proc = _spawner.popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                           pass_fds=(theirs.fileno(),), start_new_session=True,
                                           env=template_env, cwd=str(cwd))
        except OSError as exc:
            ours.close()
            self.cell.remove()
            raise TemplateError(f"the template could not be started: {exc}") from None
        finally:
            theirs.close()
        config = {"module": module, "sandboxed": self.sandboxed, "temporary": temporary, "shown": shown,
                  "secret": secret, "run_root": str(sandbox.run_root()), "parents": parents,
                  "kgate": os.getpid()}
        try:
            self.control.send(json.dumps(config).encode())
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if select.select([self.control], [], [], 0.5)[0]:
                    said = self.control.recv(1 << 16)
                    if not said:
                        raise TemplateError(f"the template ended while starting: {self._log_tail()}")
                    answer = json.loads(said)
                    if "error" in answer:
                        raise TemplateError(f"the template could not start: {answer['error']}")
                    break
                if self.proc.poll() is not None:
                    raise TemplateError(f"the template exited with code {self.proc.returncode} while starting: "
                                        f"{self._log_tail()}")
                if time.monotonic() > deadline:
                    raise TemplateError(f"the template was not ready after {START_TIMEOUT_S:g} s")
        except (TemplateError, OSError, ValueError) as exc:
            self.close()
            raise TemplateError(str(exc)) from None

    def _log_tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return (lines[-1] if lines else "no output")[-500:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def done(self) -> None:
        with _lock:
            self.busy -= 1
            self.used = time.monotonic()

    def close(self) -> None:
        try:
            self.control.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.cell.remove()

    def start(self, module: str, job: dict[str, Any], *, cell: Any, cwd: Path, env: Mapping[str, str],
              writable: list[str], tmpfs_bytes: int | None, output: int, fds: Mapping[int, int],
              argv: list[str]) -> Job:
        """Fork one job: `job` is run by `module`'s run_job in a worker whose stdout and stderr are `output`,
        whose descriptors `fds` (number there -> descriptor here) are those of this process, and whose
        sys.argv is [the module's file, *argv] (as `python -m MODULE *argv` would have it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            targets = list(fds)
            passed = array.array("i", [theirs.fileno(), output, *(fds[t] for t in targets)])
            with self.send_lock:
                self.control.sendmsg([b"job"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, passed)])
            theirs.close()
            payload = {"module": module, "job": job, "env": dict(env), "cwd": str(cwd), "targets": targets,
                       "argv": argv,
                       "cell": str(cell.root), "writable": writable, "tmpfs_bytes": tmpfs_bytes}
            ours.sendall(json.dumps(payload).encode() + b"\n")
            pid, said = _started(ours)
        except (OSError, ValueError, TemplateError) as exc:
            ours.close()
            theirs.close()
            raise TemplateError(str(exc) or type(exc).__name__) from None
        return Job(ours, pid, self.sandboxed, self, said)


def _started(sock: socket.socket) -> tuple[int, bytes]:
    """The leader's pid, in this process's PID namespace (the kernel translates SCM_CREDENTIALS), once it says
    the job's sandbox is made, and what it said after that; TemplateError with its reason otherwise."""
    deadline = time.monotonic() + JOB_START_TIMEOUT_S
    data = b""
    pid = None
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise TemplateError(f"the job's sandbox was not made within {JOB_START_TIMEOUT_S:g} s")
        chunk, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("iII")))
        if not chunk:
            raise TemplateError("the template's leader ended before the job started")
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and pid is None:
                pid = struct.unpack("iII", value[:struct.calcsize("iII")])[0]
        data += chunk
    line, rest = data.split(b"\n", 1)
    message = json.loads(line)
    if "error" in message:
        raise TemplateError(f"the job's sandbox could not be made: {message['error']}")
    if not pid:
        raise TemplateError("the template's leader did not say who it is")
    return pid, rest


def _key(box: Any, module: str, cwd: Path, env: Mapping[str, str], readable: Iterable[Path],
         parents: list[str]) -> tuple:
    """What makes a template fit for a job: the sandbox, the worker module, the environment (less PER_JOB_ENV),
    the folders that hold the writable ones, and the view (sandbox.layout: the folders shown, each once, none
    inside another), not the working folder and readable folders as given. Jobs in other folders of one
    view share a template: a job's working folder is its own (the child changes to it) and never on sys.path
    (sandbox.kgate_command); an audit's candidates, each in its run's folder under the corpus, share one."""
    from kgate import sandbox

    fixed = tuple(sorted((k, v) for k, v in env.items() if k not in PER_JOB_ENV))
    _, shown, _ = sandbox.layout(cwd, env, readable)
    return (box.mode, box.bwrap, module, tuple(shown), fixed, tuple(parents))


def start(module: str, job: dict[str, Any], *, box: Any, cell: Any, cwd: Path, env: Mapping[str, str],
          readable: Iterable[Path] = (), writable: Iterable[Path] = (), tmpfs_bytes: int | None = None,
          output: int, fds: Mapping[int, int], argv: list[str] = ()) -> Job | None:
    """The job forked by a template fit for it (started, or started again once where it died); None where
    templates are switched off or none could be used (the reason is then recorded for `describe` and said
    once on stderr): the caller starts the job the old way."""
    if not enabled() or len(fds) > MAX_FDS:
        return None
    from kgate import sandbox

    readable = sorted({Path(p).resolve() for p in readable})
    places = sandbox._dedupe(writable)
    for path in places:
        Path(path).mkdir(parents=True, exist_ok=True)
    parents = sorted({str(Path(p).parent) for p in places})
    key = _key(box, module, cwd, env, readable, parents)
    for attempt in (1, 2):
        try:
            template = _template(key, box, module, cwd, env, readable, parents)
        except TemplateError as exc:
            _failure(str(exc))
            return None
        try:
            return template.start(module, job, cell=cell, cwd=cwd, env=env, writable=places,
                                  tmpfs_bytes=tmpfs_bytes, output=output, fds=fds, argv=list(argv))
        except TemplateError as exc:
            template.done()
            if template.alive() and attempt == 1 and "sandbox could not be made" in str(exc):
                _failure(str(exc))  # this job's own sandbox: the template stays for the next jobs
                return None
            with _lock:
                if _templates.get(key) is template:
                    del _templates[key]
            template.close()
            if attempt == 2:
                _failure(str(exc))
    return None


_broken: dict[tuple, str] = {}  # a key whose template could not start: why (not tried again in this process)


_starting: dict[tuple, threading.Lock] = {}  # one start at a time per key: jobs of -j N share one template


def _template(key: tuple, box: Any, module: str, cwd: Path, env: Mapping[str, str], readable: list[Path],
              parents: list[str]) -> Template:
    with _lock:
        starting = _starting.setdefault(key, threading.Lock())
    with starting:
        return _find_or_make(key, box, module, cwd, env, readable, parents)


def _find_or_make(key: tuple, box: Any, module: str, cwd: Path, env: Mapping[str, str], readable: list[Path],
                  parents: list[str]) -> Template:
    stale = []
    with _lock:
        if key in _broken:
            raise TemplateError(_broken[key])
        found = _templates.pop(key, None)
        if found is not None and found.alive():
            found.busy += 1
            _templates[key] = found
            return found
        stale += [found] if found is not None else []
        while len(_templates) >= MAX_TEMPLATES:
            idle = [t for t in _templates.values() if t.busy == 0]
            if not idle:
                break
            oldest = min(idle, key=lambda t: t.used)
            stale.append(_templates.pop(oldest.key))
    for old in stale:
        old.close()
    try:
        made = Template(key, box, module, cwd, env, readable, parents)
    except (TemplateError, OSError, ValueError, subprocess.SubprocessError) as exc:
        reason = str(exc) if isinstance(exc, TemplateError) else f"the template could not be started: {exc}"
        with _lock:
            _broken[key] = reason
        raise TemplateError(reason) from None
    with _lock:
        made.busy += 1
        _templates[key] = made
    return made


def close_all() -> None:
    with _lock:
        templates = list(_templates.values())
        _templates.clear()
    for template in templates:
        template.close()


atexit.register(close_all)


# ---------------------------------------------------------------------------------------------------------
# The template's side: everything below runs in the template and in the processes it forks.

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# What bubblewrap also makes read-only in a sandbox's /proc (knobs of the whole machine).
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")

_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _call(what: str, result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _b(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(f"mount {fstype or source} on {target}",
          _c().mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)))


def _prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _call(f"prctl {option}", _c().prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(arg3),
                                        ctypes.c_ulong(0), ctypes.c_ulong(0)))


def _readonly(path: str, writable: bool = False) -> None:
    """Remount the bind mount at `path` read-only (or writable), keeping the flags it has (the kernel refuses
    to drop nosuid, nodev or noexec from a mount it locked)."""
    flags = os.statvfs(path).f_flag
    keep = 0
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        if flags & st:
            keep |= ms
    _mount(None, path, None, MS_REMOUNT | MS_BIND | keep | (0 if writable else MS_RDONLY))


def _under(path: str, folders: Iterable[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _bind(fd: int, target: str, *, writable: bool) -> None:
    """Bind the file or folder open as `fd` (O_PATH, in this mount namespace) at `target`, made where missing."""
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.makedirs(target, exist_ok=True)
    elif not os.path.lexists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
    _readonly(target, writable)


def _tmpfs(path: str, size: int | None, *, readonly: bool = False) -> None:
    os.makedirs(path, exist_ok=True)
    data = "mode=0755" + (f",size={int(size)}" if size else "")
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | (MS_RDONLY if readonly else 0), data)


def _enclose(config: dict[str, Any], payload: dict[str, Any]) -> None:
    """In the job's leader: new namespaces, and the job's own view of the file system (see the module's
    docstring). Every source is opened before anything is mounted over it: binds come from those descriptors,
    all of them mounts of this mount namespace."""
    _call("unshare", _c().unshare(ctypes.c_int(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
                                               | CLONE_NEWUTS | CLONE_NEWCGROUP)))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the template or other jobs
    size = payload.get("tmpfs_bytes")
    run_root = config["run_root"]
    cell = payload["cell"]
    if os.path.dirname(cell) != run_root:
        raise OSError(f"{cell} is not a scratch folder of this run")
    writable = list(payload["writable"])
    if any(os.path.dirname(w) not in config["parents"] for w in writable):
        raise OSError(f"writable folders {writable} are not inside {config['parents']}")
    fresh = [*config["temporary"], "/dev/shm"]
    flags = os.O_PATH | os.O_CLOEXEC
    shown = []
    for path in config["shown"]:
        if _under(path, fresh):
            try:
                shown.append((path, os.open(path, flags)))
            except OSError:
                pass  # as bubblewrap's --ro-bind-try
    cell_fd = os.open(cell, flags | os.O_DIRECTORY)
    writable_fds = [(w, os.open(w, flags | os.O_DIRECTORY)) for w in writable]
    for path in fresh:
        _tmpfs(path, size)
    for path, fd in shown:
        _bind(fd, path, writable=False)
        os.close(fd)
    for path in config["secret"]:
        if _under(path, fresh) and os.path.lexists(path):
            if os.path.isdir(path):
                _tmpfs(path, None, readonly=True)
            else:
                _mount("/dev/null", path, None, MS_BIND)
                _readonly(path)
    _tmpfs(run_root, size)
    _bind(cell_fd, cell, writable=True)
    os.close(cell_fd)
    # The folders that hold the jobs' writable ones (an audit's build caches, one per candidate) show this
    # job's own folders only: an empty in-memory folder over each, read-only once they are bound in it.
    parents = [p for p in config["parents"] if not _under(p, [*fresh, run_root])]
    for parent in parents:
        _tmpfs(parent, 1 << 20)
    for path, fd in writable_fds:
        _bind(fd, path, writable=True)
        os.close(fd)
    for parent in parents:
        _readonly(parent)
    if os.path.isdir("/dev/pts"):
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def _drop_privileges() -> None:
    """Every capability gone (the bounding set first, which needs CAP_SETPCAP), and no way back (no_new_privs)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    _call("capset", _c().capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _loopback_up() -> None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, request))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 0x1))  # SIOCSIFFLAGS, IFF_UP


def _die_with_parent(parent: int) -> None:
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)


def _init(status: int, descriptors: list[int], payload: dict[str, Any]) -> None:
    """PID 1 of the job's namespace (see the module's docstring); writes "R" when the worker is about to
    start, then the worker's exit status, to `status`."""
    _die_with_parent(os.getppid())
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV)
    for name in PROC_COVERED:
        path = f"/proc/{name}"
        if os.path.lexists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _readonly(path)
    _loopback_up()
    _drop_privileges()
    _prctl(PR_SET_DUMPABLE, 0)  # the worker cannot trace the init, nor read its descriptors
    os.write(status, b"R\n")
    worker = os.fork()
    if worker == 0:
        os.close(status)
        _worker(descriptors, payload, sandboxed=True)
    for fd in descriptors:
        os.close(fd)
    os.closerange(3, status)
    os.closerange(status + 1, 1 << 20)
    while True:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if pid == worker:
            os.write(status, f"S {os.waitstatus_to_exitcode(code)}\n".encode())
            os._exit(0)


def _worker(descriptors: list[int], payload: dict[str, Any], *, sandboxed: bool) -> None:
    """The worker: its descriptors, environment, folder and argv as the job's, then the module's run_job."""
    code = 70
    try:
        _die_with_parent(os.getppid())
        if sandboxed:
            os.setsid()  # as bubblewrap's --new-session: no terminal of the caller's to type into
            _prctl(PR_SET_DUMPABLE, 1)
        output, passed = descriptors[0], descriptors[1:]
        targets = [int(t) for t in payload["targets"]]
        if any(t < 3 for t in targets):
            raise OSError(f"descriptor numbers {targets} collide with stdin, stdout or stderr")
        import fcntl

        high = max([*descriptors, *targets, 2]) + 1
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for fd in [output, *passed]]
        os.closerange(3, high)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(moved[0], 1)
        os.dup2(moved[0], 2)
        for target, fd in zip(targets, moved[1:], strict=True):
            os.dup2(fd, target, inheritable=True)
        keep = set(targets)
        for fd in range(3, max([*moved, null]) + 1):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.closerange(max([*moved, null, *targets]) + 1, 1 << 20)
        os.environ.clear()
        os.environ.update(payload["env"])
        os.chdir(payload["cwd"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import importlib
        import random
        import tempfile

        tempfile.tempdir = None  # TMPDIR is read again: the job's own
        random.seed()  # not the template's sequence
        module = importlib.import_module(payload["module"])
        sys.argv = [getattr(module, "__file__", None) or payload["module"], *payload.get("argv", [])]
        try:
            code = module.run_job(payload["job"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends `python -m MODULE`
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - closed or broken by the job: nothing left to say
                pass
        os._exit(code if isinstance(code, int) else 1)  # no teardown, as kgate's workers end


def _say(sock: socket.socket, message: dict[str, Any]) -> None:
    credentials = struct.pack("iII", os.getpid(), os.getuid(), os.getgid())
    sock.sendmsg([json.dumps(message).encode() + b"\n"],
                 [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, credentials)])


def _leader(descriptors: list[int], config: dict[str, Any], template: int) -> None:
    """A job's leader (see the module's docstring)."""
    sock = socket.socket(fileno=descriptors[0])
    descriptors = descriptors[1:]
    try:
        os.setsid()
        _die_with_parent(template)
        with sock.makefile("rb") as f:
            payload = json.loads(f.readline())
        if config["sandboxed"]:
            _enclose(config, payload)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            sock.close()
            os.close(read)
            if config["sandboxed"]:
                try:
                    _init(write, descriptors, payload)
                except BaseException as exc:  # noqa: BLE001 - said to kgate by the leader
                    os.write(write, f"E {type(exc).__name__}: {exc}\n".encode()[:4000])
                os._exit(70)
            os.close(write)
            _worker(descriptors, payload, sandboxed=False)
        os.close(write)
        for fd in descriptors:
            os.close(fd)
        with os.fdopen(read, "rb") as status:
            if config["sandboxed"]:
                ready = status.readline().decode(errors="replace").strip()
                if not ready.startswith("R"):
                    os.waitpid(child, 0)
                    _say(sock, {"error": ready[2:] or "the job's init ended before its worker started"})
                    os._exit(0)
            _say(sock, {"running": True})
            line = status.readline().decode(errors="replace").strip() if config["sandboxed"] else ""
            _, waited = os.waitpid(child, 0)
        code = int(line[2:]) if line.startswith("S ") else os.waitstatus_to_exitcode(waited)
        sock.sendall(json.dumps({"exit": code}).encode() + b"\n")
    except BaseException as exc:  # noqa: BLE001 - the job did not start: kgate starts it the old way
        try:
            _say(sock, {"error": f"{type(exc).__name__}: {exc}"[:4000]})
        except OSError:
            pass
    os._exit(0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(control: socket.socket, config: dict[str, Any]) -> int:
    """The template's loop: a job's descriptors in, a leader forked for it; until kgate closes the socket."""
    template = os.getpid()
    while True:
        ready = select.select([control], [], [], 0.5)[0]
        _reap()
        if not ready:
            continue
        try:
            _, ancillary, flags, _ = control.recvmsg(16, socket.CMSG_SPACE(4 * (MAX_FDS + 2)))
        except InterruptedError:
            continue
        descriptors = [fd for level, kind, data in ancillary
                       if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                       for fd in array.array("i", data[:len(data) - len(data) % 4])]
        if not ancillary and not descriptors:
            return 0  # kgate closed the socket: the template ends
        if flags & socket.MSG_CTRUNC or len(descriptors) < 2:
            for fd in descriptors:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                _leader(descriptors, config, template)
            finally:
                os._exit(70)
        for fd in descriptors:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(argv[0]))
    config = json.loads(control.recv(1 << 20))
    try:
        if not config["sandboxed"]:
            _die_with_parent(int(config["kgate"]))  # (sandboxed: bubblewrap's --die-with-parent)
        import importlib

        for name in (*WARM, config["module"]):
            importlib.import_module(name)
        for name in getattr(sys.modules[config["module"]], "TEMPLATE_WARM", ()):
            importlib.import_module(name)
        if not callable(getattr(sys.modules[config["module"]], "run_job", None)):
            raise TemplateError(f"{config['module']} has no run_job(job)")
        if "triton" in sys.modules:
            raise TemplateError("Triton was imported before a job chose its interpreter")
    except BaseException as exc:  # noqa: BLE001 - said to kgate, which starts workers the old way
        control.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    control.send(json.dumps({"ready": True}).encode())
    return serve(control, config)


if __name__ == "__main__":
    sys.exit(main())
