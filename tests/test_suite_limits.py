"""The test suite's own time limit fires, even in a test blocked inside C code: a hang fails CI."""

from __future__ import annotations

import json
import os
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


def test_units_are_handed_out_longest_first_by_their_tests_recorded_times():
    from tests.xdist_groups import DEFAULT_S, estimate, longest_first

    units = {"a.py": ["a.py::t1", "a.py::t2"], "b.py::x": ["b.py::x"], "c.py::y": ["c.py::y"],
             "d.py::z": ["d.py::z"]}
    durations = {"a.py::t1": 5.0, "b.py::x": 30.0}
    assert estimate(units["a.py"], durations) == 5.0 + DEFAULT_S  # a test without a time counts the default
    order = longest_first(units, durations)
    assert order == ["b.py::x", "a.py", "c.py::y", "d.py::z"], f"expected longest first, ties as given: {order}"
    assert longest_first(units, {}) == list(units)  # nothing recorded: the order given


@pytest.mark.timeout(120)
def test_the_longest_recorded_unit_starts_first_and_record_durations_writes_the_times(tmp_path):
    """Under `-n 2 --dist loadgroup` the unit the durations file says is longest is handed out first, though
    it is collected last; `--record-durations` then writes what the run measured into that file."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.xdist_groups"]\n')
    (tmp_path / "test_units.py").write_text(textwrap.dedent("""
        import os
        import time

        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_unit(i, worker_id):
            with open(os.environ["STARTED_LOG"], "a") as f:
                f.write(f"{i}\\n")
            time.sleep(0.5 if i >= 4 else 0.05)
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\ndurations_file = durations.json\n")
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"test_units.py::test_unit[5]": 50.0, "test_units.py::test_unit[4]": 40.0}))
    started = tmp_path / "started.log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--record-durations", "test_units.py"], capture_output=True, text=True,
                          timeout=90, cwd=tmp_path,
                          env={**os.environ, "STARTED_LOG": str(started), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    first_two = set(started.read_text().split()[:2])
    assert first_two == {"4", "5"}, f"expected the two longest recorded tests (4, 5) to start first, got " \
                                    f"{started.read_text().split()}"
    written = json.loads(durations.read_text())
    long = {"test_units.py::test_unit[4]", "test_units.py::test_unit[5]"}
    assert set(written) == long, f"expected the times measured now, the short tests left out: {written}"
    assert all(0.25 <= written[k] < 5 for k in long), written
