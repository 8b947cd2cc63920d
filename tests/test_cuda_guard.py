"""tests/cuda_guard.py: a test that loses the CUDA context ends its process's share of the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

TESTS = textwrap.dedent("""
    def test_a_fault():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def test_after_it():
        pass
""")


def _pytest(tmp_path, env_extra):
    (tmp_path / "test_inner.py").write_text(TESTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    if "PYTEST_XDIST_WORKER" not in env_extra:
        env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cuda_guard", "-p", "no:cacheprovider",
                           "-q", "-rA", str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_without_xdist_the_session_stops_after_the_fault_and_says_why(tmp_path):
    run = _pytest(tmp_path, {})
    out = run.stdout + run.stderr
    assert run.returncode == 2, out  # pytest's "interrupted"
    assert "1 failed in" in out and "PASSED test_inner.py::test_after_it" not in out
    assert "lost this process's CUDA context" in out and "stopping" in out


def test_an_xdist_worker_exits_after_the_fault_so_a_fresh_one_runs_the_rest(tmp_path):
    run = _pytest(tmp_path, {"PYTEST_XDIST_WORKER": "gw0"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "ending this xdist worker" in run.stderr
    assert "test_after_it" not in run.stdout


@pytest.mark.parametrize("error", ['raise RuntimeError("CUDA error: out of memory")',
                                   'assert "CUDA error: an illegal memory access was encountered" is None'])
def test_other_failures_change_nothing(tmp_path, error):
    (tmp_path / "test_inner.py").write_text(TESTS.replace(
        'raise RuntimeError("CUDA error: an illegal memory access was encountered")', error))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cuda_guard", "-p", "no:cacheprovider", "-q",
                          str(tmp_path / "test_inner.py")], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_XDIST_WORKER": "gw0"}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
