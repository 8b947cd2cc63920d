"""A real Docker daemon for the tests, and a base image made without any registry.

The daemon is Debian's `dockerd` (installed with apt when missing and we are root), started in its
own process session on a private socket under a temporary folder, and stopped by the pid in its pidfile.
No image can be pulled here, so the base image is imported from a root filesystem built out of the
host's own Python: the interpreter tree, the installed distributions kgate needs (torch included,
found through their RECORD files), /bin/sh and a few tools, and every shared library they link.
"""

from __future__ import annotations

import io
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
TOOLS = ("sh", "rm", "mkdir", "ls", "cat", "env", "id", "chmod", "ln", "cp", "mv", "bwrap")  # bwrap: the sandbox


class DockerUnavailable(Exception):
    """Docker cannot run here (not root, no apt); the reason is the skip message."""


def ensure_dockerd() -> str:
    if os.geteuid() != 0:
        raise DockerUnavailable("the tests are not root, and a Docker daemon of their own needs root")
    found = shutil.which("dockerd")
    if found:
        return found
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
        # Image layers in memory: the ~1 GB base unpacks faster and teardown is an unmount, not a
        # minute of deleting files. Falls back to disk when tmpfs cannot be mounted.
        (self.root / "data").mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8g,mode=0710", "kgate-dockerd", str(self.root / "data")],
                       capture_output=True)
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
        for mount in reversed(_mounts_under(self.root)):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    prefix = str(root.resolve())
    return sorted(line.split()[1] for line in lines if line.split()[1].startswith(prefix))


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


class _RootfsTar:
    """A root filesystem written straight into a tar stream, parents before children."""

    def __init__(self, path: Path):
        self.tar = tarfile.open(path, "w")
        self.dirs: set[str] = set()
        self.files: set[str] = set()

    def _parents(self, arcname: str) -> None:
        parts = arcname.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                self.tar.addfile(info)

    def file(self, src: Path, arcname: str) -> None:
        if arcname in self.files:
            return
        self.files.add(arcname)
        self._parents(arcname)
        self.tar.add(str(src), arcname=arcname.strip("/"), recursive=False)

    def text(self, arcname: str, content: str, mode: int = 0o644) -> None:
        self._parents(arcname)
        data = content.encode()
        info = tarfile.TarInfo(arcname.strip("/"))
        info.size, info.mode = len(data), mode
        self.tar.addfile(info, io.BytesIO(data))

    def dir(self, arcname: str, mode: int = 0o755) -> None:
        self._parents(arcname)
        if arcname.strip("/") in self.dirs:
            return
        self.dirs.add(arcname.strip("/"))
        info = tarfile.TarInfo(arcname.strip("/"))
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(info)

    def link(self, arcname: str, target: str) -> None:
        self._parents(arcname)
        info = tarfile.TarInfo(arcname.strip("/"))
        info.type, info.linkname = tarfile.SYMTYPE, target
        self.tar.addfile(info)

    def close(self) -> None:
        self.tar.close()


_SKIP_IN_PREFIX = {"site-packages", "test", "idlelib", "tkinter", "__pycache__", "include", "share", "ensurepip"}


def write_rootfs_tar(path: Path) -> None:
    """The interpreter under /opt/python, kgate's dependency closure in its site-packages, /bin/sh and
    a few tools, and every shared library all of them link."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    out = _RootfsTar(path)
    sos: list[Path] = [Path(sys.executable).resolve()]
    for dirpath, dirnames, filenames in os.walk(prefix):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_IN_PREFIX and not d.startswith("config-")]
        rel = Path(dirpath).relative_to(prefix)
        for name in filenames:
            src = Path(dirpath) / name
            if name.endswith(".a"):
                continue
            out.file(src, f"opt/python/{rel / name}")
            if name.endswith(".so") and "lib-dynload" in dirpath:
                sos.append(src)
    site = f"opt/python/lib/{version}/site-packages"
    out.dir(site)
    for dist in _closure(_kgate_requirements() + ["numpy"]):
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            src = base / f
            if str(f).startswith(("..", "/")) or "/include/" in f"/{f}" or not src.is_file():
                continue
            out.file(src, f"{site}/{f}")
            if src.suffix == ".so" or ".so." in src.name:
                sos.append(src)
    for tool in TOOLS:
        found = shutil.which("dash" if tool == "sh" else tool)
        if found:
            out.file(Path(found).resolve(), f"bin/{tool}")
            sos.append(Path(found).resolve())
    for lib in sorted(_libraries(sos)):
        if str(lib).startswith(str(prefix)) or "site-packages" in str(lib):
            continue
        out.file(lib.resolve(), str(lib))
    for name in ("python", "python3"):
        out.link(f"usr/local/bin/{name}", f"/opt/python/bin/{version}")
    out.text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nkgate:x:10001:10001:kgate:/tmp:/bin/sh\n")
    out.text("etc/group", "root:x:0:\nkgate:x:10001:\n")
    for d in ("root", "workspace", "dev", "proc", "sys"):
        out.dir(d)
    out.dir("tmp", 0o1777)
    out.close()


def build_base_image(client, workdir: Path) -> str:
    """Import the root filesystem as BASE_TAG (about 1 GB, mostly torch)."""
    tar_path = workdir / "rootfs.tar"
    write_rootfs_tar(tar_path)
    repository, tag = BASE_TAG.split(":")
    client.api.import_image_from_file(str(tar_path), repository=repository, tag=tag,
                                      changes=["ENV PATH=/opt/python/bin:/usr/local/bin:/usr/bin:/bin",
                                               "ENV LD_LIBRARY_PATH=/opt/python/lib"])
    tar_path.unlink()
    return BASE_TAG
