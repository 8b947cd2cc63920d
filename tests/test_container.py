"""`kgate run --container IMAGE` against a real Docker daemon started by the tests (see
tests/docker_support.py), with an image built from kgate's Dockerfile on a base made from the host's
own Python (no registry is reachable). The GPU path is exercised too: there is no GPU runtime here,
so it must end with the clear exit-2 error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from argparse import Namespace
from pathlib import Path

import pytest

from kgate import container
from kgate.errors import UsageError
from tests.conftest import ROOT
from tests.docker_support import Daemon, DockerUnavailable, build_base_image

IMAGE = "kgate-test:local"
MANIFEST = "tests/data/container/kgate.yaml"


@pytest.fixture(scope="session")
def docker_daemon(tmp_path_factory):
    try:
        daemon = Daemon(tmp_path_factory.mktemp("dockerd", numbered=True)).start()
    except DockerUnavailable as exc:
        pytest.skip(f"Docker cannot run here: {exc}")
    yield daemon
    daemon.stop()
    assert not Path(f"/proc/{daemon.proc.pid}").exists() or daemon.proc.poll() is not None


@pytest.fixture(scope="session")
def kgate_image(docker_daemon, tmp_path_factory):
    client = docker_daemon.client()
    started = time.monotonic()
    base = build_base_image(client, tmp_path_factory.mktemp("base-image"))
    client.images.build(path=str(ROOT), tag=IMAGE, forcerm=True, rm=True, network_mode="none",
                        buildargs={"BASE_IMAGE": base,
                                   "PIP_INSTALL_ARGS": "--no-deps --no-build-isolation --no-index"})
    print(f"base image and kgate image built in {time.monotonic() - started:.1f}s")
    return IMAGE


def _kgate(args: list[str], docker_host: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kgate", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "DOCKER_HOST": docker_host, **env})


def _leftovers(daemon: Daemon) -> list:
    return daemon.client().containers.list(all=True, filters={"label": "kgate"})


@pytest.mark.docker
@pytest.mark.slow
def test_gates_run_inside_the_container_and_the_report_comes_back(docker_daemon, kgate_image, tmp_path):
    out = tmp_path / "out"
    proc = _kgate(["run", MANIFEST, "--container", kgate_image, "--device", "cpu", "--gate", "contract,special_values",
                   "--out", str(out), "--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "junit.xml"),
                   "--container-memory", "4GiB", "--container-timeout", "300"],
                  docker_daemon.host, GITHUB_TOKEN="ghs_must_not_enter_the_container")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "kgate verdicts" in proc.stdout  # the container's console, streamed
    assert "no network, workspace read-only" in proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    verdicts = {k["name"]: k["verdict"] for k in report["kernels"]}
    # The probe raises if it can write the workspace, has a network interface, sees a token or is root.
    assert verdicts == {"softmax-stable": "pass", "softmax-naive": "fail", "escape-probe": "pass"}, \
        json.dumps(report["kernels"], indent=1)[:3000]
    naive = next(k for k in report["kernels"] if k["name"] == "softmax-naive")
    assert [g["gate"] for g in naive["gates"] if g["verdict"] == "fail"] == ["special_values"]
    # Paths as the host sees them, for the annotations.
    assert naive["source_file"] == str(ROOT / "examples" / "softmax.py")
    assert naive["log"].startswith(str(out))
    assert json.loads((out / "report.json").read_text())["kernels"][1]["source_file"] == naive["source_file"]
    assert ET.parse(tmp_path / "junit.xml").getroot().tag in ("testsuites", "testsuite")
    # each worker had a sandbox of its own inside the container too (the base image carries the host's bwrap)
    assert report["environment"]["sandbox"].startswith("bubblewrap"), report["environment"]
    assert not (ROOT / "written-by-kernel").exists()
    assert _leftovers(docker_daemon) == []  # removed afterwards


@pytest.mark.docker
def test_gpu_request_without_a_gpu_runtime_is_a_clear_exit_2(docker_daemon, kgate_image, tmp_path):
    proc = _kgate(["run", MANIFEST, "--container", kgate_image, "--gpus", "all", "-k", "softmax-stable",
                   "--out", str(tmp_path / "out")], docker_daemon.host)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no GPU container runtime" in proc.stderr and "NVIDIA Container Toolkit" in proc.stderr
    assert "--gpus none" in proc.stderr
    assert _leftovers(docker_daemon) == []  # the 'created' container was removed


@pytest.mark.docker
def test_manifest_error_inside_the_container_is_exit_2_with_the_message_on_stderr(docker_daemon, kgate_image,
                                                                                  tmp_path):
    proc = _kgate(["run", "tests/data/container/bad.yaml", "--container", kgate_image, "--device", "cpu",
                   "--out", str(tmp_path / "out")], docker_daemon.host)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown key 'kernal'" in proc.stderr and "did you mean 'kernel'?" in proc.stderr
    assert _leftovers(docker_daemon) == []


@pytest.mark.docker
def test_missing_image_that_cannot_be_pulled_is_exit_2(docker_daemon, tmp_path):
    proc = _kgate(["run", MANIFEST, "--container", "kgate-test:absent", "--device", "cpu",
                   "--out", str(tmp_path / "out")], docker_daemon.host)
    assert proc.returncode == 2
    assert "docker build -t kgate-test:absent ." in proc.stderr


def test_unreachable_daemon_is_exit_2(tmp_path):
    proc = _kgate(["run", MANIFEST, "--container", IMAGE, "--out", str(tmp_path / "out")],
                  f"unix://{tmp_path}/no-such.sock")
    assert proc.returncode == 2
    assert "cannot reach the Docker daemon" in proc.stderr and "DOCKER_HOST" in proc.stderr


def test_manifest_outside_the_workspace_is_a_usage_error(tmp_path):
    outside = tmp_path / "kgate.yaml"
    outside.write_text("version: 1\n")
    proc = subprocess.run([sys.executable, "-m", "kgate", "run", str(outside), "--container", IMAGE], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "outside the workspace" in proc.stderr


def _args(**over) -> Namespace:
    base = dict(select=None, gate=[], seed=[], dtype=[], shape=[], device=None, timeout=None, memory=None, jobs=1,
                quiet=False)
    return Namespace(**{**base, **over})


def test_container_command_forwards_the_selection():
    cmd = container.container_command(_args(select="a or b", gate=["oracle"], seed=[3], shape=["7,9"],
                                            device="cuda:1", timeout=30.0, quiet=True),
                                      "kernels/kgate.yaml", "/kgate-out/changed.txt")
    assert cmd == ["run", "kernels/kgate.yaml", "--out", "/kgate-out", "--json", "/kgate-out/report.json",
                   "-k", "a or b", "--gate", "oracle", "--seed", "3", "--shape", "7,9", "--device", "cuda:1",
                   "--timeout", "30.0", "--changed", "/kgate-out/changed.txt", "-q"]
    resumed = container.container_command(_args(resume=True), "kgate.yaml", None)
    assert resumed[-1] == "--resume"


def test_gpu_requests():
    assert container.gpu_request("all", "cpu") is None
    assert container.gpu_request("none", None) is None
    assert container.gpu_request("all", None)["Count"] == -1
    assert container.gpu_request("2", "cuda")["Count"] == 2
    assert container.gpu_request("0,3", None)["DeviceIDs"] == ["0", "3"]
    with pytest.raises(UsageError, match="--gpus"):
        container.gpu_request("some", None)
