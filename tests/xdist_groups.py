"""Keeps the tests that share an expensive fixture on one xdist worker (`make test` runs pytest-xdist with
`--dist loadgroup`): a test that uses a module- or session-scoped fixture of this suite (a corpus judged
once, a Docker daemon, a hook environment installed once) joins that fixture's group, so the fixture is
made once rather than once per worker. Every other test goes to whichever worker is free. Without xdist
the marks change nothing."""

from __future__ import annotations

import pytest

SHARED_SCOPES = ("module", "package", "session")


def shared_fixture(item: pytest.Item) -> str | None:
    """The first module/session-scoped fixture of this suite (not pytest's or a plugin's) `item` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in item.fixturenames:
        definitions = info.name2fixturedefs.get(name) or ()
        if definitions and definitions[-1].scope in SHARED_SCOPES and definitions[-1].baseid:
            return f"{definitions[-1].baseid}::{name}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = shared_fixture(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
