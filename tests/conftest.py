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


@pytest.fixture(scope="session", autouse=True)
def shared_audit_cache():
    """Every audit of a test process keeps its candidates' builds in one folder (`kgate audit --cache`, by its
    environment default), as a user's audits into several --out folders may: builds made once serve every
    test, and the audits' workers fork from one template instead of starting one per test (the template's
    view holds the folders that hold the builds). Tests of the default (builds under --out) unset it."""
    from kgate.commands.audit import CACHE_ENV

    if os.environ.get(CACHE_ENV):
        yield os.environ[CACHE_ENV]
        return
    folder = tempfile.mkdtemp(prefix="kgate-audit-cache-")
    os.environ[CACHE_ENV] = folder
    try:
        yield folder
    finally:
        os.environ.pop(CACHE_ENV, None)
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
