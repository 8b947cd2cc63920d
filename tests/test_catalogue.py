"""The catalogue gates/: every gate has a spec and controls of both kinds, the manifest says what
each must get, and the correct controls pass every registered gate at once (no false positives from
stacking twelve gates, forward and backward)."""

from __future__ import annotations

import pytest
import torch

from kgate import gates as registry
from kgate.backward import BackwardSubject
from kgate.inputs import Case, InputFactory
from kgate.loading import resolve
from kgate.manifest import Ref, load
from kgate.subject import Subject
from tests.conftest import ROOT

CATALOGUE = ROOT / "gates" / "kgate.yaml"
MANIFEST = load(CATALOGUE)
CPU_CORRECT = [k for k in MANIFEST.kernels if "-correct-" in k.name and not str(k.device).startswith("cuda")]


def test_every_control_states_its_expected_verdicts():
    assert all(k.entry.expect for k in MANIFEST.kernels)
    assert len({k.name for k in MANIFEST.kernels}) == len(MANIFEST.kernels)


@pytest.mark.parametrize("gate", registry.GATE_NAMES)
def test_every_gate_has_a_spec_a_violating_and_a_correct_control(gate):
    folder = ROOT / "gates" / gate
    assert (folder / "README.md").is_file(), f"gates/{gate}/README.md missing"
    readme = (folder / "README.md").read_text()
    assert "tolerance" in readme.lower()
    catches = [k.name for k in MANIFEST.kernels if (k.entry.expect or {}).get(gate) == "fail"
               and "-violating-" in k.name]
    passes = [k.name for k in MANIFEST.kernels if (k.entry.expect or {}).get(gate) == "pass"
              and "-correct-" in k.name and gate in k.selected_gates(registry.GATE_NAMES)]
    assert catches, f"no violating control expects {gate} to fail"
    assert passes, f"no correct control expects {gate} to pass"
    cpu = [n for n in catches if not str(MANIFEST.by_name(n).device).startswith("cuda")]
    assert cpu, f"no CPU control catches {gate} (CI runs the catalogue on the CPU)"


def test_backward_has_controls_and_a_spec():
    assert (ROOT / "gates" / "backward" / "README.md").is_file()
    expects = [k.entry.expect for k in MANIFEST.kernels if k.entry.backward]
    assert any(e.get("oracle[backward]") == "fail" for e in expects)
    assert any(e.get("oracle[backward]") == "pass" for e in expects)


def test_gpu_behaviour_gates_have_cuda_variants():
    cuda = {g for k in MANIFEST.kernels if str(k.device).startswith("cuda") for g in k.entry.expect}
    assert {"initialization", "bounds", "isolation"} <= cuda


def subject_of(kernel) -> Subject:
    """The subject the worker would build for a catalogue entry, on the CPU, in this process."""
    reference = resolve(kernel.reference, "reference", MANIFEST.base)
    source = resolve(kernel.inputs, "inputs", MANIFEST.base) if isinstance(kernel.inputs, Ref) else kernel.inputs
    fn = resolve(kernel.kernel, "kernel", MANIFEST.base)
    cases = [Case(s, d, seed) for s in kernel.shapes for d in kernel.dtypes for seed in kernel.seeds]
    return Subject(kernel, fn, reference, InputFactory(source), torch.device("cpu"), cases,
                   repro_manifest=str(CATALOGUE))


@pytest.mark.slow
@pytest.mark.parametrize("kernel", CPU_CORRECT, ids=lambda k: k.name)
def test_correct_control_passes_all_gates_at_once(kernel):
    subject = subject_of(kernel)
    phases = [(subject, "")]
    if kernel.entry.backward:
        phases.append((BackwardSubject(subject), "[backward]"))
    verdicts = {}
    for target, suffix in phases:
        for name in kernel.selected_gates(registry.GATE_NAMES):
            result = registry.get(name).check(target)
            verdicts[name + suffix] = (result.verdict, result.message)
    bad = {g: v for g, v in verdicts.items() if v[0] not in ("pass", "skip")}
    assert not bad, bad
    assert sum(v[0] == "pass" for v in verdicts.values()) >= len(verdicts) - 2  # skips are the exception
