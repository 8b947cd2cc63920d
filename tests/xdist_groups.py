"""How `make test` spreads the suite over pytest-xdist workers (`-n 2 --dist loadgroup`): each test file that
defines a fixture scoped wider than a class (a corpus judged once, a Docker daemon, a hook environment
installed once) goes whole to one worker, so that fixture is made once rather than once per worker; every
other test goes on its own to whichever worker is free.

This replaces xdist's own `loadgroup` scheduler, whose `xdist_group` marks do not reach pytest 9's node
ids (xdist 3.8 appends the group to `item._nodeid`, which pytest 9 no longer reads), so every test was
scheduled alone and a Docker daemon was started on both workers. Without xdist nothing here runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# a fixture declared with a scope wider than a test or a class: made once per worker process
SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](?!function|class)\w+["']""")


def shares_a_fixture(path: Path) -> bool:
    """Whether the test file at `path` defines a fixture scoped wider than a class."""
    try:
        return bool(SHARED_FIXTURE.search(path.read_text(encoding="utf-8")))
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # any other --dist: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    root, files = config.rootpath, {}

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if file not in files:
                files[file] = shares_a_fixture(root / file)
            return file if files[file] else nodeid

    return SharedFixtureScheduling(config, log)
