"""`kgate run --container IMAGE`: run the gates inside a container, through the docker SDK.

The kernels are untrusted code, so the container gets: no network, the workspace (the current
folder) mounted read-only at /workspace with its .git hidden under an empty folder (actions/checkout
may leave the job's token in .git/config), only the output folder writable (at /kgate-out), a
read-only root filesystem with a private /tmp, no capabilities, no new privileges, a non-root user,
memory, process-count and wall-clock limits, none of the host's environment (so no token), and the
GPUs through a device request. Its logs are streamed as they come and it is removed afterwards.

The container writes the JSON report; the host rewrites its paths back to the host's, and writes the
JUnit XML and `--json` copy from it. Annotations, summary and comment are made later, on the host.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from kgate.errors import InfrastructureError, UsageError
from kgate.manifest import parse_memory

WORKSPACE = "/workspace"
OUT = "/kgate-out"
NON_ROOT = "10001:10001"
NO_GPU_RUNTIME = 'could not select device driver ""'


def _docker():
    import docker

    return docker


def gpu_request(gpus: str, device: str | None):
    """The device request for `--gpus` (all | none | N | id,id,...); None when no GPU is wanted."""
    docker = _docker()
    value = (gpus or "all").strip().lower()
    if device == "cpu" or value in ("none", "0", ""):
        return None
    if value == "all":
        return docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])
    if value.isdigit():
        return docker.types.DeviceRequest(count=int(value), capabilities=[["gpu"]])
    ids = [v.strip() for v in value.split(",") if v.strip()]
    if not ids or not all(i.isdigit() or i.startswith("gpu-") for i in ids):
        raise UsageError(f"--gpus {gpus}: use all, none, a count such as 2, or device ids such as 0,1")
    return docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])


def sandbox_options(args: argparse.Namespace) -> list[str]:
    """Docker security options that let kgate inside the container sandbox each worker (kgate.sandbox): Docker's
    default seccomp profile refuses the user namespaces bubblewrap makes (its masked /proc paths, which keep it
    from mounting a /proc of the worker's own, are cleared by _create). The container keeps everything else (non-root, no
    capabilities, no new privileges, a read-only root, no network); with --sandbox none it keeps Docker's
    seccomp profile and masks too, and all the kernels of the run share it unconfined."""
    return [] if _sandbox_mode(args) == "none" else ["seccomp=unconfined"]


def _sandbox_mode(args: argparse.Namespace) -> str:
    return getattr(args, "sandbox", None) or os.environ.get("KGATE_SANDBOX") or "auto"


HOST_KEYS = ("network_mode", "read_only", "tmpfs", "cap_drop", "security_opt", "pids_limit", "mem_limit",
             "shm_size", "device_requests")


def _create(client: Any, config: dict[str, Any], unmask: bool) -> Any:
    """The container `config` describes (containers.run's arguments), made through the low-level API, which
    alone can clear Docker's masked and read-only /proc paths (`unmask`: what `--security-opt
    systempaths=unconfined` does in the CLI, which daemons before API 1.42 do not take as a security option)."""
    host = client.api.create_host_config(binds=config["volumes"], **{k: config[k] for k in HOST_KEYS})
    if unmask:
        host["MaskedPaths"], host["ReadonlyPaths"] = [], []
    created = client.api.create_container(
        config["image"], command=config["command"], user=config["user"], working_dir=config["working_dir"],
        environment=config["environment"], labels=config["labels"], host_config=host,
        volumes=[v["bind"] for v in config["volumes"].values()])
    return client.containers.get(created["Id"])


def container_command(args: argparse.Namespace, manifest_in_container: str, changed: str | None) -> list[str]:
    """The `kgate run` the container executes: the user's selection, our output folder."""
    cmd = ["run", manifest_in_container, "--out", OUT, "--json", f"{OUT}/report.json"]
    if args.select:
        cmd += ["-k", args.select]
    for flag, values in (("--gate", args.gate), ("--seed", args.seed), ("--dtype", args.dtype),
                         ("--shape", args.shape)):
        for v in values or []:
            cmd += [flag, str(v)]
    for flag, value in (("--device", args.device), ("--timeout", args.timeout), ("--memory", args.memory)):
        if value is not None:
            cmd += [flag, str(value)]
    if getattr(args, "jobs", 1) != 1:
        cmd += ["--jobs", str(args.jobs)]
    if changed:
        cmd += ["--changed", changed]
    if getattr(args, "resume", False):  # --out is mounted at OUT: its results.jsonl is the one kept
        cmd.append("--resume")
    if args.quiet:
        cmd.append("-q")
    if getattr(args, "sandbox", None):
        cmd += ["--sandbox", args.sandbox]
    return cmd


def _memory_limit(text: str | None) -> int:
    if text:
        try:
            return parse_memory(text)
        except ValueError as exc:
            raise UsageError(f"--container-memory: {exc}") from None
    from kgate.procmem import machine_memory

    return int((machine_memory() or 16 * 2**30) * 0.8)


def _inside(path: Path, root: Path, what: str) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        raise UsageError(f"{what} {path} is outside the workspace {root}; with --container only the current "
                         "folder is mounted: run kgate from the repository root") from None


def _rewrite_paths(report, workspace: Path, out_dir: Path) -> None:
    """Paths the container wrote (/workspace/..., /kgate-out/...) as the host sees them."""

    def host(path: str | None) -> str | None:
        if not path:
            return path
        if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
            return str(workspace / path[len(WORKSPACE) + 1:])
        if path == OUT or path.startswith(OUT + "/"):
            return str(out_dir / path[len(OUT) + 1:])
        return path

    for k in report.kernels:
        k.source_file = host(k.source_file)
        k.log = host(k.log)


def _stream_logs(container, sink, tail: deque) -> None:
    try:
        for chunk in container.logs(stream=True, follow=True):
            text = chunk.decode("utf-8", errors="replace")
            sink.write(text)
            sink.flush()
            tail.extend(text.splitlines())
    except Exception:  # noqa: BLE001 - the container went away; its exit code tells what happened
        pass


def run_in_container(args: argparse.Namespace) -> int:
    from kgate.report import Report
    from kgate.reports import junit

    docker = _docker()
    workspace = Path.cwd().resolve()
    manifest = _inside(Path(args.manifest), workspace, "the manifest")
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / "report.json"
    report_path.unlink(missing_ok=True)
    changed = None
    if getattr(args, "changed", None):
        from kgate.changes import read_list

        (out_dir / "changed.txt").write_text("\n".join(read_list(args.changed)) + "\n", encoding="utf-8")
        changed = f"{OUT}/changed.txt"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    # Root on the host maps to root in the container: use the image's non-root user instead, and let
    # it write the output folder. Any other user runs as itself, so its files stay its own.
    user = NON_ROOT if uid == 0 else f"{uid}:{os.getgid()}"
    if uid == 0:
        os.chmod(out_dir, 0o777)
    request = gpu_request(getattr(args, "gpus", "all"), args.device)
    command = container_command(args, manifest, changed)
    timeout = float(getattr(args, "container_timeout", 3600.0) or 3600.0)

    try:
        client = docker.from_env(timeout=max(timeout, 60) + 60)
        client.ping()
    except docker.errors.DockerException as exc:
        raise InfrastructureError(
            f"cannot reach the Docker daemon ({os.environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'}): "
            f"{exc}. Start dockerd, or set DOCKER_HOST, and make sure this user may use it; or run without "
            "--container") from None
    try:
        client.images.get(args.container)
    except docker.errors.ImageNotFound:
        print(f"kgate: image {args.container} is not on this host; pulling it", file=sys.stderr)
        try:
            client.images.pull(args.container)
        except docker.errors.DockerException as exc:
            raise InfrastructureError(
                f"image {args.container} is neither on this host nor pullable: {exc}. Build it with "
                f"`docker build -t {args.container} .` in kgate's repository (see the Dockerfile)") from None

    tmpfs = {"/tmp": "rw,exec,nosuid,nodev,size=8g"}
    if (workspace / ".git").is_dir():
        # An empty folder over the checkout's .git: actions/checkout leaves the job's token in .git/config
        # unless told `persist-credentials: false`, and no kernel needs the history.
        tmpfs[f"{WORKSPACE}/.git"] = "ro,noexec,nosuid,nodev,size=64k,mode=0555"
    config: dict[str, Any] = dict(
        image=args.container, command=command, user=user, working_dir=WORKSPACE,
        environment={"HOME": "/tmp/kgate-home", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                     "KGATE_IN_CONTAINER": "1", "TERM": "dumb"},
        volumes={str(workspace): {"bind": WORKSPACE, "mode": "ro"}, str(out_dir): {"bind": OUT, "mode": "rw"}},
        network_mode="none", read_only=True, tmpfs=tmpfs,
        cap_drop=["ALL"], security_opt=["no-new-privileges", *sandbox_options(args)], pids_limit=4096,
        mem_limit=_memory_limit(getattr(args, "container_memory", None)), shm_size="2g",
        labels={"kgate": "run"}, device_requests=[request] if request else None)
    print(f"kgate: running in container {args.container} (no network, workspace read-only, "
          f"{'GPUs: ' + getattr(args, 'gpus', 'all') if request else 'no GPU'}): kgate {shlex.join(command)}",
          file=sys.stderr)
    container = None
    try:
        container = _create(client, config, unmask=_sandbox_mode(args) != "none")
        try:
            container.start()
        except docker.errors.APIError as exc:
            if NO_GPU_RUNTIME in str(exc) or "[[gpu]]" in str(exc):
                raise InfrastructureError(
                    "this host has no GPU container runtime: Docker could not select a device driver with "
                    "capability [[gpu]]. Install the NVIDIA Container Toolkit (nvidia-container-toolkit), run "
                    "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd; or pass --gpus none "
                    "(or --device cpu) to run on the CPU") from None
            raise InfrastructureError(f"cannot start the container from {args.container}: {exc}") from None
        tail: deque = deque(maxlen=40)
        logs = threading.Thread(target=_stream_logs, args=(container, sys.stdout, tail), daemon=True)
        logs.start()
        started = time.monotonic()
        try:
            status = container.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - requests' read timeout: the wall-clock limit
            container.kill()
            logs.join(timeout=5)
            raise InfrastructureError(
                f"the container ran past --container-timeout {timeout:g} s and was killed; results so far are "
                f"in {out_dir / 'results.jsonl'}") from None
        logs.join(timeout=10)
        code = int(status.get("StatusCode", 2))
        container.reload()
        oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.DockerException:
                pass
    if not report_path.exists():
        cause = "it was killed for memory (raise --container-memory)" if oom else f"exit code {code}"
        if code == 2:
            # kgate inside said what was wrong (usage or manifest error) on the streamed output;
            # repeat its end on stderr, where callers (the Action's summary) collect errors.
            print("kgate: the run inside the container stopped with exit 2:\n" + "\n".join(tail), file=sys.stderr)
            return 2
        raise InfrastructureError(f"the container wrote no report ({cause}, after "
                                  f"{time.monotonic() - started:.0f} s); see its log above")
    report = Report.read(report_path)
    _rewrite_paths(report, workspace, out_dir)
    report.write(report_path)
    if args.json:
        report.write(args.json)
    if args.junit:
        junit.write(report, args.junit)
    return report.exit_code if code in (0, 1) else code
