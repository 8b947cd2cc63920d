"""Shared fixtures. Keep this file to fixtures only; each area's helpers live in its own module."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["tests.cuda_guard", "tests.xdist_groups"]

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


_AUDIT_CACHE: list[tuple[str, str | None]] = []  # (this process's folder, the variable's value before it)


def pytest_configure(config):
    """Every audit of a test process keeps its candidates' builds in one folder of that process's own
    (`kgate audit --cache`, by its environment default), as a user's audits into several --out folders may:
    builds made once serve the process's later tests, and the audits' workers fork from one template instead
    of starting one per test (the template's view holds the folders that hold the builds). One folder per
    process (an xdist worker inherits its controller's environment, so each makes its own): audits running at
    the same time must not share a cache (kgate.audit.evaluate.clear_stale_locks). Tests of the default
    (builds under --out) unset it."""
    from kgate.commands.audit import CACHE_ENV

    _AUDIT_CACHE.append((tempfile.mkdtemp(prefix="kgate-audit-cache-"), os.environ.get(CACHE_ENV)))
    os.environ[CACHE_ENV] = _AUDIT_CACHE[-1][0]


def pytest_unconfigure(config):
    from kgate.commands.audit import CACHE_ENV

    while _AUDIT_CACHE:
        folder, before = _AUDIT_CACHE.pop()
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def write_manifest(tmp_path):
    """Write a manifest (dedented YAML) and extra files into a temporary folder; return its path."""

    def write(yaml_text: str, files: dict[str, str] | None = None, name: str = "kgate.yaml") -> Path:
        for rel, content in (files or {}).items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(content))
        path = tmp_path / name
        path.write_text(textwrap.dedent(yaml_text))
        return path

    return write
