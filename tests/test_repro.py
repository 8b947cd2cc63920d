"""kgate repro: replays a recorded failure through the runner and says whether it still fails."""

from __future__ import annotations

import os

import pytest

from kgate.cli import main

MANIFEST = """\
version: 1
defaults: {device: cpu, seeds: [3]}
kernels:
  - name: scaled
    kernel: k.py:kern
    reference: k.py:ref
    inputs: k.py:make
    shapes: [[4, 8]]
    gates: [oracle, special_values]
"""
BROKEN = """\
import torch
def make(seed, shape=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*(shape or (2, 2)), generator=g, dtype=torch.float64).to(dtype),)
def ref(x):
    return x * 2
def kern(x):
    return x * 2.001
"""


@pytest.fixture(scope="module")
def run_once(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repro")
    (folder / "k.py").write_text(BROKEN)
    (folder / "kgate.yaml").write_text(MANIFEST)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        assert main(["run", "kgate.yaml", "-q", "--json", "r.json"]) == 1
    finally:
        os.chdir(cwd)
    return folder


@pytest.fixture
def recorded(run_once, monkeypatch, capsys):
    """The folder of one recorded run (kernel file and manifest restored after each test)."""
    monkeypatch.chdir(run_once)
    capsys.readouterr()
    yield run_once
    (run_once / "k.py").write_text(BROKEN)
    if (run_once / "moved.yaml").exists():
        (run_once / "moved.yaml").rename(run_once / "kgate.yaml")


def test_replays_and_still_fails(recorded, capsys):
    assert main(["repro", "r.json", "scaled/oracle"]) == 1
    out = capsys.readouterr().out
    assert "recorded: FAIL scaled/oracle" in out and "replayed: FAIL scaled/oracle on cpu" in out
    assert "seed=3" in out and "shape=[4, 8]" in out
    assert out.strip().endswith("still fails")


def test_replay_after_the_fix_no_longer_fails(recorded, capsys):
    (recorded / "k.py").write_text(BROKEN.replace("x * 2.001", "x * 2"))
    assert main(["repro", "r.json", "scaled/oracle"]) == 0
    assert capsys.readouterr().out.strip().endswith("no longer fails")


@pytest.mark.parametrize(("target", "words"), [
    ("scaled/special_values", "recorded as pass: nothing to replay (its failures: oracle)"),
    ("nope/oracle", "no kernel 'nope' in the report"),
    ("scaled/bounds", "has no result for gate 'bounds'"),
    ("scaled", "write KERNEL/GATE"),
])
def test_usage_errors(recorded, capsys, target, words):
    assert main(["repro", "r.json", target]) == 2
    assert words in capsys.readouterr().err


def test_manifest_moved_is_a_clear_error(recorded, capsys):
    (recorded / "kgate.yaml").rename(recorded / "moved.yaml")
    assert main(["repro", "r.json", "scaled/oracle"]) == 2
    assert "pass --manifest PATH" in capsys.readouterr().err
    assert main(["repro", "r.json", "scaled/oracle", "--manifest", "moved.yaml"]) == 1
