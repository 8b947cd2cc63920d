"""Gradients (`backward: true`): the gates judge the backward pass as separate `[backward]` results; a
right forward with a wrong backward fails."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from kgate import gates as registry
from kgate.backward import BackwardSubject
from kgate.cli import main
from kgate.manifest import load
from kgate.report import Report
from kgate.runner import Runner, RunOptions
from kgate.subject import UserCodeError
from tests.gate_harness import subject_for


def rows(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (4, 9), generator=gen, dtype=torch.float64) * 3).to(dtype),)


class SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * s * (1 + x * (1 - s))


class SiLUWrongGrad(SiLU):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


def backward_check(gate, kernel, reference=torch.nn.functional.silu, **kw):
    subject = BackwardSubject(subject_for(kernel, reference, rows, backward=True, **kw))
    return registry.get(gate).check(subject)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_wrong_backward_fails_oracle(dtype):
    result = backward_check("oracle", SiLUWrongGrad.apply, dtypes=[dtype])
    assert result.verdict == "fail" and "max abs error" in result.message
    assert result.where.startswith("out[0]")  # the gradient w.r.t. argument 0


@pytest.mark.parametrize("gate", ["contract", "oracle", "special_values", "determinism", "input_integrity",
                                  "initialization", "bounds", "isolation"])
def test_correct_backward_passes(gate):
    result = backward_check(gate, SiLU.apply)
    assert result.verdict == "pass", result.message


def test_forward_alone_cannot_tell_them_apart():
    good = registry.get("oracle").check(subject_for(SiLU.apply, torch.nn.functional.silu, rows))
    bad = registry.get("oracle").check(subject_for(SiLUWrongGrad.apply, torch.nn.functional.silu, rows))
    assert good.verdict == bad.verdict == "pass"


def test_kernel_without_autograd_gets_a_clear_error():
    with pytest.raises(UserCodeError, match="no output of the kernel requires grad"):
        backward_check("oracle", lambda x: torch.nn.functional.silu(x.detach()))


def test_reference_with_wrong_autograd_is_refused_by_gradcheck():
    with pytest.raises(UserCodeError, match="gradcheck") as info:
        backward_check("oracle", SiLU.apply, reference=SiLUWrongGrad.apply)
    assert info.value.role == "reference (float64 autograd)"


class Scale(torch.nn.Module):
    def __init__(self, wrong=False):
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(9))
        self.wrong = wrong

    def forward(self, x):
        if self.wrong:  # the weight's gradient is lost: it enters as a constant
            return x * self.weight.detach() + 0 * self.weight
        return x * self.weight


def test_parameter_gradients_are_judged_for_modules():
    assert backward_check("oracle", Scale(), reference=Scale()).verdict == "pass"
    result = backward_check("oracle", Scale(wrong=True), reference=Scale())
    assert result.verdict == "fail" and result.where.startswith("out[1]")  # d/d weight, after d/d x


MANIFEST = """\
version: 1
defaults: {device: cpu, seeds: [0]}
kernels:
  - name: good
    kernel: k.py:good
    reference: k.py:ref
    inputs: k.py:make
    backward: true
    gates: [contract, oracle]
  - name: wrong-grad
    kernel: k.py:wrong
    reference: k.py:ref
    inputs: k.py:make
    backward: true
    gates: [contract, oracle]
"""
KERNELS = """\
import torch

def make(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, 9, generator=g, dtype=torch.float64).to(dtype),)

def ref(x):
    return torch.nn.functional.silu(x)

class _Good(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * s * (1 + x * (1 - s))

class _Wrong(_Good):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)

good = _Good.apply
wrong = _Wrong.apply
"""


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bw")
    (folder / "k.py").write_text(KERNELS)
    (folder / "kgate.yaml").write_text(MANIFEST)
    code = main(["run", str(folder / "kgate.yaml"), "-q", "--out", str(folder / "o"), "--json",
                 str(folder / "r.json"), "--junit", str(folder / "j.xml")])
    return code, folder


def test_backward_results_are_separate_gate_ids_in_every_report(cli_run):
    code, folder = cli_run
    assert code == 1
    report = Report.read(folder / "r.json")
    by = {k.name: {g.gate: g.verdict for g in k.gates} for k in report.kernels}
    assert by["good"] == {"contract": "pass", "oracle": "pass", "contract[backward]": "pass",
                          "oracle[backward]": "pass"}
    assert by["wrong-grad"] == {"contract": "pass", "oracle": "pass", "contract[backward]": "pass",
                                "oracle[backward]": "fail"}
    assert 'name="oracle[backward]"' in (folder / "j.xml").read_text()
    lines = [json.loads(line) for line in (folder / "o" / "results.jsonl").read_text().splitlines()]
    assert {(r["kernel"], r["gate"]) for r in lines} >= {("wrong-grad", "oracle[backward]")}


def test_gate_selection_picks_one_or_both_phases(cli_run):
    manifest = load(cli_run[1] / "kgate.yaml")
    kernel = manifest.by_name("good")
    both = Runner(manifest, [kernel], RunOptions(gates=["oracle"])).gates_for(kernel)
    one = Runner(manifest, [kernel], RunOptions(gates=["oracle[backward]"])).gates_for(kernel)
    assert both == ["oracle", "oracle[backward]"] and one == ["oracle[backward]"]


def test_the_command_line_selects_one_phase_and_rejects_unknown_ids(cli_run, tmp_path, capsys):
    folder = cli_run[1]
    code = main(["run", str(folder / "kgate.yaml"), "-q", "-k", "wrong-grad", "--gate", "oracle[backward]",
                 "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")])
    assert code == 1
    report = Report.read(tmp_path / "r.json")
    assert [(k.name, g.gate, g.verdict) for k in report.kernels for g in k.gates] == [
        ("wrong-grad", "oracle[backward]", "fail")]
    # the finding's reproducer names the phase, and the command line takes it as it is printed
    repro = shlex.split(report.kernels[0].gates[0].repro)
    assert repro[repro.index("--gate") + 1] == "oracle[backward]"
    assert main([*repro[1:], "-q", "--out", str(tmp_path / "again"), "--json", str(tmp_path / "again.json")]) == 1
    assert [g.gate for g in Report.read(tmp_path / "again.json").kernels[0].gates] == ["oracle[backward]"]
    assert main(["run", str(folder / "kgate.yaml"), "--gate", "oracel[backward]", "--out", str(tmp_path / "p")]) == 2
    assert "--gate oracel[backward]: unknown gate" in capsys.readouterr().err
    assert main(["audit", "--format", "kernelbench", "--problems", str(tmp_path), "--candidates", str(tmp_path),
                 "--gate", "oracle[backward]"]) == 2  # a KernelBench candidate has no gradients' phase


def test_console_shows_backward_ids(cli_run):
    from rich.console import Console

    from kgate.reports.console import render

    console = Console(width=240, record=True)
    render(console, Report.read(cli_run[1] / "r.json"), 1.0)
    text = console.export_text()
    assert "oracle[backward]" in text and "wrong-grad / oracle[backward]:" in text
