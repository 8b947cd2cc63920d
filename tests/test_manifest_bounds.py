"""The manifest loader under hostile or careless input: every bad manifest is exit 2 with file, line and
what to do, at once and in bounded memory; never a traceback, never a pass decided at run time."""

from __future__ import annotations

import os
import sys
import time

import pytest

from kgate.cli import main
from kgate.errors import ManifestError
from kgate.manifest import MAX_DEPTH, MAX_MANIFEST_BYTES, load
from tests.test_manifest import KERNEL_PY

ENTRY = """\
  - name: double
    kernel: k.py:kern
    reference: k.py:ref
    inputs: k.py:make_inputs
"""
GOOD = "version: 1\nkernels:\n" + ENTRY


def problems(path):
    with pytest.raises(ManifestError) as info:
        load(path, check_files=False)
    return info.value.problems


def one(path, text: str):
    found = problems(path)
    assert any(text in p.message for p in found), f"expected a problem saying {text!r}, got {found}"
    return next(p for p in found if text in p.message)


def exit_code(path, capsys) -> tuple[int, str]:
    code = main(["run", str(path), "--out", str(path.parent / "out")])
    return code, capsys.readouterr().err


def test_alias_bomb_is_refused_at_once(write_manifest, capsys):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]")
    path = write_manifest("version: 1\n" + "\n".join(lines) + "\nkernels:\n" + ENTRY, {"k.py": KERNEL_PY})
    started = time.monotonic()
    code, err = exit_code(path, capsys)
    assert code == 2 and "aliases expand to more than" in err, err
    assert time.monotonic() - started < 5, "an alias bomb must be refused before it is expanded"


def test_an_alias_inside_its_own_anchor_is_refused(write_manifest):
    path = write_manifest("version: 1\nx-loop: &a [1, *a]\nkernels:\n" + ENTRY)
    one(path, "refers to the value that contains it")


def test_deep_nesting_is_a_problem_with_its_line(write_manifest, capsys):
    deep = "[" * 5000 + "]" * 5000
    path = write_manifest(GOOD + f"    shapes: {deep}\n", {"k.py": KERNEL_PY})
    code, err = exit_code(path, capsys)
    assert code == 2 and "kgate.yaml:7:" in err and "Traceback" not in err, err
    assert f"nested deeper than {MAX_DEPTH} levels" in err or "maximum nesting depth" in err, err  # (libyaml's own)


def test_nesting_past_the_limit_is_refused_in_block_style(write_manifest):
    block = "".join(" " * (4 + 2 * i) + f"k{i}:\n" for i in range(40))
    path = write_manifest(GOOD + "    x:\n" + block + " " * 84 + "v: 1\n")
    one(path, f"nested deeper than {MAX_DEPTH} levels")


def test_nesting_through_aliases_is_bounded_too(write_manifest):
    anchor = "&a " + "[" * 20 + "1" + "]" * 20
    path = write_manifest(f"version: 1\nx-deep: {anchor}\nkernels:\n" + ENTRY.rstrip("\n")
                          + "\n    shapes: " + "[" * 20 + "*a" + "]" * 20 + "\n")
    one(path, f"nested deeper than {MAX_DEPTH} levels")


def test_a_manifest_over_the_size_limit_is_refused_unread(write_manifest):
    path = write_manifest(GOOD + "# " + "x" * MAX_MANIFEST_BYTES + "\n")
    problem = one(path, "larger than kgate's limit of 1 MiB")
    assert problem.hint


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_not_read(capsys):
    started = time.monotonic()
    assert main(["run", "/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert time.monotonic() - started < 5


def test_a_folder_as_the_manifest_names_the_file_to_give(tmp_path):
    problem = one(tmp_path, "is a folder")
    assert "kgate.yaml" in problem.hint


def test_not_utf8_names_line_and_column(write_manifest):
    path = write_manifest(GOOD)
    path.write_bytes(path.read_bytes().replace(b"double", b"dou\xffble"))
    problem = one(path, "not UTF-8")
    assert (problem.line, problem.column) == (3, 14)


def test_merge_key_takes_the_base_and_keeps_what_the_entry_sets(write_manifest):
    path = write_manifest("""\
        version: 1
        x-base: &base
          kernel: k.py:kern
          reference: k.py:ref
          dtypes: [float16]
        kernels:
          - <<: *base
            name: double
            dtypes: [float32]
          - <<: [*base]
            name: twice
        """, {"k.py": KERNEL_PY})
    manifest = load(path)
    first, second = manifest.kernels
    assert (first.kernel.attr, first.dtypes) == ("kern", ["float32"])  # the entry's own key wins
    assert (second.reference.attr, second.dtypes) == ("ref", ["float16"])


def test_merge_of_a_scalar_is_a_problem(write_manifest):
    path = write_manifest("version: 1\nkernels:\n  - <<: 3\n    name: x\n    kernel: k.py:a\n    reference: k.py:b\n")
    one(path, "`<<` merges a mapping")


def test_a_huge_version_is_reported_with_the_other_problems(write_manifest, capsys):
    path = write_manifest("version: " + "9" * 5000 + "\n" + "kernels:\n" + ENTRY.replace("double", "a" * 5000))
    code, err = exit_code(path, capsys)
    assert code == 2 and "Traceback" not in err
    assert "kgate.yaml:1:10: error [version]: a number of 5000 digits" in err, err
    assert "[kernels[0].name]" in err and "at most 200 characters" in err, err
    assert len(err) < 3000, "values thousands of characters long are shortened in messages"


def test_a_bad_version_does_not_hide_the_other_problems(write_manifest):
    path = write_manifest("version: 7\nkernels:\n" + ENTRY.replace("kernel:", "kernal:"))
    keys = {p.key for p in problems(path)}
    assert {"version", "kernels[0].kernal", "kernels[0].kernel"} <= keys, keys


def test_thousands_of_bad_entries_answer_fast_and_print_a_capped_list(write_manifest, capsys):
    entries = "".join(f"  - name: e{i}\n    kernal: k.py:kern\n    reference: k.py:ref\n    shapes: [[a]]\n"
                      for i in range(2000))
    path = write_manifest("version: 7\nkernels:\n" + entries)
    started = time.monotonic()
    code, err = exit_code(path, capsys)
    seconds = time.monotonic() - started
    assert code == 2 and seconds < 5, f"2000 bad entries took {seconds:.1f} s"
    assert "6001 problem(s) in the manifest" in err, err[:300]
    assert "... and 5951 more problem(s)" in err and err.count(": error") == 50, err[-300:]


@pytest.mark.parametrize("line, text", [
    ("limits: {memory: 0}", "out of range"),
    ("limits: {memory: -5}", "out of range"),
    ("limits: {memory: 99999999999TiB}", "out of range"),
    ("limits: {memory: " + "9" * 400 + "TiB}", "out of range"),
    ("limits: {timeout: .inf}", "finite"),
    ("shapes: [[1000000, 1000000]]", "over kgate's limit of 2^36"),
    ("shapes: [[4.0]]", "valid integer"),
    ("seeds: [1180591620717411303424]", "less than or equal to 4294967295"),
    ("seeds: [-1]", "greater than or equal to 0"),
    ("tolerance: {factor: .inf}", "finite"),
    ("tolerance: {ulps: .nan}", "finite"),
    ("gates: {include: []}", "selects no gate"),
    ("gates: []", "selects no gate"),
    ("gates: {include: [oracle], exclude: [oracle]}", "selects no gate"),
    ("inputs: [{shape: [4]}]\n    inplace: [99]", "argument 99 is not one of the 1 declared inputs"),
])
def test_values_that_cannot_run_are_problems_at_load(write_manifest, line, text):
    entry = ENTRY.replace("    inputs: k.py:make_inputs\n", "") if line.startswith("inputs") else ENTRY
    path = write_manifest("version: 1\nkernels:\n" + entry + f"    {line}\n", {"k.py": KERNEL_PY})
    problem = one(path, text)
    assert problem.line is not None and problem.key.startswith("kernels[0]"), problem


def test_zero_gates_in_the_defaults_is_a_problem_there(write_manifest):
    path = write_manifest("version: 1\ndefaults: {gates: []}\nkernels:\n" + ENTRY)
    problem = one(path, "selects no gate")
    assert problem.key == "defaults.gates" and problem.line == 2


@pytest.mark.parametrize("name", ["/tmp/x", "../../x", "a/../../x", "a//b", "."])
def test_a_corpus_name_cannot_lead_out_of_the_output_folder(write_manifest, name):
    path = write_manifest(f"version: 1\nkernels:\n  - name: {name}\n    format: kernelbench\n"
                          "    problems: p\n    candidates: c\n")
    one(path, "is not a plain relative folder name")


def test_values_at_their_limits_are_accepted(write_manifest):
    path = write_manifest("version: 1\nkernels:\n" + ENTRY + "    shapes: [[65536, 1048576], [0], []]\n"
                          "    seeds: [0, 4294967295]\n    limits: {memory: 64MiB, timeout: 604800}\n"
                          "    gates: {exclude: [bounds]}\n"
                          "  - name: corpus/level1\n    format: kernelbench\n    problems: .\n    candidates: .\n",
                          {"k.py": KERNEL_PY})
    manifest = load(path)
    assert manifest.kernels[0].limits.memory == 64 * 2**20 and manifest.kernelbench[0].name == "corpus/level1"


def test_declarative_inplace_within_the_inputs_is_accepted(write_manifest):
    path = write_manifest("version: 1\nkernels:\n  - name: acc\n    kernel: k.py:kern\n    reference: k.py:ref\n"
                          "    inputs: [{shape: [4]}, {shape: [4]}]\n    inplace: [1]\n", {"k.py": KERNEL_PY})
    assert load(path).kernels[0].entry.inplace == [1]


def test_loading_imports_no_gate(write_manifest):
    """manifest sits below the gates: it knows their names (kgate.names) without importing them."""
    import subprocess

    path = write_manifest(GOOD, {"k.py": KERNEL_PY})
    code = ("import sys; from kgate.manifest import load; load(sys.argv[1]); "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('kgate.gates', 'kgate.runner'))); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
