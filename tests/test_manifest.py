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


def test_integer_dtypes_say_which_dtypes_and_why(write_manifest):
    found = problems(write_manifest(GOOD + "    dtypes: [float32, int32]\n", {"k.py": KERNEL_PY}))
    (p,) = found
    assert (p.line, p.key) == (7, "kernels[0].dtypes[1]")
    assert "integer dtype 'int32'" in p.message and "float16, bfloat16, float32, float64" in p.message
    assert "inputs factory" in p.hint and "eps" in p.hint and "dtype: int64" in p.hint
    text = GOOD.replace("    inputs: k.py:make_inputs\n", "    inputs: [{shape: [4], dtype: uint32}]\n")
    (p,) = problems(write_manifest(text, {"k.py": KERNEL_PY}))
    assert p.key == "kernels[0].inputs[0].dtype" and "integer dtype 'uint32'" in p.message
    assert "int8, int16, int32, int64, uint8, bool" in p.message and "inputs factory" in p.hint
    text = GOOD.replace("    inputs: k.py:make_inputs\n", "    inputs: [{shape: [4], dtype: long}, {dtype: bool}]\n")
    assert [spec.dtype for spec in load(write_manifest(text, {"k.py": KERNEL_PY})).kernels[0].inputs] == \
        ["int64", "bool"]


@pytest.mark.parametrize("entry, key, message, hint", [
    ("    gates: 5\n", "kernels[0].gates", "expected 'all', a list or a mapping with keys include, exclude (got 5)",
     None),
    ("    gates: al\n", "kernels[0].gates", "expected 'all', a list or a mapping", "did you mean 'all'?"),
    ("    inputs: 5\n", "kernels[0].inputs", "expected a string or a list (got 5)", "inputs: factory 'file.py:"),
    ("    gates: {include: oracle}\n", "kernels[0].gates.include", "Input should be a valid list (got 'oracle')",
     "for a single item, write a list: [oracle]"),
    ("    files: '*.py'\n", "kernels[0].files", "Input should be a valid list (got '*.py')",
     'for a single item, write a list: ["*.py"]'),  # bare, *.py would be a YAML alias
    ("    gates: {includ: [oracle]}\n", "kernels[0].gates.includ", "unknown key 'includ'", "did you mean 'include'?"),
    ("    device: gpu\n", "kernels[0].device", "device 'gpu' is not one of auto, cpu, cuda, cuda:N", "'cuda'"),
    ("    seeds: []\n", "kernels[0].seeds", "needs at least 1 item(s), has 0", None),
    ("    tolerance: 5\n", "kernels[0].tolerance", "expected a mapping with keys factor, ulps, atol (got 5)", None),
])
def test_one_clean_message_per_problem(write_manifest, entry, key, message, hint):
    """A union (gates: 'all' | list | mapping) used to give one message per member, and validators' messages
    came with pydantic's 'Value error, ' in front."""
    text = GOOD.replace("    inputs: k.py:make_inputs\n", "") + entry
    (p,) = problems(write_manifest(text, {"k.py": KERNEL_PY}))
    assert (p.line, p.key) == (6, key) and p.message.startswith(message), p.format()
    assert hint is None or hint in (p.hint or ""), p.format()


def test_bad_reference_syntax_and_declarative_inputs_give_one_message_each(write_manifest, tmp_path, capsys):
    text = GOOD.replace("kernel: k.py:kern", "kernel: k.py").replace(
        "    inputs: k.py:make_inputs\n", "    inputs: [{shape: [4], dtype: float61}]\n")
    path = write_manifest(text, {"k.py": KERNEL_PY})
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count(": error [") == 2, err
    assert "Value error" not in err and "valid string" not in err
    assert "kgate.yaml:4:5: error [kernels[0].kernel]: 'k.py' is not 'path/to/file.py:attr'" in err
    assert "hint: add ':' and the name of the function or nn.Module instance, e.g. 'k.py:my_kernel'" in err
    assert "kgate.yaml:6:27: error [kernels[0].inputs[0].dtype]: unsupported dtype 'float61'" in err


def _package(folder, name: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text("")
    (folder / name / "ops.py").write_text("def kern(x):\n    return x + x\n")


def test_module_reference_resolved_as_the_worker_will(write_manifest, tmp_path, monkeypatch):
    """The worker starts in the manifest's folder, without the caller's folder on sys.path (kgate.runner
    kgate_command): a package that imports only from there validated, then failed in every gate."""
    caller = tmp_path / "caller"
    _package(caller, "pkg_caller_only")
    path = write_manifest(GOOD.replace("k.py:kern", "pkg_caller_only.ops:kern"), {"m/k.py": KERNEL_PY},
                          name="m/kgate.yaml")
    monkeypatch.chdir(caller)
    monkeypatch.syspath_prepend(str(caller))  # as `python -m kgate` run from there has it
    (p,) = problems(path)
    assert (p.line, p.key) == (4, "kernels[0].kernel")
    assert "module 'pkg_caller_only.ops' not found on the worker's Python path" in p.message
    assert str(caller) in p.message and "PYTHONPATH" in p.hint and str(path.parent) in p.hint
    monkeypatch.setenv("PYTHONPATH", str(caller))  # the workers inherit it
    assert load(path).kernels[0].kernel.module == "pkg_caller_only.ops"


def test_module_reference_beside_the_manifest_validates_and_runs(write_manifest, tmp_path, monkeypatch):
    path = write_manifest(GOOD.replace("k.py:kern", "pkg_beside.ops:kern"), {"m/k.py": KERNEL_PY},
                          name="m/kgate.yaml")
    _package(path.parent, "pkg_beside")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    kernel = load(path).kernels[0]
    assert kernel.source_location() == (str(path.parent / "pkg_beside" / "ops.py"), 1)
    assert main(["run", str(path), "--gate", "contract", "--device", "cpu", "-q", "--out", str(tmp_path / "o")]) == 0


MODULES_PY = """
import torch
from torch import nn

def make_inputs(seed, shape=None):
    return (torch.randn(shape or (4, 4)),)

class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2

class Base(nn.Module):
    pass

class Tripler(Base):
    def forward(self, x):
        return x * 3

doubler = Doubler()
"""


def test_module_class_where_an_instance_is_expected(write_manifest):
    text = GOOD.replace("kernel: k.py:kern", "kernel: k.py:Tripler").replace("reference: k.py:ref",
                                                                             "reference: k.py:Doubler")
    kernel, reference = problems(write_manifest(text, {"k.py": MODULES_PY}))
    assert (kernel.line, kernel.key) == (4, "kernels[0].kernel")
    assert "'Tripler' is an nn.Module class, but the kernel must be an instance" in kernel.message
    assert "`tripler = Tripler(...)`" in kernel.hint and "'k.py:tripler'" in kernel.hint
    assert (reference.line, reference.key) == (5, "kernels[0].reference")
    assert reference.hint == "name the instance the file makes: 'k.py:doubler'"
    load(write_manifest(text.replace("k.py:Tripler", "k.py:doubler").replace("k.py:Doubler", "k.py:doubler"),
                        {"k.py": MODULES_PY}))


def test_each_manifest_problem_is_a_line_of_its_own_starting_with_file_line_col(write_manifest, tmp_path, capsys):
    """Editors and CI problem matchers read `file:line:col: error ...` at the start of a line: a prefix
    before the first problem (`kgate: /path/kgate.yaml:5:5: ...`) hid it from them."""
    text = GOOD.replace("    reference: k.py:ref", "    refrence: k.py:ref") + "    dtypes: [float61]\n"
    path = write_manifest(text, {"k.py": KERNEL_PY})
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    problems = [line for line in lines if ": error [" in line]
    assert len(problems) >= 2, lines  # the misspelt key, the dtype (and the reference now missing)
    assert lines[0] == f"kgate: {len(problems)} problem(s) in the manifest", lines
    assert all(line.startswith(f"{path}:") for line in problems), problems


def test_an_imported_module_class_named_as_the_kernel_is_a_load_error_that_says_so(write_manifest, tmp_path,
                                                                                  capsys):
    """The manifest's check reads the classes a file defines; one imported from another file reaches the
    worker, where calling it built a module and every gate failed on a 'Tripler' output."""
    text = GOOD.replace("kernel: k.py:kern", "kernel: k.py:Tripler")
    files = {"k.py": KERNEL_PY + "\nfrom mods import Tripler\n", "mods.py": MODULES_PY}
    path = write_manifest(text, files)
    load(path)  # not visible without importing
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--gate", "contract", "--device", "cpu", "-q"]) == 1
    report = json.loads((out / "report.json").read_text())
    (result,) = report["kernels"][0]["gates"]
    assert result["verdict"] == "error"
    assert "is the nn.Module class 'Tripler'; the kernel must be an instance" in result["message"], result["message"]


def test_a_class_name_rebound_to_its_instance_is_an_instance(write_manifest):
    """`class Tripler(nn.Module)` then `Tripler = Tripler()`: the name is the instance, a valid kernel."""
    text = GOOD.replace("kernel: k.py:kern", "kernel: k.py:Tripler")
    load(write_manifest(text, {"k.py": KERNEL_PY + MODULES_PY + "\nTripler = Tripler()\n"}))
    with pytest.raises(ManifestError):  # the class itself still is not
        load(write_manifest(text, {"k.py": KERNEL_PY + MODULES_PY}))


def test_a_complex_yaml_key_is_a_problem_not_a_crash(write_manifest):
    (p,) = problems(write_manifest("version: 1\n? [1, 2]\n: x\nkernels: []\n"))
    assert p.line == 2 and "a key must be a name" in p.message, p.format()


@pytest.mark.parametrize("name, why", [
    ("HOME", "kgate sets it itself"), ("LD_PRELOAD", "decides which code runs"),
    ("PYTHONPATH", "decides which code runs"), ("GITHUB_TOKEN", "looks like a secret"),
    ("flaggems_cache_dir", "not an environment variable name in capitals"),
])
def test_cache_env_refuses_what_kgate_keeps_and_secrets(write_manifest, name, why):
    from kgate.errors import ManifestError

    path = write_manifest(f"""
        version: 1
        defaults:
          cache_env: [{name}]
        kernels:
          - name: k
            kernel: k.py:k
            reference: k.py:k
        """)
    with pytest.raises(ManifestError) as err:
        load(path)
    assert name in str(err.value) and why.split()[-1] in str(err.value)


def test_cache_env_changes_no_kernels_digest(write_manifest):
    """Where a library keeps its caches changes nothing judged: naming one keeps every result of kgate run
    --resume (FlagGems' field results were judged before it was named)."""
    text = """
        version: 1
        defaults:
          device: cpu
          {cache}
        kernels:
          - name: k
            kernel: k.py:k
            reference: k.py:k
            {own}
        """
    files = {"k.py": "def k(x):\n    return x\n"}
    digests = [load(write_manifest(text.format(cache=cache, own=own), files=files, name=f"m{i}.yaml")).kernels[0]
               for i, (cache, own) in enumerate([("", ""), ("cache_env: [FLAGGEMS_CACHE_DIR]", ""),
                                                  ("", "cache_env: [FLAGGEMS_CACHE_DIR]")])]
    assert digests[1].cache_env == digests[2].cache_env == ["FLAGGEMS_CACHE_DIR"] and digests[0].cache_env == []
    assert len({d.digest() for d in digests}) == 1
