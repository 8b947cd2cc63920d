"""What the field libraries' tests share (tests/test_field_liger.py, tests/test_field_fla.py): a library's
manifests load and name importable callables, its GPU factories honour the device they are given, and its
CPU subset's verdicts are the ones its page in docs/field/ records."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from kgate.loading import resolve
from kgate.manifest import load
from kgate.names import GATE_NAMES, phase_ids

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ("kgate.yaml", "cpu.yaml")


def entries(folder: Path, manifest: str) -> list:
    return load(folder / manifest).kernels


def check_manifest_loads(folder: Path, manifest: str) -> None:
    """What `kgate run` loads first: the manifest validates and every kernel, reference and factory imports;
    what the CPU subset judges is in the GPU manifest too."""
    listed = entries(folder, manifest)
    assert listed, f"{manifest} lists no kernels"
    for entry in listed:
        for role, ref in (("kernel", entry.kernel), ("reference", entry.reference), ("inputs", entry.inputs)):
            assert callable(resolve(ref, role, folder)), f"{manifest}: {entry.name}'s {role} {ref} is not callable"
    cpu_names = {e.name for e in entries(folder, "cpu.yaml")}
    gpu_names = {e.name for e in entries(folder, "kgate.yaml")}
    assert cpu_names <= gpu_names, f"cpu.yaml judges kernels kgate.yaml lacks: {sorted(cpu_names - gpu_names)}"


def check_factories_on_meta(folder: Path) -> None:
    """The GPU manifest's factories take the device as an argument (no .cuda(), no CPU assumption): on the
    meta device every tensor they return is there, at the manifest's own first shape; and the kernel and the
    reference (functions) take what the factory returns, with the entry's kwargs."""
    import torch

    for entry in entries(folder, "kgate.yaml"):
        factory = resolve(entry.inputs, "inputs", folder)
        args = factory(0, shape=entry.shapes[0], dtype=torch.bfloat16, device="meta")
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        assert devices == {"meta"}, f"{entry.name}: factory put inputs on {devices}, expected only 'meta'"
        for role, ref in (("kernel", entry.kernel), ("reference", entry.reference)):
            fn = resolve(ref, role, folder)
            if inspect.isfunction(fn):  # a module's signature is its forward's, checked where it is built
                try:
                    inspect.signature(fn).bind(*args, **(entry.kwargs or {}))
                except TypeError as exc:
                    raise AssertionError(f"{entry.name}: its {role} {ref} does not take the factory's "
                                         f"{len(args)} inputs: {exc}") from None


def check_cpu_subset(folder: Path, tmp_path: Path, not_pass: dict[str, dict[str, str]]) -> None:
    """`kgate run cpu.yaml` under Triton's interpreter: every gate each kernel selects (both phases with
    `backward: true`) reports, and passes unless `not_pass` names another verdict for it."""
    from kgate.cli import main as kgate_main

    report = tmp_path / "report.json"
    with pytest.MonkeyPatch.context() as patch:  # in this process: its output goes to the test's captured output
        patch.setenv("TRITON_INTERPRET", "1")
        patch.chdir(tmp_path)
        code = kgate_main(["run", str(folder / "cpu.yaml"), "--device", "cpu", "--json", str(report), "--out",
                           str(tmp_path / "out")])
    assert report.exists(), f"kgate run wrote no report (exit {code}); its output is above"
    kernels = {k["name"]: k for k in json.loads(report.read_text())["kernels"]}
    listed = {e.name: e for e in entries(folder, "cpu.yaml")}
    assert set(kernels) == set(listed)
    wrong = []
    for name, kernel in kernels.items():
        expected = not_pass.get(name, {})
        got = {g["gate"]: g["verdict"] for g in kernel["gates"]}
        for gate, verdict in got.items():
            want = expected.get(gate, "pass")
            if verdict != want:
                message = next(g["message"] for g in kernel["gates"] if g["gate"] == gate)
                wrong.append(f"{name} {gate}: expected {want}, got {verdict}: {message[:300]}")
        every = phase_ids(listed[name].selected_gates(GATE_NAMES), listed[name].entry.backward)
        missing = sorted(set(every) - set(got))
        if missing:
            wrong.append(f"{name}: no result for {missing}")
    page = f"docs/field/{folder.name}.md"
    assert not wrong, (f"verdicts differ from {page}; reproduce with TRITON_INTERPRET=1 kgate run "
                       f"{folder.relative_to(ROOT)}/cpu.yaml --device cpu -k NAME --gate GATE:\n" + "\n".join(wrong))
