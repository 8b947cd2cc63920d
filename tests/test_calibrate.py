"""kgate calibrate: tolerance-based verdicts move with the factor, tolerance-free ones never do."""

from __future__ import annotations

import pytest

from kgate.cli import main
from kgate.commands.calibrate import classify
from kgate.gates.base import GateResult
from kgate.report import KernelResult, Report
from tests.conftest import ROOT


def evidence(err, ref_err, floor=0.0, factor=8.0):
    return {"case": {"shape": None, "dtype": "float32", "seed": 0}, "path": "out", "err": err,
            "ref_err": ref_err, "floor": floor, "factor": factor, "bound": factor * ref_err + floor}


def report() -> Report:
    near_fail = GateResult("oracle", "fail", "miss", False, evidence=[evidence(2e-6, 1e-7)])  # passes from 2.5x
    near_pass = GateResult("oracle", "pass", "ok", False, evidence=[evidence(5e-7, 1e-7)])  # fails below 0.625x
    far = GateResult("oracle", "fail", "way off", False, evidence=[evidence("inf", 1e-7)])
    free = GateResult("determinism", "fail", "differs", True)
    not_tolerance = GateResult("shapes", "fail", "wrong dtype at shape (1, 1)", False,
                               evidence=[evidence(1e-8, 1e-7)])
    errored = GateResult("distributions", "error", "kernel raised", False)
    return Report(manifest="kgate.yaml", kernels=[
        KernelResult("a", "k", "r", "cpu", [near_fail, free]),
        KernelResult("b", "k", "r", "cpu", [near_pass, not_tolerance, errored]),
        KernelResult("c", "k", "r", "cpu", [far]),
    ])


def test_classify_separates_fixed_from_sweepable():
    sweepable, fixed = classify(report())
    assert [(s.kernel, s.result.verdict) for s in sweepable] == [("a", "fail"), ("b", "pass"), ("c", "fail")]
    reasons = {(k, r.gate): why for k, r, why in fixed}
    assert reasons == {("a", "determinism"): "tolerance-free", ("b", "shapes"): "not explained by the tolerance",
                       ("b", "distributions"): "error"}
    a, b, c = sweepable
    assert a.threshold() == pytest.approx(2.5) and b.threshold() == pytest.approx(0.625)
    assert c.threshold() == float("inf")
    assert [a.verdict_at(m) for m in (1, 2, 4)] == ["fail", "fail", "pass"]
    assert [b.verdict_at(m) for m in (0.5, 1)] == ["fail", "pass"]
    assert c.verdict_at(1e9) == "fail"


def test_cli_prints_moves_per_factor(tmp_path, capsys):
    path = tmp_path / "r.json"
    report().write(path)
    assert main(["calibrate", str(path), "--factors", "0.5,1,4"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.splitlines() if line.startswith("│") and "x" in line.split("│")[1]}
    # columns: pass, fail, pass->fail, fail->pass, moved, fixed
    assert rows["1x"] == ["1", "2", "0", "0", "0", "3"]
    assert rows["0.5x"] == ["0", "3", "1", "0", "1", "3"]
    assert rows["4x"] == ["2", "1", "0", "1", "1", "3"]
    assert "1 tolerance-free (fixed)" in out and "a/oracle" in out


def test_bad_factors_and_bad_report_are_usage_errors(tmp_path, capsys):
    path = tmp_path / "r.json"
    report().write(path)
    assert main(["calibrate", str(path), "--factors", "x"]) == 2
    assert main(["calibrate", str(tmp_path / "missing.json")]) == 2
    assert "report not found" in capsys.readouterr().err


def test_on_a_real_report_tolerance_free_verdicts_never_move(tmp_path, capsys):
    json_path = tmp_path / "r.json"
    main(["run", str(ROOT / "examples" / "kgate.yaml"), "-q", "-k", "softmax-stable or softmax-fp16-accum",
          "--gate", "oracle", "--gate", "determinism", "--out", str(tmp_path / "o"), "--json", str(json_path)])
    capsys.readouterr()
    sweepable, fixed = classify(Report.read(json_path))
    assert {r.gate for _, r, _ in fixed} == {"determinism"}
    by = {s.kernel: s for s in sweepable}
    assert by["softmax-fp16-accum"].result.verdict == "fail" and by["softmax-stable"].result.verdict == "pass"
    assert by["softmax-fp16-accum"].threshold() > 1 > by["softmax-stable"].threshold()
    assert main(["calibrate", str(json_path)]) == 0
