"""fla-core 0.6.0 judged by kgate (examples/field/fla): the CPU subset's verdicts are the ones
docs/field/fla.md records, and both manifests load and name importable kernels, references and factories.

The library is required (the Makefile installs it); nothing here skips without it.
"""

from __future__ import annotations

import pytest

from tests.field_support import (
    MANIFESTS,
    ROOT,
    check_cpu_subset,
    check_factories_on_meta,
    check_manifest_loads,
)

FOLDER = ROOT / "examples" / "field" / "fla"

# Verdicts of `kgate run examples/field/fla/cpu.yaml --device cpu` other than pass, per kernel and
# gate; every other gate the run reports must pass. Each names its finding in docs/field/fla.md.
NOT_PASS: dict[str, dict[str, str]] = {}  # the fused-recurrent gated delta rule's forward passes every gate


@pytest.mark.timeout(120)
@pytest.mark.parametrize("manifest", MANIFESTS)
def test_manifest_loads_and_names_importable_callables(manifest):
    check_manifest_loads(FOLDER, manifest)


@pytest.mark.timeout(120)
def test_factories_put_inputs_on_the_device_they_are_given():
    check_factories_on_meta(FOLDER)


@pytest.mark.timeout(600)
def test_cpu_subset_verdicts_match_the_documented_ones(tmp_path):
    check_cpu_subset(FOLDER, tmp_path, NOT_PASS)
