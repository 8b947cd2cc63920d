"""The CLI end to end on the demo manifest: exit codes, selection, reports, reproducers."""

from __future__ import annotations

import json
import shlex
import xml.etree.ElementTree as ET

import pytest
import xmlschema

from kgate.cli import main
from kgate.report import Report
from tests.conftest import DATA, ROOT

DEMO = str(ROOT / "examples" / "kgate.yaml")
CORE = ["contract", "oracle", "special_values", "determinism", "input_integrity"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    code = main(["run", DEMO, "-q", "--out", str(out / "o"), "--json", str(out / "r.json"),
                 "--junit", str(out / "j.xml"), *[f"--gate={g}" for g in CORE]])
    return code, out


def test_demo_exit_code_is_1_with_violations(demo_run):
    assert demo_run[0] == 1


def test_demo_verdicts_name_the_right_gates(demo_run):
    report = Report.read(demo_run[1] / "r.json")
    failed = {k.name: {g.gate for g in k.violated} for k in report.kernels}
    assert failed["softmax-stable"] == set()
    assert "special_values" in failed["softmax-masked"]
    assert "oracle" in failed["softmax-fp16-accum"]
    assert "special_values" in failed["softmax-naive"]
    assert "input_integrity" in failed["softmax-inplace"]
    assert "determinism" in failed["softmax-atomic-order"]
    assert "contract" in failed["softmax-squeezed"]


def test_json_report_is_complete(demo_run):
    data = json.loads((demo_run[1] / "r.json").read_text())
    assert data["summary"]["kernels"] == 7 and data["summary"]["exit_code"] == 1
    stable = next(k for k in data["kernels"] if k["name"] == "softmax-stable")
    assert stable["source_file"].endswith("softmax.py") and stable["source_line"] > 0
    assert [g["gate"] for g in stable["gates"]] == CORE
    assert (demo_run[1] / "o" / "report.json").exists()
    assert len((demo_run[1] / "o" / "results.jsonl").read_text().splitlines()) == 7 * len(CORE)


def test_junit_validates_against_schema(demo_run):
    xml = (demo_run[1] / "j.xml").read_text()
    xmlschema.XMLSchema(str(DATA / "junit.xsd")).validate(xml)
    root = ET.fromstring(xml)
    suites = root.findall("testsuite")
    assert len(suites) == 7 and all(len(s.findall("testcase")) == len(CORE) for s in suites)
    masked = next(s for s in suites if s.get("name") == "softmax-masked")
    failure = next(c for c in masked.findall("testcase") if c.get("name") == "special_values").find("failure")
    assert "the oracle gives NaN" in failure.get("message")
    assert "reproduce: kgate run" in failure.text


def test_repro_command_reproduces_only_that_failure(demo_run, tmp_path):
    report = Report.read(demo_run[1] / "r.json")
    finding = next(g for k in report.kernels if k.name == "softmax-fp16-accum" for g in k.violated)
    argv = shlex.split(finding.repro)
    assert argv[:2] == ["kgate", "run"]
    assert main(argv[1:] + ["-q", "--out", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 1
    again = Report.read(tmp_path / "r.json")
    assert [k.name for k in again.kernels] == ["softmax-fp16-accum"]
    assert [(g.gate, g.verdict) for g in again.kernels[0].gates] == [(finding.gate, "fail")]


def test_passing_selection_exits_0(tmp_path):
    assert main(["run", DEMO, "-q", "-k", "stable", "--gate", "contract,input_integrity",
                 "--out", str(tmp_path)]) == 0


def test_k_expression(tmp_path):
    assert main(["run", DEMO, "-q", "-k", "softmax and not (naive or masked or fp16 or inplace or atomic or "
                 "squeezed)", "--gate", "contract", "--out", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0
    assert [k.name for k in Report.read(tmp_path / "r.json").kernels] == ["softmax-stable"]


@pytest.mark.parametrize("argv", [
    ["run", DEMO, "-k", "nothing-matches"],
    ["run", DEMO, "--gate", "oracel"],
    ["run", DEMO, "--dtype", "float13"],
    ["run", DEMO, "--shape", "a,b"],
    ["run", DEMO, "-k", "stable and"],
    ["run", DEMO, "--memory", "lots"],
    ["frobnicate"],
])
def test_usage_errors_exit_2(argv, tmp_path, capsys):
    assert main(argv + (["--out", str(tmp_path)] if argv[0] == "run" else [])) == 2


def test_help_explains(capsys):
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    assert "Exit 0 when all pass, 1 on any violation" in text.replace("\n", " ").replace("  ", " ")


def test_gates_lists_registered_gates(capsys):
    from kgate.gates import GATE_NAMES

    assert main(["gates"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in GATE_NAMES)


def test_unwritable_output_folder_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", DEMO, "-q", "-k", "softmax-stable", "--out", str(blocker / "out")]) == 2
    assert "cannot write to the output folder" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a visible GPU")
def test_a_cuda_device_that_is_not_there_is_exit_2_not_every_kernel_broken(tmp_path, capsys):
    code = main(["run", DEMO, "-q", "-k", "softmax-stable", "--device", "cuda", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "no such CUDA device here" in " ".join(capsys.readouterr().err.split())
