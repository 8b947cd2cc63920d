"""The catalogue gates/: every gate has a spec and controls of both kinds, and the manifest says what each
must get. (That the correct controls pass every gate they select, stacked in one worker, forward and
backward, is checked on `kgate selftest`'s report: tests/test_selftest.py.)"""

from __future__ import annotations

import pytest

from kgate import gates as registry
from kgate.manifest import load
from tests.conftest import ROOT

CATALOGUE = ROOT / "gates" / "kgate.yaml"
MANIFEST = load(CATALOGUE)


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
