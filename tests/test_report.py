"""The JSON report's rules that span gates (kgate.report)."""

from __future__ import annotations

from kgate.gates.base import GateResult
from kgate.report import KernelResult, Report


def _kernel(*gates):
    return KernelResult(name="k", kernel="k.py:k", reference="k.py:r", device="cpu", gates=list(gates))


def _unwritten(shape, gate="initialization"):
    return GateResult(gate, "fail", "out: 3 of 3 element(s) depend on what the memory held", True,
                      where="out[0, 0]", case={"shape": shape, "dtype": "float32", "seed": 0}, broken=True)


def _numeric(gate, shape):
    return GateResult(gate, "fail", f"shape {shape}: max abs error 0.00012 at out[0, 0]", False,
                      case={"shape": shape, "dtype": "float32", "seed": 0})


def test_a_numeric_failure_where_outputs_are_unwritten_defers_to_initialization():
    """A tail the kernel never writes showed as a tiny numeric error at shape (1, 1) whose reproducer gave
    another value each time: the oracle and shapes findings now say it is initialization's."""
    kernel = _kernel(_numeric("shapes", [1, 1]), _numeric("oracle", [16, 37]), _unwritten([1, 1]))
    shapes, oracle, _ = kernel.gates
    assert shapes.details["see"] == "initialization" and "this error is what that memory held" in shapes.message
    assert oracle.details["see"] == "initialization" and "may be what that memory held" in oracle.message
    assert kernel.verdict == "fail"  # verdicts stay
    again = Report.from_json(Report(manifest="m", kernels=[kernel]).to_json()).kernels[0]
    assert again.gates[0].message.count("memory held") == 1  # read back, not marked twice


def test_numeric_failures_stand_alone_when_every_output_is_written():
    passed = GateResult("initialization", "pass", "outputs identical", True)
    other_phase = _unwritten([1, 1], gate="initialization[backward]")
    kernel = _kernel(_numeric("shapes", [1, 1]), passed, other_phase,
                     GateResult("special_values", "fail", "NaN dropped", True))
    assert all("see" not in (g.details or {}) for g in kernel.gates), [g.message for g in kernel.gates]
    assert "memory held" not in kernel.gates[0].message
