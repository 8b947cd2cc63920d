"""kgate selftest: the whole CPU catalogue gets its expected verdicts; a wrong expectation is reported."""

from __future__ import annotations

import textwrap

import pytest

from kgate.cli import main
from kgate.commands.selftest import judge
from kgate.gates.base import GateResult
from kgate.manifest import load
from kgate.report import KernelResult


@pytest.mark.slow
def test_cpu_catalogue_all_as_expected(tmp_path, capsys):
    code = main(["selftest", "--device", "cpu", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert code == 0, out[-4000:]
    assert last.startswith("selftest: ") and last.endswith(" controls as expected")
    good, total = last.removeprefix("selftest: ").split()[0].split("/")
    assert good == total and int(total) >= 27
    assert "skipped: needs cuda" in out  # the CUDA variants are listed, not run
    assert (tmp_path / "out" / "report.json").is_file()
    # the correct controls: every gate they select judged them, stacked in one worker (forward and backward),
    # and passed; a skip is the exception (a gate with nothing to judge there), never the rule
    import json

    report = json.loads((tmp_path / "out" / "report.json").read_text())
    correct = [k for k in report["kernels"] if "-correct-" in k["name"]]
    assert len(correct) >= 12
    for kernel in correct:
        verdicts = [g["verdict"] for g in kernel["gates"]]
        assert set(verdicts) <= {"pass", "skip"}, (kernel["name"], kernel["gates"])
        assert verdicts.count("pass") >= len(verdicts) - 2, (kernel["name"], verdicts)


CATALOGUE = """\
version: 1
defaults: {device: cpu, seeds: [0]}
kernels:
  - name: right-but-expected-to-fail
    kernel: k.py:good
    reference: k.py:ref
    inputs: k.py:make
    gates: [oracle, determinism]
    expect: {oracle: fail}
  - name: gpu-only
    kernel: k.py:good
    reference: k.py:ref
    inputs: k.py:make
    device: cuda
    gates: [oracle]
    expect: {oracle: pass}
"""
KERNELS = """\
import torch
def make(seed, dtype=torch.float32):
    return (torch.linspace(-1, 1, 16, dtype=dtype),)
def ref(x):
    return torch.tanh(x)
def good(x):
    return torch.tanh(x)
"""


def test_wrong_expectation_exits_1_and_says_why(tmp_path, capsys):
    (tmp_path / "k.py").write_text(KERNELS)
    (tmp_path / "cat.yaml").write_text(CATALOGUE)
    code = main(["selftest", "--catalogue", str(tmp_path / "cat.yaml"), "--device", "cpu", "--out",
                 str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 1
    assert "UNEXPECTED right-but-expected-to-fail / oracle: expected fail, got pass" in out
    assert out.strip().splitlines()[-1] == "selftest: 0/1 controls as expected"
    assert "1 control(s) skipped" in out


def test_missing_catalogue_is_a_usage_error(tmp_path, capsys):
    assert main(["selftest", "--catalogue", str(tmp_path / "nope.yaml")]) == 2
    assert "catalogue not found" in capsys.readouterr().err


def _result(**verdicts):
    return KernelResult("c", "k", "r", "cpu", [GateResult(g, v, f"{g} said {v}", True) for g, v in verdicts.items()])


def test_judge_semantics(tmp_path):
    (tmp_path / "k.py").write_text(KERNELS)
    (tmp_path / "m.yaml").write_text(textwrap.dedent("""\
        version: 1
        kernels:
          - {name: c, kernel: k.py:good, reference: k.py:ref, expect: {oracle: fail, "oracle[backward]": pass},
             backward: true}
        """))
    kernel = load(tmp_path / "m.yaml").kernels[0]
    assert judge(kernel, _result(oracle="fail", contract="pass", bounds="skip", **{"oracle[backward]": "pass"})) == []
    problems = judge(kernel, _result(oracle="fail", contract="fail", **{"oracle[backward]": "pass"}))
    assert problems == ["contract: expected pass or skip, got fail: contract said fail"]
    problems = judge(kernel, _result(oracle="error"))
    assert problems[0].startswith("oracle: expected fail, got error")
    assert "oracle[backward]: expected pass, but the gate did not run" in problems[1]
