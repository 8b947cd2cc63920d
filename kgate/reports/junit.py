"""JUnit XML: one testsuite per kernel, one testcase per gate; the failure message is the gate's
one-line finding, the body the counterexample and the reproducer. Rendered by GitHub, GitLab and
Jenkins test reports."""

from __future__ import annotations

from pathlib import Path

from junit_xml import TestCase, TestSuite, to_xml_report_string

from kgate.gates.base import ERROR, FAIL, SKIP, GateResult
from kgate.report import Report


def _body(g: GateResult) -> str:
    lines = [g.message]
    for label, value in (("expected", g.expected), ("got", g.got), ("where", g.where)):
        if value:
            lines.append(f"{label}: {value}")
    if g.case:
        lines.append("case: " + ", ".join(f"{k}={v}" for k, v in g.case.items()))
    if g.repro:
        lines.append(f"reproduce: {g.repro}")
    trace = g.details.get("traceback") if isinstance(g.details, dict) else None
    if trace:
        lines.append(trace)
    tail = g.details.get("log_tail") if isinstance(g.details, dict) else None
    if tail:
        lines.append("worker log (tail):\n" + tail)
    return "\n".join(lines)


def to_xml(report: Report) -> str:
    suites = []
    for k in report.kernels:
        cases = []
        for g in k.gates:
            case = TestCase(name=g.gate, classname=f"kgate.{k.name}", elapsed_sec=g.duration_s,
                            file=k.source_file, line=k.source_line)
            if g.verdict == FAIL:
                case.add_failure_info(message=g.message, output=_body(g), failure_type=f"kgate.{g.gate}")
            elif g.verdict == ERROR:
                case.add_error_info(message=g.message, output=_body(g), error_type="kgate.error")
            elif g.verdict == SKIP:
                case.add_skipped_info(message=g.message)
            cases.append(case)
        suites.append(TestSuite(name=k.name, test_cases=cases, timestamp=report.started or None,
                                properties={"kernel": k.kernel, "reference": k.reference, "device": k.device,
                                            "sandbox": str((report.environment or {}).get("sandbox", "unknown"))}))
    return to_xml_report_string(suites, prettyprint=True, encoding="utf-8")


def write(report: Report, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_xml(report), encoding="utf-8")
