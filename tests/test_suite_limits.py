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


@pytest.mark.timeout(120)
def test_tests_sharing_a_module_fixture_run_on_one_xdist_worker(tmp_path):
    """tests/xdist_groups.py: under `make test`'s `-n 2 --dist loadgroup` a module-scoped fixture (a corpus
    judged once, a Docker daemon) is made once, not once per worker; the tests of other files still spread."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.xdist_groups"]\n')
    (tmp_path / "test_shared.py").write_text(textwrap.dedent("""
        import os
        import time

        import pytest

        @pytest.fixture(scope="module")
        def made_once(tmp_path_factory):
            with open(os.environ["MADE_LOG"], "a") as f:
                f.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")
            return 1

        @pytest.mark.parametrize("i", range(6))
        def test_uses_it(made_once, i):
            time.sleep(0.2)
    """))
    (tmp_path / "test_alone.py").write_text(textwrap.dedent("""
        import os
        import time

        import pytest

        @pytest.mark.parametrize("i", range(8))
        def test_alone(i, worker_id):
            with open(os.environ["ALONE_LOG"], "a") as f:
                f.write(worker_id + "\\n")
            time.sleep(0.3)
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    made, alone = tmp_path / "made.log", tmp_path / "alone.log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "test_shared.py", "test_alone.py"], capture_output=True, text=True, timeout=90,
                          cwd=tmp_path, env={**__import__("os").environ, "MADE_LOG": str(made), "ALONE_LOG": str(alone),
                                             "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(made.read_text().split()) == 1  # the fixture was made by one worker, once
    assert set(alone.read_text().split()) == {"gw0", "gw1"}  # a file without one: its tests spread
