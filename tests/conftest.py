"""Shared fixtures. Keep this file to fixtures only; each area's helpers live in its own module."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["tests.cuda_guard", "tests.xdist_groups"]

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


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
