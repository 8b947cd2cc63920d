"""How `make test` spreads the suite over pytest-xdist workers (`-n 2 --dist loadgroup`): each test file that
defines a fixture scoped wider than a class (a corpus judged once, a Docker daemon, a hook environment
installed once) goes whole to one worker, so that fixture is made once rather than once per worker; every
other test goes on its own to whichever worker is free.

The units (a whole file, or one test) are handed out longest first, by the times recorded for their tests
(in the ini option `durations_file`, tests/durations.json; a test it does not list counts DEFAULT_S): the long
ones start at once on both workers and the short ones fill in at the end, so that the workers finish
together rather than one waiting on the other's last long test. `pytest --record-durations` writes the
times of the tests it ran into that file (setup, call and teardown together; a test under RECORD_MIN_S is
left out and counts DEFAULT_S).

This replaces xdist's own `loadgroup` scheduler, whose `xdist_group` marks do not reach pytest 9's node
ids (xdist 3.8 appends the group to `item._nodeid`, which pytest 9 no longer reads), so every test was
scheduled alone and a Docker daemon was started on both workers. Without xdist only the recording runs."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

# a fixture declared with a scope wider than a test or a class: made once per worker process
SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](?!function|class)\w+["']""")
DURATIONS = "tests/durations.json"  # the ini option durations_file's default, from the root folder
DEFAULT_S = 0.1  # a test the file does not list: about the suite's median
RECORD_MIN_S = 0.25  # shorter tests are not written down (they count DEFAULT_S)


def shares_a_fixture(path: Path) -> bool:
    """Whether the test file at `path` defines a fixture scoped wider than a class."""
    try:
        return bool(SHARED_FIXTURE.search(path.read_text(encoding="utf-8")))
    except OSError:
        return False


def durations_file(config: pytest.Config) -> Path:
    return config.rootpath / (config.getini("durations_file") or DURATIONS)


def read_durations(path: Path) -> dict[str, float]:
    """Seconds per test node id, as `--record-durations` wrote them; empty where the file is missing or bad."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}


def estimate(nodeids: Iterable[str], durations: Mapping[str, float]) -> float:
    """A unit's expected seconds: its tests' recorded times, DEFAULT_S for each test without one."""
    return sum(durations.get(nodeid, DEFAULT_S) for nodeid in nodeids)


def longest_first(units: Mapping[str, Iterable[str]], durations: Mapping[str, float]) -> list[str]:
    """The units' names by their estimate, longest first; units of equal estimate keep their order."""
    return sorted(units, key=lambda name: -estimate(units[name], durations))


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # any other --dist: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    root, files, durations = config.rootpath, {}, read_durations(durations_file(config))

    class SharedFixtureScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if file not in files:
                files[file] = shares_a_fixture(root / file)
            return file if files[file] else nodeid

        def _assign_work_unit(self, node: Any) -> None:
            # the first assignment comes once the work queue is complete: order it then, once
            if not self.ordered:
                self.ordered = True
                order = longest_first(self.workqueue, durations)
                units = [(name, self.workqueue[name]) for name in order]
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("durations_file", f"the tests' recorded times, from the root folder (default {DURATIONS})",
                  default=DURATIONS)
    parser.addoption("--record-durations", action="store_true",
                     help="write each test's time into the durations_file (kept for tests not run), which orders "
                     "the xdist units longest first")


_measured: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _measured[report.nodeid] += report.duration  # on xdist's controller: every worker's reports


def pytest_unconfigure(config: pytest.Config) -> None:
    if not config.getoption("record_durations", False) or hasattr(config, "workerinput"):
        return  # written once, by the controller (or the only process)
    path = durations_file(config)
    recorded = read_durations(path)
    recorded.update(_measured)
    kept = {k: round(v, 2) for k, v in sorted(recorded.items()) if v >= RECORD_MIN_S}
    path.write_text(json.dumps(kept, indent=0) + "\n", encoding="utf-8")
