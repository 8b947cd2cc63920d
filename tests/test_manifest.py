"""Manifest validation: every bad manifest gives one clear message with file, line and key, exit 2,
and runs nothing."""

from __future__ import annotations

import json

import pytest

from kgate.cli import main
from kgate.errors import ManifestError
from kgate.manifest import json_schema, load

KERNEL_PY = """
import torch

def make_inputs(seed, shape=None):
    return (torch.randn(shape or (4, 4)),)

def ref(x):
    return x * 2

def kern(x):
    return x + x
"""

GOOD = """\
version: 1
kernels:
  - name: double
    kernel: k.py:kern
    reference: k.py:ref
    inputs: k.py:make_inputs
"""


def problems(path):
    with pytest.raises(ManifestError) as info:
        load(path)
    return info.value.problems


def test_valid_manifest_resolves_defaults(write_manifest):
    manifest = load(write_manifest(GOOD, {"k.py": KERNEL_PY}))
    kernel = manifest.kernels[0]
    assert kernel.name == "double"
    assert kernel.dtypes == ["float32"]
    assert kernel.kernel.path.name == "k.py" and kernel.kernel.attr == "kern"
    assert kernel.line == 3
    assert kernel.source_location()[1] == 10


def test_unknown_key_names_line_and_suggests(write_manifest):
    path = write_manifest(GOOD.replace("    reference: k.py:ref", "    refrence: k.py:ref"), {"k.py": KERNEL_PY})
    found = problems(path)
    unknown = [p for p in found if "unknown key" in p.message]
    assert unknown and unknown[0].line == 5 and unknown[0].key == "kernels[0].refrence"
    assert "did you mean 'reference'" in unknown[0].hint
    assert any(p.message == "missing required key 'reference'" for p in found)


def test_wrong_type(write_manifest):
    path = write_manifest(GOOD + "    backward: maybe\n", {"k.py": KERNEL_PY})
    (p,) = problems(path)
    assert p.line == 7 and p.key == "kernels[0].backward" and "bool" in p.message and "'maybe'" in p.message


def test_unsupported_version(write_manifest):
    (p,) = problems(write_manifest(GOOD.replace("version: 1", "version: 7"), {"k.py": KERNEL_PY}))
    assert p.line == 1 and p.key == "version" and "unsupported manifest version 7" in p.message
    assert "version: 1" in p.hint


def test_missing_version(write_manifest):
    (p,) = problems(write_manifest(GOOD.replace("version: 1\n", ""), {"k.py": KERNEL_PY}))
    assert p.key == "version" and "version: 1" in p.hint


def test_missing_file(write_manifest):
    (p,) = problems(write_manifest(GOOD.replace("kernel: k.py:kern", "kernel: kk.py:kern"), {"k.py": KERNEL_PY}))
    assert p.line == 4 and p.key == "kernels[0].kernel" and "file not found" in p.message


def test_attribute_not_found_suggests(write_manifest):
    (p,) = problems(write_manifest(GOOD.replace("k.py:kern", "k.py:kernn"), {"k.py": KERNEL_PY}))
    assert p.line == 4 and "attribute 'kernn' not found" in p.message and "did you mean 'kern'" in p.hint


def test_module_reference_not_found(write_manifest):
    (p,) = problems(write_manifest(GOOD.replace("k.py:kern", "no_such_pkg.mod:kern"), {"k.py": KERNEL_PY}))
    assert "module 'no_such_pkg.mod' not found" in p.message


def test_module_reference_attribute_checked(write_manifest):
    path = write_manifest(GOOD.replace("k.py:kern", "json:dumpz"), {"k.py": KERNEL_PY})
    (p,) = problems(path)
    assert "attribute 'dumpz' not found" in p.message and "dump" in p.hint


def test_yaml_syntax_error(write_manifest):
    (p,) = problems(write_manifest(GOOD + "  - name: [unclosed\n", {"k.py": KERNEL_PY}))
    assert p.line is not None and p.line >= 7 and "YAML syntax error" in p.message


def test_duplicate_kernel_name(write_manifest):
    text = GOOD + GOOD.split("kernels:\n", 1)[1]
    (p,) = problems(write_manifest(text, {"k.py": KERNEL_PY}))
    assert p.line == 7 and "duplicate kernel name 'double'" in p.message and "kernels[0]" in p.hint


def test_duplicate_yaml_key(write_manifest):
    (p,) = problems(write_manifest(GOOD + "    kernel: k.py:ref\n", {"k.py": KERNEL_PY}))
    assert p.line == 7 and "duplicate key 'kernel'" in p.message


def test_unknown_gate_suggests(write_manifest):
    (p,) = problems(write_manifest(GOOD + "    gates: [oracel]\n", {"k.py": KERNEL_PY}))
    assert "unknown gate 'oracel'" in p.message and "did you mean 'oracle'" in p.hint


def test_bad_dtype_suggests(write_manifest):
    found = problems(write_manifest(GOOD + "    dtypes: [float61]\n", {"k.py": KERNEL_PY}))
    assert found[0].line == 7 and "float64" in (found[0].hint or "") + found[0].message


def test_negative_sizes_and_argument_indices_are_manifest_errors(write_manifest):
    """They passed validation and failed at run time as every kernel's error (exit 1), or were ignored."""
    found = problems(write_manifest(GOOD + "    shapes: [[1, -128]]\n    inplace: [-1]\n", {"k.py": KERNEL_PY}))
    assert [(p.line, "greater than or equal to 0" in p.message) for p in found] == [(7, True), (8, True)]


def test_dtype_aliases_accepted(write_manifest):
    manifest = load(write_manifest(GOOD + "    dtypes: [bf16, fp16]\n", {"k.py": KERNEL_PY}))
    assert manifest.kernels[0].dtypes == ["bfloat16", "float16"]


def test_bad_manifest_exits_2_and_runs_nothing(write_manifest, tmp_path, capsys):
    marker = tmp_path / "ran"
    kernel = KERNEL_PY + f"\nopen({str(marker)!r}, 'w').write('x')\n"
    path = write_manifest(GOOD.replace("    reference: k.py:ref", "    refrence: k.py:ref"), {"k.py": kernel})
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "kgate.yaml:5:5: error [kernels[0].refrence]: unknown key 'refrence'" in err.replace("\n", "")
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_manifest_not_found_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 2
    assert "kgate.yaml" in capsys.readouterr().err.replace("\n", "")


def test_schema_is_generated_from_the_model(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json.loads(json.dumps(json_schema()))
    entry = schema["$defs"]["KernelEntry"]
    assert {"name", "kernel", "reference"} <= set(entry["required"])
    assert entry["additionalProperties"] is False


def test_schema_validates_the_examples():
    import jsonschema
    import yaml

    from tests.conftest import ROOT

    for path in [ROOT / "examples" / "kgate.yaml"]:
        jsonschema.validate(yaml.safe_load(path.read_text()), json_schema())


def test_committed_schema_file_is_current():
    from tests.conftest import ROOT

    committed = json.loads((ROOT / "kgate.schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema())), "run `kgate schema -o kgate.schema.json`"
