"""The test suite's own time limit fires, even in a test blocked inside C code: a hang fails CI."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_test_blocked_in_c_code_is_stopped_by_its_time_limit(tmp_path, workers):
    """In one process and on xdist workers as `make test` runs the suite: the worker that holds the hung
    test ends, and the run fails naming it."""
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import ctypes
        import threading

        def test_blocked():
            lock = threading.Lock()
            lock.acquire()
            libc = ctypes.CDLL(None)
            while True:  # in C (sleep) nearly all the time: a time limit must reach it there
                libc.sleep(60)
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "3",
                           "-o", "timeout_method=thread", *workers, str(tmp_path / "test_hang.py")],
                          capture_output=True, text=True, timeout=90, cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode != 0 and took < 60, (done.returncode, took, done.stdout[-2000:])
    out = done.stdout + done.stderr
    # one process prints the timeout and the stacks; xdist reports the worker that ended, with the test
    assert "test_blocked" in out and ("Timeout" in out if not workers else "crashed while running" in out), out


def test_the_suite_uses_the_thread_method():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'timeout_method = "thread"' in text and "\ntimeout = " in text
