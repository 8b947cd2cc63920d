"""The resources gate in a manifest: opt-in (not part of `all`), added by a declared `resources:` budget or
by naming it, validated at load, and judged end to end by `kgate run`. The figures need a GPU; here the
kernel's module holds a real `triton.jit` function whose cache carries a compiled kernel with Triton's
attribute names (tests/test_gate_resources.py reads the same objects in-process)."""

from __future__ import annotations

import json

import pytest

from kgate.cli import main
from kgate.errors import ManifestError
from kgate.manifest import load

pytest.importorskip("triton")

KERNEL_PY = """
import types

import torch
import triton


@triton.jit
def double_kernel(x_ptr):
    pass


def _compiled(regs, spills):
    metadata = types.SimpleNamespace(name="double_kernel", shared=1024, target=types.SimpleNamespace(arch=90))
    return types.SimpleNamespace(name="double_kernel", n_regs=regs, n_spills=spills, metadata=metadata)


# what a GPU run leaves in the function's cache: 200 registers and 4 words of spills per thread
double_kernel.device_caches = {0: ({"k": _compiled(200, 4)}, {}, None, None, None)}


def make_inputs(seed, shape=None, dtype=None, device=None):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (8,), generator=g).to(device=device),)


def ref(x):
    return x * 2


def kern(x):
    return x + x
"""


def _manifest(entry_extra: str, defaults_extra: str = "") -> str:
    return f"""\
version: 1
defaults:
  device: cpu
  seeds: [0]
{defaults_extra}kernels:
  - name: double
    kernel: k.py:kern
    reference: k.py:ref
    inputs: k.py:make_inputs
    shapes: [[8]]
{entry_extra}"""


def _gates(write_manifest, entry_extra, defaults_extra=""):
    return load(write_manifest(_manifest(entry_extra, defaults_extra), {"k.py": KERNEL_PY})).kernels[0]


def test_a_declared_budget_adds_the_gate_and_all_leaves_it_out(write_manifest):
    from kgate.names import GATE_NAMES

    assert _gates(write_manifest, "").selected_gates(GATE_NAMES) == GATE_NAMES  # `all`: the twelve
    budget = "    resources: {max_registers: 128}\n"
    assert _gates(write_manifest, budget).selected_gates(GATE_NAMES) == [*GATE_NAMES, "resources"]
    # a budget in the defaults applies to every kernel
    kernel = _gates(write_manifest, "", "  resources: {spills: 0}\n")
    assert kernel.selected_gates(GATE_NAMES)[-1] == "resources" and kernel.resources.spills == 0
    # an explicit list chooses exactly; exclude takes it out; naming it adds it without a budget
    assert _gates(write_manifest, budget + "    gates: [oracle]\n").selected_gates(GATE_NAMES) == ["oracle"]
    assert "resources" not in _gates(write_manifest, budget + "    gates: {exclude: [resources]}\n"
                                     ).selected_gates(GATE_NAMES)
    assert _gates(write_manifest, "    gates: [oracle, resources]\n").selected_gates(GATE_NAMES) == [
        "oracle", "resources"]


@pytest.mark.parametrize("extra, message", [
    ("    resources: {max_regs: 1}\n", "max_regs"),
    ("    resources: {spills: -1}\n", "spills"),
    ("    backward: true\n    resources: {spills: 0}\n    expect: {\"resources[backward]\": pass}\n", "resources[backward]"),
])
def test_a_bad_budget_is_refused_at_load_naming_the_key(write_manifest, extra, message, capsys):
    path = write_manifest(_manifest(extra), {"k.py": KERNEL_PY})
    with pytest.raises(ManifestError) as info:
        load(path)
    assert any(message in f"{p.key} {p.message}" for p in info.value.problems), info.value.problems
    assert main(["run", str(path), "--device", "cpu"]) == 2


def _run(write_manifest, tmp_path, entry_extra, *args):
    path = write_manifest(_manifest(entry_extra), {"k.py": KERNEL_PY})
    report = tmp_path / "report.json"
    code = main(["run", str(path), "--device", "cpu", "--json", str(report), *args])
    (kernel,) = json.loads(report.read_text())["kernels"]
    return code, {g["gate"]: g for g in kernel["gates"]}


@pytest.mark.slow
def test_kgate_run_fails_a_kernel_over_its_budget_and_passes_one_within(write_manifest, tmp_path):
    code, gates = _run(write_manifest, tmp_path, "    resources: {max_registers: 128, spills: 0}\n",
                       "--gate", "oracle,resources")
    assert code == 1 and gates["oracle"]["verdict"] == "pass"
    over = gates["resources"]
    assert over["verdict"] == "fail" and over["tolerance_free"], over
    assert "double_kernel has 200 registers > 128, 16 bytes of local memory (spills) > 0" in over["message"]
    code, gates = _run(write_manifest, tmp_path, "    resources: {max_registers: 256, spills: 16}\n",
                       "--gate", "oracle,resources")
    assert code == 0 and gates["resources"]["verdict"] == "pass", gates["resources"]
    assert "within max_registers 256, spills 16" in gates["resources"]["message"]
