"""The wheel: an installed kgate holds every module of kgate/ and the catalogue of controls (gates/, as
kgate/catalogue/), and its `kgate selftest` finds that catalogue without `--catalogue`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kgate.commands.selftest import default_catalogue
from tests.conftest import ROOT

# What `pip install .` (and the Dockerfile's install) builds the wheel from.
SOURCES = ["pyproject.toml", "README.md", "kgate", "gates"]
CACHES = shutil.ignore_patterns("__pycache__", "*.pyc")


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built (no network, the venv's setuptools) from a copy of the sources, so the build
    leaves nothing in the working tree."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=CACHES)
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(work / "dist"), str(source)], check=True, capture_output=True, text=True)
    (built,) = (work / "dist").glob("kgate-*.whl")
    return built


def test_wheel_holds_every_module_and_the_catalogue(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {f"kgate/{f}" for f in _files(ROOT / "kgate") if f.endswith(".py")}
    assert not modules - names, "pyproject.toml [tool.setuptools] packages misses a package of kgate/"
    catalogue = {f"kgate/catalogue/{f}" for f in _files(ROOT / "gates")}
    assert "kgate/catalogue/kgate.yaml" in catalogue and "kgate/catalogue/contract/correct.py" in catalogue
    assert not catalogue - names
    assert not any(n.startswith("gates/") for n in names)  # inside the package, not a top-level `gates`


def test_source_tree_finds_its_catalogue():
    assert default_catalogue() == ROOT / "gates" / "kgate.yaml"


def test_installed_kgate_selftest_finds_the_catalogue(wheel, tmp_path):
    """Installed apart from the source tree (no gates/ beside it), selftest runs a control of the catalogue
    the wheel carries, workers included."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the editable install of the source tree
    done = subprocess.run([sys.executable, "-m", "kgate", "selftest", "-k", "contract-correct-clamp",
                           "--device", "cpu", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "selftest: 1/1 controls as expected"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["manifest"] == str(site / "kgate" / "catalogue" / "kgate.yaml")
