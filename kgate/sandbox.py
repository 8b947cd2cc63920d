"""The sandbox every worker runs in, so that the code under judgment reaches nothing but its own result.

kgate does not build its own: it runs each worker under bubblewrap (`bwrap`, Linux namespaces; Debian and
Ubuntu package `bubblewrap`), as root or as an unprivileged user. A sandboxed worker

- sees only its own processes (a PID namespace: no other worker's `/proc/PID/fd`, no parent's `environ`);
- has no network (a network namespace with loopback only), no System V IPC, no hostname of the host's;
- sees the file system read-only, but for its own scratch folder (HOME and TMPDIR point into it) and the
  folders its caller names writable (an audit candidate's own build cache); other workers' scratch
  folders, `/tmp`, `/run` (the sockets of docker, containerd, dbus), the caller's credentials (`~/.ssh`,
  `~/.docker`, a git checkout's `.git` with the token `actions/checkout` may leave in it, the runner's own
  files) are hidden;
- runs without capabilities (as root too) and in a process session of its own (no terminal to type into);
- dies with everything it started: when its main process ends, however it ends, bubblewrap's init is
  killed and with it every process of the namespace (a double-forked, `setsid` daemon too); when kgate
  itself dies, even by `kill -9`, so do they (`--die-with-parent`).

The result pipe, passed as a file descriptor, is its only way out; nothing outside can reach it.

Where bubblewrap is missing or cannot make namespaces (no user namespaces; a container whose seccomp
profile refuses them), `--sandbox auto` (the default) runs workers without it and says so, with the
reason, at the start of the run and in every report; `--sandbox require` stops with exit 2;
`--sandbox none` does not try. Without the sandbox a worker is still its own process, under its limits,
with the environment's allow-list, its own scratch folder and the kill of its process group, but a
hostile kernel there can reach other workers, the reports and the caller's files.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kgate.errors import InfrastructureError, UsageError

MODES = ("auto", "require", "none")
MODE_ENV = "KGATE_SANDBOX"  # the default for --sandbox
PASS_ENV = "KGATE_PASS_ENV"  # names of further variables a worker may see, comma-separated
SANDBOXED_ENV = "KGATE_SANDBOXED"  # set to 1 in a sandboxed worker (which then needs no parent-death signal)

# What of the caller's environment reaches a worker: the names a kernel's toolchain reads, nothing else.
ENV_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
    "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH",
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "MAX_JOBS", "NVCC_FLAGS", "NVCC_APPEND_FLAGS",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ROCM_PATH", "ROCM_HOME", "HIP_PATH",
})
ENV_PREFIXES = ("LC_", "CUDA_", "CUDNN_", "CUBLAS_", "CUBLASLT_", "CUFFT_", "NVIDIA_", "TRITON_", "TORCH_",
                "PYTORCH_", "TORCHINDUCTOR_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "KGATE_")
# Names that look like a secret are dropped even where a prefix above admits them (TORCH_HUB_TOKEN).
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|(^|_)(API_?)?KEYS?($|_)|AUTH|COOKIE", re.IGNORECASE)

# Where credentials usually live, relative to a home folder: hidden from sandboxed workers.
HOME_SECRETS = (".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".config/gh", ".docker", ".kube",
                ".netrc", ".git-credentials", ".pypirc", ".npmrc", ".config/git/credentials")
# The GitHub runner's own files, in the folder above its `_work`: its registration and keys.
RUNNER_SECRETS = (".credentials", ".credentials_rsaparams", ".runner", ".env", "_diag")
# Device nodes a GPU needs (NVIDIA, and AMD's for ROCm builds of torch).
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
             "/dev/nvidia-caps", "/dev/kfd", "/dev/dri")
PROBE_TIMEOUT_S = 20.0
# What a worker template (kgate.forkserver) keeps of the capabilities, inside its own user namespace: to make
# each job's namespaces and mounts (SYS_ADMIN), to take every capability from the job (SETPCAP: the bounding
# set), and to bring up the job's loopback interface (NET_ADMIN). No job process keeps any.
TEMPLATE_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_NET_ADMIN")


def allowed_env(env: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> dict[str, str]:
    """The part of `env` (default: this process's) a worker may see: ENV_NAMES, names with an ENV_PREFIXES
    prefix, and the names in `extra` or in $KGATE_PASS_ENV; never a name that looks like a secret unless it
    is named there explicitly. Tokens, cloud keys and everything else of the caller's stay out."""
    env = dict(os.environ if env is None else env)
    named = {n.strip() for n in [*extra, *os.environ.get(PASS_ENV, "").split(",")] if n.strip()}
    kept = {}
    for name, value in env.items():
        if name in named or ((name in ENV_NAMES or name.startswith(ENV_PREFIXES)) and not SECRET_NAME.search(name)):
            kept[name] = value
    return kept


@dataclass(frozen=True)
class Sandbox:
    """How workers are confined in this process: `bwrap` is bubblewrap's path, or None (no sandbox:
    `detail` says why); `detail` names the tool otherwise."""

    mode: str
    bwrap: str | None
    detail: str

    @property
    def active(self) -> bool:
        return self.bwrap is not None

    def describe(self) -> str:
        """The sandbox, and how workers start in it (kgate.forkserver, which registers `STARTS`)."""
        starts = f"; {STARTS[0](self.active)}" if STARTS else ""
        return (self.detail if self.active else f"none ({self.detail})") + starts


# How this process starts its workers, for `Sandbox.describe`: set by kgate.forkserver when it is imported (it
# builds on this module, which therefore does not import it).
STARTS: list[Callable[[bool], str]] = []

_chosen: dict[str, Sandbox] = {}
_selected: list[str] = []  # the mode a command chose (select), for every worker this process starts


def select(mode: str | None) -> Sandbox:
    """Choose the sandbox of every worker this process starts from now on (a command's --sandbox; None: the
    default, $KGATE_SANDBOX or auto, whatever an earlier command chose)."""
    box = choose(mode or os.environ.get(MODE_ENV) or "auto")
    _selected[:] = [box.mode]
    return box


def choose(mode: str | None = None) -> Sandbox:
    """The sandbox for `mode` (default: the one `select` chose, else $KGATE_SANDBOX, else auto), probed once
    per process: bubblewrap is run once with the very flags every worker gets. `require` without a working
    sandbox is an infrastructure error (exit 2, nothing judged)."""
    mode = mode or (_selected[0] if _selected else None) or os.environ.get(MODE_ENV) or "auto"
    if mode not in MODES:
        raise UsageError(f"--sandbox {mode}: use one of {', '.join(MODES)}")
    if mode not in _chosen:
        if mode == "none":
            _chosen[mode] = Sandbox(mode, None, "--sandbox none")
        else:
            bwrap, detail = _probe()
            if bwrap is None and mode == "require":
                raise InfrastructureError(f"--sandbox require: no sandbox can be made here: {detail}. Install "
                                          "bubblewrap (apt-get install bubblewrap) on a host that allows user "
                                          "namespaces, or run with --sandbox auto to judge unsandboxed")
            _chosen[mode] = Sandbox(mode, bwrap, detail)
    return _chosen[mode]


def _probe() -> tuple[str | None, str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed"
    cell = Cell(Sandbox("auto", bwrap, "probe"))
    try:
        env = cell.env({})
        done = subprocess.run(cell.command(["/bin/sh", "-c", "exit 0"], cwd=Path("/"), env=env), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"bubblewrap could not start: {exc}"
    finally:
        cell.remove()
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return None, f"bubblewrap cannot create namespaces here: {said}"
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    return bwrap, (version.stdout.strip() or "bubblewrap")


_PROCESS_FOLDERS: dict[str, Path] = {}


def process_folder(prefix: str) -> Path:
    """A folder of this kgate process's own under the temporary folder, one per `prefix` (0700, removed at exit)."""
    if prefix not in _PROCESS_FOLDERS:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        _PROCESS_FOLDERS[prefix] = root
        atexit.register(shutil.rmtree, root, True)
    return _PROCESS_FOLDERS[prefix]


def run_root() -> Path:
    """This kgate process's folder of worker scratch folders: hidden from every sandboxed worker but for its own
    folder inside it."""
    return process_folder("kgate-run-")


class Cell:
    """One worker's scratch folder, its environment and its command, sandboxed or not. The folder holds
    `home/` (HOME, the caches of Triton and torch's extensions unless the caller names others) and `tmp/`
    (TMPDIR); it is removed by `remove()`."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.root = Path(tempfile.mkdtemp(prefix="worker-", dir=run_root()))
        self.home = self.root / "home"
        self.tmp = self.root / "tmp"
        self.home.mkdir()
        self.tmp.mkdir()

    def env(self, base: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> dict[str, str]:
        """The worker's environment: the allow-list of `base` (default this process's) and the names in `extra`,
        then kgate's own settings and its scratch folder as HOME and TMPDIR."""
        env = allowed_env(base, extra)
        env.update(HOME=str(self.home), TMPDIR=str(self.tmp), XDG_CACHE_HOME=str(self.home / ".cache"),
                   PYTHONUNBUFFERED="1")
        if self.sandbox.active:
            env[SANDBOXED_ENV] = "1"
        else:
            env.pop(SANDBOXED_ENV, None)
        return env

    def command(self, argv: list[str], *, cwd: Path, env: Mapping[str, str], readable: Iterable[Path] = (),
                writable: Iterable[Path] = (), tmpfs_bytes: int | None = None, template: bool = False) -> list[str]:
        """`argv` as the worker's command: under bubblewrap when the sandbox is active, else as it is (the
        caller starts it in `cwd`). `readable`: folders to show read-only even where they lie in a hidden
        place (the manifest's, the kernels', kgate's and Python's own; /tmp is hidden); `writable`: folders
        the worker may write besides its scratch folder; `tmpfs_bytes` caps the in-memory /tmp and /dev/shm.
        `env` is the worker's environment: the folders its PYTHONPATH names are shown too.

        With `template`, the command of a worker template (kgate.forkserver), which runs no code under
        judgment but makes a sandbox of its own for each job it forks: the same view, but with the
        capabilities to make namespaces and mounts (inside a user namespace of its own: none over the host),
        the folder of all scratch folders and the `writable` folders (there: the folders that hold the jobs'
        writable ones) shown writable for it to bind each job's own, and every in-memory file system it shares
        with its jobs read-only (the job gets fresh ones)."""
        if not self.sandbox.active:
            return list(argv)
        size = ["--size", str(int(tmpfs_bytes))] if tmpfs_bytes else []
        caps = ["--unshare-user", "--cap-drop", "ALL", *[a for c in TEMPLATE_CAPS for a in ("--cap-add", c)]] \
            if template else ["--cap-drop", "ALL"]
        args = [self.sandbox.bwrap or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                *caps, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        for node in _gpu_nodes():
            args += ["--dev-bind", node, node]
        args += [*size, "--tmpfs", "/dev/shm"]
        if template:
            args += ["--remount-ro", "/dev"]
        temporary, shown, secret = layout(cwd, env, readable)
        for path in temporary:
            args += [*size, "--tmpfs", path]
        for path in shown:
            args += ["--ro-bind-try", path, path]
        for path in secret:  # after the folders shown again: none of them shows a secret
            if os.path.isdir(path):
                args += ["--tmpfs", path, *(["--remount-ro", path] if template else [])]
            else:
                args += ["--ro-bind", "/dev/null", path]
        root = str(run_root())
        args += ["--bind", root, root] if template else ["--tmpfs", root, "--bind", str(self.root), str(self.root)]
        for path in _dedupe(writable):
            Path(path).mkdir(parents=True, exist_ok=True)
            args += ["--bind", path, path]
        return [*args, "--chdir", str(cwd), "--", *argv]

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def layout(cwd: Path, env: Mapping[str, str], readable: Iterable[Path] = ()) -> tuple[list[str], list[str], list[str]]:
    """What a sandboxed worker's view is made of, in the order it is made: (the temporary folders, each an
    empty in-memory one; the folders shown read-only again, even inside those: kgate's and Python's own,
    the PYTHONPATH of `env`, `cwd` and `readable`; the credentials hidden, after those)."""
    temporary, secret = hidden_paths()
    python_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    shown = [p for p in _dedupe([*_own_paths(), *python_path, cwd, *readable]) if p != "/"]
    return temporary, shown, secret


def _dedupe(paths: Iterable[Path | str]) -> list[str]:
    """The paths resolved, each once, without those inside another one listed (its mount shows them)."""
    resolved = sorted(set(str(Path(p).resolve()) for p in paths))
    kept: list[str] = []
    for path in resolved:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _gpu_nodes() -> list[str]:
    nodes = [p for p in GPU_NODES if os.path.exists(p)]
    try:
        nodes += sorted(f"/dev/{n}" for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n))
    except OSError:
        pass
    return nodes


def _own_paths() -> list[str]:
    """What a worker needs to read wherever it lies (under /tmp in a fresh CI clone): Python, the venv,
    kgate itself and every folder on sys.path."""
    import kgate

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).parent),
             str(Path(kgate.__file__).resolve().parent.parent)}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted(p for p in paths if os.path.exists(p))


def hidden_paths() -> tuple[list[str], list[str]]:
    """What a sandboxed worker does not see: (temporary and runtime folders, where other workers' files and
    the sockets of docker and dbus live; credentials: those in the home folders, the checkout's `.git`, which
    may hold the token `actions/checkout` left in its config, and the GitHub runner's own files). Only paths
    that exist are listed; what the worker needs is shown again read-only (Cell.command)."""
    temporary = _existing(["/tmp", "/var/tmp", "/run", "/var/run", tempfile.gettempdir()])
    homes = {os.path.expanduser("~"), os.environ.get("HOME", "")}
    secret = [os.path.join(h, s) for h in homes if h for s in HOME_SECRETS]
    workspace = os.environ.get("RUNNER_WORKSPACE")
    if workspace:
        runner_root = Path(workspace).resolve().parent.parent
        secret += [str(runner_root / s) for s in RUNNER_SECRETS]
    secret += [os.environ.get("RUNNER_TEMP", ""), *map(str, _git_dirs())]
    return temporary, _existing(secret)


def _existing(places: list[str]) -> list[str]:
    found = [str(Path(p).resolve()) for p in places if p and os.path.lexists(p) and not os.path.islink(p)]
    return list(dict.fromkeys(found))


def _git_dirs() -> list[Path]:
    """The `.git` folders above the current folder (the checkout kgate runs in)."""
    out = []
    here = Path.cwd().resolve()
    for folder in [here, *here.parents]:
        if (folder / ".git").is_dir():
            out.append(folder / ".git")
    return out


# `python -m M` puts the working folder first on sys.path, and workers run in the kernels' folder: a
# `kgate/` package there (a pull request can add one) would stand in for kgate and report what it likes.
# This starts M with that entry removed (-P on Python 3.11+; on 3.10 the first statement removes it);
# the kernels' folders are added later, by kgate.loading, once kgate itself is imported. Nothing may be
# imported before the entry is gone: `sys` is built in, but `import runpy` first would load runpy.py,
# warnings.py, types.py ... from the working folder on Python 3.10 and 3.12 (where they are not frozen).
_DROP_PATH0 = "import sys\nif sys.path[:1] == ['']:\n    del sys.path[0]\n"
_NO_PATH0 = ["-P"] if sys.version_info >= (3, 11) else []


def python_command(code: str, *args: str, python: str | None = None) -> list[str]:
    """`python -c code args` with the working folder never on sys.path (`python`: another interpreter than
    this one, for tests)."""
    flags = _NO_PATH0 if python is None else []
    return [python or sys.executable, *flags, "-c", _DROP_PATH0 + code, *args]


def kgate_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """The command that runs kgate's `module` as `python -m module args`, but never from the working folder."""
    return python_command("import runpy\nrunpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)",
                          module, *args, python=python)
