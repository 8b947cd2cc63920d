"""fla-core 0.6.0 judged by kgate (examples/field/fla): the CPU subset's verdicts are the ones
docs/field/fla.md records, and both manifests load and name importable kernels, references and factories.

The library is required (the Makefile installs it); nothing here skips without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kgate.gates import GATE_NAMES
from kgate.loading import resolve
from kgate.manifest import load

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "field" / "fla"
MANIFESTS = ("kgate.yaml", "cpu.yaml")

# Verdicts of `kgate run examples/field/fla/cpu.yaml --device cpu` other than pass, per kernel and
# gate; every other gate the run reports must pass. Each names its finding in docs/field/fla.md.
NOT_PASS: dict[str, dict[str, str]] = {}  # the fused-recurrent gated delta rule's forward passes every gate


def _entries(manifest: str):
    return load(FOLDER / manifest).kernels


@pytest.mark.timeout(120)
@pytest.mark.parametrize("manifest", MANIFESTS)
def test_manifest_loads_and_names_importable_callables(manifest):
    """What `kgate run` loads first: the manifest validates and every kernel, reference and factory imports;
    the factory makes inputs on the device it is given (here the CPU, at the first declared shape)."""
    entries = _entries(manifest)
    assert entries, f"{manifest} lists no kernels"
    for entry in entries:
        for role, ref in (("kernel", entry.kernel), ("reference", entry.reference), ("inputs", entry.inputs)):
            assert callable(resolve(ref, role, FOLDER)), f"{manifest}: {entry.name}'s {role} {ref} is not callable"
    cpu_names = {e.name for e in _entries("cpu.yaml")}
    gpu_names = {e.name for e in _entries("kgate.yaml")}
    assert cpu_names <= gpu_names, f"cpu.yaml judges kernels kgate.yaml lacks: {sorted(cpu_names - gpu_names)}"


@pytest.mark.timeout(120)
def test_factories_put_inputs_on_the_device_they_are_given():
    """The GPU manifest's factories take the device as an argument (no .cuda(), no CPU assumption): on the
    meta device every tensor they return is there, at the manifest's own first shape."""
    import torch

    for entry in _entries("kgate.yaml"):
        factory = resolve(entry.inputs, "inputs", FOLDER)
        args = factory(0, shape=entry.shapes[0], dtype=torch.bfloat16, device="meta")
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        assert devices == {"meta"}, f"{entry.name}: factory put inputs on {devices}, expected only 'meta'"


@pytest.mark.timeout(600)
def test_cpu_subset_verdicts_match_the_documented_ones(tmp_path):
    """Runs the CPU subset (Triton interpreter) and compares every kernel's per-gate verdicts with NOT_PASS."""
    report = tmp_path / "fla.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "kgate", "run", str(FOLDER / "cpu.yaml"), "--device", "cpu",
                           "--json", str(report), "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580)
    assert report.exists(), f"kgate run wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                            f"{proc.stderr[-3000:]}"
    kernels = {k["name"]: k for k in json.loads(report.read_text())["kernels"]}
    assert set(kernels) == {e.name for e in _entries("cpu.yaml")}
    # forward only (fla does not implement this op's backward); the gates cpu.yaml selects
    every = set(_entries("cpu.yaml")[0].selected_gates(GATE_NAMES))
    wrong = []
    for name, kernel in kernels.items():
        expected = NOT_PASS.get(name, {})
        got = {g["gate"]: g["verdict"] for g in kernel["gates"]}
        for gate, verdict in got.items():
            want = expected.get(gate, "pass")
            if verdict != want:
                message = next(g["message"] for g in kernel["gates"] if g["gate"] == gate)
                wrong.append(f"{name} {gate}: expected {want}, got {verdict}: {message[:300]}")
        missing = sorted(every - set(got))
        if missing:
            wrong.append(f"{name}: no result for {missing}")
    assert not wrong, ("verdicts differ from docs/field/fla.md; reproduce with TRITON_INTERPRET=1 kgate run "
                       "examples/field/fla/cpu.yaml --device cpu -k NAME --gate GATE:\n" + "\n".join(wrong))
