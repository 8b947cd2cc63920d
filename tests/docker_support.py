"""A real Docker daemon for the tests, and a base image made without any registry.

The daemon is Debian's `dockerd` (installed with apt when missing and we are root), started in its
own session on a private socket under a temporary folder, and stopped by the pid in its pidfile.
No image can be pulled here, so the base image is imported from a root filesystem built out of the
host's own Python: the interpreter tree, the installed distributions kgate needs (torch included,
found through their RECORD files), /bin/sh and a few tools, and every shared library they link.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

BASE_TAG = "kgate-test-base:py"
TOOLS = ("sh", "rm", "mkdir", "ls", "cat", "env", "id", "chmod", "ln", "cp", "mv")


class DockerUnavailable(Exception):
    """Docker cannot run here (not root, no apt); the reason is the skip message."""


def ensure_dockerd() -> str:
    found = shutil.which("dockerd")
    if found:
        return found
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd is not installed and the tests are not root, so they cannot apt-get it")
    if not shutil.which("apt-get"):
        raise DockerUnavailable("dockerd is not installed and there is no apt-get to install docker.io")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io"], check=True, env=env,
                   capture_output=True, timeout=900)
    found = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if not found:
        raise RuntimeError("apt-get installed docker.io but dockerd is not on PATH")
    return found


class Daemon:
    def __init__(self, root: Path):
        self.root = root
        self.socket = root / "docker.sock"
        self.pidfile = root / "docker.pid"
        self.host = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        dockerd = ensure_dockerd()
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "dockerd.log", "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [dockerd, "--storage-driver=overlay2", "--iptables=false", "--ip6tables=false", "--bridge=none",
             "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "-H", self.host, "--pidfile", str(self.pidfile)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        import docker

        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("dockerd exited at start:\n" + self.log_tail())
            try:
                docker.DockerClient(base_url=self.host).ping()
                return self
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("dockerd did not answer within 60 s:\n" + self.log_tail()) from None
                time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return (self.root / "dockerd.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.host, timeout=600)

    def stop(self) -> None:
        pid = None
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            pid = self.proc.pid if self.proc else None
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        netns = self.root / "exec" / "netns" / "default"
        if netns.exists():
            subprocess.run(["umount", str(netns)], capture_output=True)
        subprocess.run(["umount", "-R", str(self.root / "data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The base image.


def _closure(names: list[str]) -> list[metadata.Distribution]:
    """The installed distributions `names` need, with their dependencies (markers honoured)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _kgate_requirements() -> list[str]:
    import tomllib

    from tests.conftest import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r).name for r in project["dependencies"]] + ["setuptools", "pip"]


def _libraries(files: list[Path]) -> set[Path]:
    libs: set[Path] = set()
    for chunk in range(0, len(files), 200):
        proc = subprocess.run(["ldd", *map(str, files[chunk:chunk + 200])], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            parts = line.split()
            for part in parts:
                if part.startswith("/") and Path(part).exists():
                    libs.add(Path(part))
    return libs


def build_rootfs(rootfs: Path) -> None:
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dest = rootfs / "opt" / "python"
    shutil.copytree(prefix, dest, symlinks=True, ignore=lambda d, names: (
        ["site-packages", "test", "idlelib", "tkinter", "__pycache__"] if Path(d) == prefix / "lib" / version
        else ["include", "share"] if Path(d) == prefix else []))
    site = dest / "lib" / version / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    sos: list[Path] = [Path(sys.executable).resolve(), *(dest / "lib" / version / "lib-dynload").glob("*.so")]
    for dist in _closure(_kgate_requirements() + ["numpy"]):
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            src = base / f
            if not src.is_file() or str(f).startswith(("..", "/")) or "/include/" in f"/{f}":
                continue
            target = site / f
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            if src.suffix == ".so" or ".so." in src.name:
                sos.append(src)
    for tool in TOOLS:
        path = shutil.which("dash" if tool == "sh" else tool)
        if path:
            target = rootfs / "bin" / tool
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(path).resolve(), target)
            sos.append(Path(path).resolve())
    for lib in _libraries(sos):
        if str(lib).startswith(str(prefix)) or "site-packages" in str(lib):
            continue
        target = rootfs / str(lib).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copy2(lib.resolve(), target)
    bindir = rootfs / "usr" / "local" / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        (bindir / name).symlink_to(f"/opt/python/bin/{version}")
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nkgate:x:10001:10001:kgate:/tmp:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\nkgate:x:10001:\n")
    for d in ("tmp", "root", "workspace", "dev", "proc", "sys"):
        (rootfs / d).mkdir(exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)


def build_base_image(client, workdir: Path) -> str:
    """Import the root filesystem as BASE_TAG (about 1 GB, mostly torch)."""
    rootfs = workdir / "rootfs"
    build_rootfs(rootfs)
    tar_path = workdir / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(rootfs, arcname=".")
    shutil.rmtree(rootfs)
    repository, tag = BASE_TAG.split(":")
    client.api.import_image_from_file(str(tar_path), repository=repository, tag=tag,
                                      changes=["ENV PATH=/opt/python/bin:/usr/local/bin:/usr/bin:/bin",
                                               "ENV LD_LIBRARY_PATH=/opt/python/lib"])
    tar_path.unlink()
    return BASE_TAG
