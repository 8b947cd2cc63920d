"""What an audit found: the summary (numbers), the console table, the markdown report with plots,
the stratified sample for hand audit, and the kgate JSON/JUnit reports.

Definitions (the DESIGN notes' vocabulary, per candidate):
- *judged*: the problem itself loaded and built, and this machine could run the candidate (a broken or
  unpaired problem, or a CUDA candidate audited where there is no CUDA, is counted apart);
- *violation*: at least one gate `fail` or `error` (a crash, hang or load failure is an error), or the
  candidate modified the problem module; an `error` that is kgate's own ("kgate internal error") is
  counted apart and is not a violation;
- *broken*: a violation that no tolerance explains: a tolerance-free gate failed, the candidate
  crashed or could not load, or it missed the float64 oracle by more than 10x the calibrated bound;
- *the reference failed*: a gate's `error` raised by the problem's own code (the reference, its float64
  oracle, or its inputs) is not the candidate's violation; a candidate with no other violation is
  counted as not judged, under that reason (in the H200 audit: kgate's float64 copy of a model whose
  lambda closed over its float32 layers, fixed since);
- *stopped at kgate's limits*: out of GPU memory (with the whole GPU: an audit judges a candidate that
  ran out while sharing again alone) or killed at the worker's host memory limit, with no violation
  found before: kgate's own float64 oracle is the likeliest cause at KernelBench's sizes, so the
  candidate is counted as not judged, under that reason, rather than as a crash;
- *empty only*: every violation is the shapes gate failing on its empty (size-0) batch and nothing
  else (counted in both numbers above, and apart: "on non-empty inputs" leaves these out);
- *standard accepts*: KernelBench's own check (kgate.standard_test) accepted it at atol=rtol=1e-2.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from kgate.gates import base_name
from kgate.gates.base import ERROR, FAIL, GateResult
from kgate.kernelbench import dtype_of_id
from kgate.report import KernelResult, Report, environment, now
from kgate.shares import at_memory_limit

INTERNAL = "kgate internal error"
NOT_RUN = ("not run:", "could not load the candidate", "compile failed", "not judged")


REFERENCE_FAILED = "the problem's own code (reference, float64 oracle or inputs) raised in a gate, nothing else found"


def _by_problem(gate: dict[str, Any]) -> bool:
    """An error the problem's own code raised (kgate.worker records the role of the code that raised)."""
    role = str((gate.get("details") or {}).get("role") or "")
    return gate["verdict"] == "error" and role.startswith(("reference", "inputs factory"))


def _not_run(gate: dict[str, Any]) -> bool:
    """Never ran, stopped at kgate's memory limits (`_at_limit`), or the problem's own code raised in it
    (`_by_problem`): no verdict on the candidate."""
    return gate["verdict"] == "error" and (gate["message"].startswith(NOT_RUN) or _at_limit(gate["message"])
                                           or _by_problem(gate))


AS_GIVEN_ASIDE = ("shapes", "layouts")  # gates that give the candidate other sizes or strided views

LIMITED = "stopped at kgate's memory limits (GPU out of memory, or the worker's host memory limit) before any violation"


def _at_limit(text: str | None) -> bool:
    """Whether an error is a resource limit's (GPU out of memory, the worker's host memory limit)."""
    return at_memory_limit(text)


def _violations(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in record["gates"] if g["verdict"] in ("fail", "error") and INTERNAL not in g["message"]
            and not (g["verdict"] == "error" and _at_limit(g["message"])) and not _by_problem(g)]


def classify(record: dict[str, Any]) -> dict[str, Any]:
    violations = _violations(record)
    standard = record.get("standard") or {}
    # a candidate that never loaded crashed, unless kgate's memory limit stopped its worker first (a limit
    # below the worker's own start: nothing of the candidate's ran)
    crashed = not _at_limit(record.get("error")) and (bool(record.get("error")) or standard.get("compiled") is False)
    tamper = bool(record.get("tamper"))
    limited = (_at_limit(record.get("error"))
               or any(g["verdict"] == "error" and _at_limit(g["message"]) for g in record["gates"]))
    runnable = not record.get("problem_error") and not record.get("environment_error")
    stopped = runnable and limited and not violations and not tamper and not crashed  # at kgate's limits only
    problem_failed = (runnable and not violations and not tamper and not crashed
                      and any(_by_problem(g) for g in record["gates"]))
    judged = runnable and not stopped and not problem_failed
    # A kernel whose only violation is the shapes gate's empty batch (a launch of zero blocks is a CUDA
    # error; the reference returns an empty result): a real contract violation, but not a wrong number on
    # real data, so the report counts it apart.
    empty_only = bool(violations) and not tamper and not crashed and all(
        base_name(g["gate"]) == "shapes" and (g.get("details") or {}).get("empty_only") for g in violations)
    # The gates that change what the candidate is given (other sizes, strided views) set aside: what is
    # wrong on contiguous inputs of the sizes it was written for (or its working shape), the nearest
    # reading of the standard test's own setting.
    as_given = [g for g in violations if base_name(g["gate"]) not in AS_GIVEN_ASIDE]
    standards = record.get("standards") or {}  # --dtypes: each precision's own; accepted only at every one
    return {
        "judged": judged,
        "empty_only": judged and empty_only,
        "standard_accepts": (all(s.get("verdict") == "pass" for s in standards.values()) if standards
                             else standard.get("verdict") == "pass"),
        "standard_accepts_1e-4": bool((standard.get("accepted_at") or {}).get("0.0001")),
        "violation": judged and (bool(violations) or tamper),
        "broken": judged and (any(g.get("broken") for g in violations) or tamper or crashed),
        "violation_as_given": judged and (bool(as_given) or tamper or crashed),
        "broken_as_given": judged and (any(g.get("broken") for g in as_given) or tamper or crashed),
        "internal": [g["gate"] for g in record["gates"] if INTERNAL in g["message"]],
        "limited": stopped,
        "problem_failed": problem_failed,
        "violated_gates": [g["gate"] for g in violations],
    }


def not_judged_reason(record: dict[str, Any], classes: dict[str, Any] | None = None) -> str:
    """Why a candidate that `classify` did not judge has no verdict ("" when it was judged)."""
    c = classes or classify(record)
    if c["judged"]:
        return ""
    return (record.get("problem_error") or record.get("environment_error") or (LIMITED if c["limited"] else "")
            or (REFERENCE_FAILED if c["problem_failed"] else "") or "no reason recorded")


def _pct(n: int, d: int) -> float:
    return round(100.0 * n / d, 1) if d else 0.0


def summarize(records: list[dict[str, Any]], gate_names: list[str], selected: int | None = None) -> dict[str, Any]:
    """The audit's figures over `records`; `selected`: how many candidates the run covers, records or not
    (those without one are `pending`: the run stopped before them)."""
    classes = [(r, classify(r)) for r in records]
    judged = [(r, c) for r, c in classes if c["judged"]]
    n = len(judged)
    accept = sum(c["standard_accepts"] for _, c in judged)
    violation = sum(c["violation"] for _, c in judged)
    broken = sum(c["broken"] for _, c in judged)
    empty_only = sum(c["empty_only"] for _, c in judged)
    broken_on_data = sum(c["broken"] and not c["empty_only"] for _, c in judged)
    as_given = sum(c["violation_as_given"] for _, c in judged)
    broken_as_given = sum(c["broken_as_given"] for _, c in judged)
    confusion = {
        "standard_accepts_gates_pass": sum(c["standard_accepts"] and not c["violation"] for _, c in judged),
        "standard_accepts_gates_reject": sum(c["standard_accepts"] and c["violation"] for _, c in judged),
        "standard_rejects_gates_pass": sum(not c["standard_accepts"] and not c["violation"] for _, c in judged),
        "standard_rejects_gates_reject": sum(not c["standard_accepts"] and c["violation"] for _, c in judged),
    }
    per_gate: dict[str, dict[str, Any]] = {}
    for name in gate_names:
        counts = Counter()
        for r, _ in judged:
            for g in r["gates"]:
                if g["gate"] == name:
                    kind = "internal" if INTERNAL in g["message"] else "not_run" if _not_run(g) else g["verdict"]
                    counts[kind] += 1
                    # a failure on the empty (size-0) batch alone, every non-empty input passing (shapes gate)
                    counts["empty_only"] += kind == "fail" and bool((g.get("details") or {}).get("empty_only"))
        failing = counts["fail"] + counts["error"]
        per_gate[name] = {"pass": counts["pass"], "fail": counts["fail"], "error": counts["error"],
                          "not_run": counts["not_run"], "skip": counts["skip"], "internal": counts["internal"],
                          "empty_only": counts["empty_only"], "failure_rate": _pct(failing, n),
                          "failure_rate_on_data": _pct(failing - counts["empty_only"], n)}
    per_level: dict[str, dict[str, int]] = defaultdict(lambda: Counter())
    for r, c in judged:
        row = per_level[str(r.get("level") or "?")]
        row["candidates"] += 1
        row["standard_accepts"] += c["standard_accepts"]
        row["violation"] += c["violation"]
        row["broken"] += c["broken"]
        row["all_gates_pass"] += not c["violation"]
    not_applied: dict[str, dict[str, str]] = defaultdict(dict)
    working: dict[str, str] = {}  # problem -> where its probing gates ran (kgate.kernelbench.working_shape)
    for r, _ in judged:
        problem = r.get("problem_name") or "?"
        for gate, note in (r.get("notes") or {}).items():
            if gate == "working_shape":
                working.setdefault(problem, note)
            else:
                not_applied[problem].setdefault(gate, note)
        for g in r["gates"]:
            if g["verdict"] == "skip":
                not_applied[problem].setdefault(g["gate"], g["message"])
    per_dtype: dict[str, dict[str, int]] = defaultdict(lambda: Counter())
    for r, _ in judged:
        standards = r.get("standards") or {}
        if not standards and not any("[" in g["gate"] for g in r["gates"]):
            continue  # the default float32 alone
        violated = {dtype_of_id(g["gate"]) for g in _violations(r)}
        for dtype in dict.fromkeys([*standards, *(dtype_of_id(g["gate"]) for g in r["gates"])]):
            row = per_dtype[dtype]
            row["candidates"] += 1
            row["standard_accepts"] += (standards.get(dtype) or {}).get("verdict") == "pass"
            row["violation"] += dtype in violated or bool(r.get("tamper"))
    harness = [(r, c) for r, c in judged if "harness_correct" in (r.get("labels") or {})]
    harness_summary = None
    if harness:
        accepted = [(r, c) for r, c in harness if str(r["labels"]["harness_correct"]).lower() in ("true", "1")]
        harness_summary = {
            "labelled": len(harness), "harness_accepted": len(accepted),
            "standard_1e-2_agrees": sum(c["standard_accepts"] for _, c in accepted),
            "standard_1e-4_agrees": sum(c["standard_accepts_1e-4"] for _, c in accepted),
            "violation_among_accepted": sum(c["violation"] for _, c in accepted),
            "broken_among_accepted": sum(c["broken"] for _, c in accepted),
        }
    durations = sorted(float(r.get("duration_s") or 0) for r, _ in judged)
    compile_s = sorted(float((r.get("compile") or {}).get("wall_s") or 0) for r, _ in judged if r.get("compile"))
    return {
        "candidates": len(records), "judged": n, "not_judged": len(records) - n,
        "pending": max(0, (selected or 0) - len(records)),
        "not_judged_reasons": dict(Counter(not_judged_reason(r, c)[:120]
                                           for r, c in classes if not c["judged"]).most_common(10)),
        "stopped_at_limits": sum(c["limited"] for _, c in classes),
        "standard_accepts": accept, "standard_accepts_pct": _pct(accept, n),
        "violation": violation, "violation_pct": _pct(violation, n),
        "broken": broken, "broken_pct": _pct(broken, n),
        "violation_empty_only": empty_only, "violation_empty_only_pct": _pct(empty_only, n),
        "violation_on_data": violation - empty_only, "violation_on_data_pct": _pct(violation - empty_only, n),
        "broken_on_data": broken_on_data, "broken_on_data_pct": _pct(broken_on_data, n),
        "violation_as_given": as_given, "violation_as_given_pct": _pct(as_given, n),
        "broken_as_given": broken_as_given, "broken_as_given_pct": _pct(broken_as_given, n),
        "all_gates_pass": n - violation, "all_gates_pass_pct": _pct(n - violation, n),
        "tampered": sum(bool(r.get("tamper")) for r, _ in judged),
        "internal_errors": sum(bool(c["internal"]) for _, c in judged),
        "retried_alone_after_oom": sum(bool(r.get("retried_alone")) for r, _ in judged),
        # judged alone at once: another candidate of the problem had outgrown its share (kgate.audit.scheduler)
        "alone_for_problem": sum(bool(r.get("alone")) and not r.get("retried_alone") for r, _ in judged),
        # judged in a wider share of the GPU's memory than the others (half: kgate.audit.scheduler.wider_width)
        "retried_wider_after_oom": sum(bool(r.get("retried_wider")) for r, _ in judged),
        "wider_for_problem": sum(bool(r.get("wider")) and not r.get("retried_wider") for r, _ in judged),
        "confusion": confusion, "per_gate": per_gate, "per_level": {k: dict(v) for k, v in sorted(per_level.items())},
        "per_dtype": {k: dict(v) for k, v in per_dtype.items()},
        "not_applied": {k: v for k, v in sorted(not_applied.items()) if v},
        "working_shape": dict(sorted(working.items())),
        "harness": harness_summary,
        "kgate_sources": dict(Counter(str((r.get("kgate") or {}).get("source") or "unrecorded")
                                      for r, _ in judged).most_common()),
        "seconds_per_candidate_median": durations[len(durations) // 2] if durations else None,
        "timeline_median": timeline_median([r for r, _ in judged]),
        "compile_seconds_median": compile_s[len(compile_s) // 2] if compile_s else None,
    }


def timeline_median(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per worker event (waiting: --prestart, loading, loaded, standard, gate_start, done), the median of the seconds from a
    candidate's start to that event, over the records that have it."""
    seen: dict[str, list[float]] = {}
    for r in records:
        for kind, at in (r.get("timeline") or {}).items():
            if kind in TIMELINE_EVENTS and isinstance(at, (int, float)):
                seen.setdefault(kind, []).append(float(at))
    return {k: round(statistics.median(seen[k]), 3) for k in TIMELINE_EVENTS if k in seen}


TIMELINE_EVENTS = ("waiting", "loading", "loaded", "standard", "gate_start", "done")


# -- kgate's own report formats ---------------------------------------------------------------------

# The ids of the record-level findings in kgate's own reports (beside the gates' ids)
TAMPER, NOT_JUDGED = "tamper", "not_judged"


def record_findings(record: dict[str, Any]) -> list[GateResult]:
    """What the console says of a candidate beyond its gates' results, as results of their own, so that
    every report derived from kgate's (JUnit XML, the JSON report's kernels, GitHub's annotations, job
    summary and PR comment) shows it too: `tamper` fails when the candidate modified the problem module or
    torch functions the reference uses (a violation, tolerance-free), `not_judged` is an error that says why
    a candidate has no verdict (its problem, this machine, kgate's memory limits, the problem's own code),
    unless every gate's own error already says so."""
    out = []
    repro = record.get("repro")
    if record.get("tamper"):
        out.append(GateResult(TAMPER, FAIL, f"the candidate modified what it is judged against: {record['tamper']}",
                              True, expected="the problem module and torch's functions as they were before the "
                              "candidate was imported", got=str(record["tamper"]), repro=repro, broken=True))
    c = classify(record)
    if not c["judged"]:
        reason = not_judged_reason(record, c)
        said = record["gates"] and all(g["verdict"] == ERROR and reason in g["message"] for g in record["gates"])
        if not said:
            out.append(GateResult(NOT_JUDGED, ERROR, f"not judged: {reason}", False, repro=repro,
                                  details={k: record[k] for k in ("problem_error", "environment_error", "error")
                                           if record.get(k)}))
    return out


def to_report(records: list[dict[str, Any]], label: str) -> Report:
    kernels = []
    for r in records:
        gates = [GateResult.from_json(g) for g in r["gates"]] + record_findings(r)
        kernels.append(KernelResult(name=r["id"], kernel=r["candidate"], reference=r.get("problem") or "",
                                    device=r.get("device", ""), gates=gates,
                                    source_file=r["candidate"], error=r.get("error") or r.get("problem_error"),
                                    log=r.get("log"), duration_s=float(r.get("duration_s") or 0)))
    return Report(manifest=label, kernels=kernels, environment=environment(), finished=now())


def write_json(path: Path, records: list[dict[str, Any]], summary: dict[str, Any], label: str) -> None:
    data = to_report(records, label).to_json()
    data["audit"] = {"summary": summary, "records": records}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


# -- console ------------------------------------------------------------------------------------------

def render(console: Any, summary: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    n = summary["judged"]
    t = Table(title=f"kgate audit: {n} candidate(s) judged", header_style="bold")
    t.add_column("measure")
    t.add_column("count", justify="right")
    t.add_column("%", justify="right")
    rows = [("standard test accepts (atol=rtol=1e-2)", summary["standard_accepts"], summary["standard_accepts_pct"]),
            (">= 1 gate violation", summary["violation"], summary["violation_pct"]),
            ("broken (tolerance-free, crash, > 10x bound)", summary["broken"], summary["broken_pct"]),
            ("violation only on empty inputs", summary["violation_empty_only"], summary["violation_empty_only_pct"]),
            ("broken on non-empty inputs", summary["broken_on_data"], summary["broken_on_data_pct"]),
            (">= 1 violation, shapes and layouts aside", summary["violation_as_given"],
             summary["violation_as_given_pct"]),
            ("broken, shapes and layouts aside", summary["broken_as_given"], summary["broken_as_given_pct"]),
            ("every gate passes", summary["all_gates_pass"], summary["all_gates_pass_pct"])]
    c = summary["confusion"]
    rows += [("standard accepts, gates reject", c["standard_accepts_gates_reject"],
              _pct(c["standard_accepts_gates_reject"], n)),
             ("standard rejects, gates pass", c["standard_rejects_gates_pass"], _pct(c["standard_rejects_gates_pass"], n))]
    for label, count, pct in rows:
        t.add_row(label, str(count), f"{pct:.1f}")
    console.print(t)
    g = Table(title="per gate", header_style="bold")
    for col in ("gate", "fail", "of which empty only", "error", "not run", "skip", "failure rate %",
                "on non-empty inputs %"):
        g.add_column(col, justify="left" if col == "gate" else "right")
    for name, row in summary["per_gate"].items():
        g.add_row(escape(name), str(row["fail"]), str(row["empty_only"]), str(row["error"]), str(row["not_run"]),
                  str(row["skip"]), f"{row['failure_rate']:.1f}", f"{row['failure_rate_on_data']:.1f}")
    console.print(g)
    if summary["not_judged"]:
        console.print(f"[yellow]{summary['not_judged']} candidate(s) not judged (problem unusable or unpaired, no CUDA here, stopped at kgate's memory limits, or the problem's own code raised in the gates):[/]")
        for reason, count in summary["not_judged_reasons"].items():
            console.print(f"  {count} x {escape(reason)}", highlight=False)
    if summary["internal_errors"]:
        console.print(f"[yellow]{summary['internal_errors']} candidate(s) hit a kgate internal error in some gate "
                      "(not counted as violations; see the JSON report)[/]")


# -- markdown, plots, sample ----------------------------------------------------------------------------

def stratified_sample(records: list[dict[str, Any]], per_stratum: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Up to `per_stratum` candidates per (gate, verdict) stratum and per agreement cell, drawn with a
    fixed seed, each with the failing gate's message and a command that reproduces it."""
    strata: dict[str, list[tuple[dict[str, Any], dict[str, Any] | None]]] = defaultdict(list)
    for r in records:
        c = classify(r)
        if not c["judged"]:
            continue
        for g in r["gates"]:
            if g["verdict"] in ("fail", "error") and INTERNAL not in g["message"] and not _not_run(g):
                strata[f"{g['gate']}:{g['verdict']}"].append((r, g))
        cell = ("standard accepts" if c["standard_accepts"] else "standard rejects") + \
               (", gates reject" if c["violation"] else ", gates pass")
        strata[cell].append((r, None))
    rng = random.Random(seed)
    rows = []
    for name in sorted(strata):
        items = strata[name]
        for r, g in rng.sample(items, min(per_stratum, len(items))):
            c = classify(r)
            rows.append({"stratum": name, "id": r["id"], "level": r.get("level"), "problem": r.get("problem"),
                         "candidate": r["candidate"], "standard": (r.get("standard") or {}).get("verdict"),
                         "violation": c["violation"], "broken": c["broken"],
                         "gate": g["gate"] if g else ";".join(c["violated_gates"]),
                         "message": (g["message"] if g else (r.get("standard") or {}).get("message", ""))[:500],
                         "repro": (g or {}).get("repro") or _repro(r, g)})
    return rows


def _repro(record: dict[str, Any], gate: dict[str, Any] | None) -> str:
    base = record.get("repro") or ""
    return f"{base} --gate {gate['gate']}" if base and gate else base


def write_sample(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = ["stratum", "id", "level", "problem", "candidate", "standard", "violation", "broken", "gate", "message",
              "repro"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def plots(folder: Path, summary: dict[str, Any]) -> list[str]:
    """PNG plots; returns their file names (none, with a note in the markdown, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    gates = list(summary["per_gate"])[::-1]
    rates = [summary["per_gate"][g]["failure_rate"] for g in gates]
    on_data = [summary["per_gate"][g]["failure_rate_on_data"] for g in gates]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(gates) + 1.6))
    ax.barh(gates, on_data, color="#c0392b", label="on non-empty inputs")
    if any(r > d for r, d in zip(rates, on_data, strict=True)):
        ax.barh(gates, [r - d for r, d in zip(rates, on_data, strict=True)], left=on_data, color="#f1948a",
                label="on the empty batch only (every non-empty input passes)")
        ax.legend(loc="lower right", fontsize="small")
    for y, rate in enumerate(rates):
        ax.text(rate, y, f" {rate:.1f}%", va="center")
    ax.set_xlabel("candidates failing the gate (fail or error), % of judged")
    ax.set_xlim(0, max(rates + [1]) * 1.2)
    ax.set_title("Failure rate per gate")
    fig.tight_layout()
    fig.savefig(folder / "gate_failure_rates.png", dpi=120)
    plt.close(fig)
    made.append("gate_failure_rates.png")

    c = summary["confusion"]
    grid = [[c["standard_accepts_gates_pass"], c["standard_accepts_gates_reject"]],
            [c["standard_rejects_gates_pass"], c["standard_rejects_gates_reject"]]]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    ax.imshow(grid, cmap="Blues")
    for i in range(2):
        for j in range(2):
            ax.text(j, i, str(grid[i][j]), ha="center", va="center", fontsize=16,
                    color="white" if grid[i][j] > max(max(grid)) / 2 else "black")
    ax.set_xticks([0, 1], ["gates pass", "gates reject"])
    ax.set_yticks([0, 1], ["standard\naccepts", "standard\nrejects"])
    ax.set_title("Standard test vs kgate gates")
    fig.tight_layout()
    fig.savefig(folder / "confusion_matrix.png", dpi=120)
    plt.close(fig)
    made.append("confusion_matrix.png")

    levels = list(summary["per_level"])
    if levels:
        rows = summary["per_level"]
        passing = [rows[lv].get("all_gates_pass", 0) for lv in levels]
        broken = [rows[lv].get("broken", 0) for lv in levels]
        other = [rows[lv].get("violation", 0) - rows[lv].get("broken", 0) for lv in levels]
        names = [f"level {lv}" for lv in levels]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar(names, passing, color="#27ae60", label="every gate passes")
        ax.bar(names, other, bottom=passing, color="#f39c12", label="violation (within 10x bound)")
        ax.bar(names, broken, bottom=[a + b for a, b in zip(passing, other, strict=True)], color="#c0392b",
               label="broken")
        ax.set_ylabel("candidates")
        ax.set_title("Verdict by problem level")
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / "verdict_by_level.png", dpi=120)
        plt.close(fig)
        made.append("verdict_by_level.png")
    return made


def _pending(summary: dict[str, Any]) -> list[str]:
    pending = summary.get("pending") or 0
    if not pending:
        return []
    return [f"**Interim: {pending} more candidate(s) of this run have no record yet** (it stopped before them: "
            f"`--max-time`, an interrupt, or candidates left for a whole device; the same command with `--resume` "
            f"judges them). The figures below are of the {summary['candidates']} with a record.", ""]


def write_markdown(folder: Path, summary: dict[str, Any], records: list[dict[str, Any]], *, command: str,
                   per_stratum: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    images = plots(folder, summary)
    sample = stratified_sample(records, per_stratum)
    write_sample(folder / "sample.csv", sample)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    n = summary["judged"]
    c = summary["confusion"]
    sources = summary.get("kgate_sources") or {}
    mixed = ["**The judged records come from more than one kgate source** (records joined across runs with "
             "--resume; digest of kgate's source files: count): "
             + ", ".join(f"`{k}`: {v}" for k, v in sources.items()) + ".", ""] if len(sources) > 1 else []
    lines = ["# kgate audit", "", f"Command: `{command}`", "",
             f"{summary['candidates']} candidate(s); {n} judged"
             + (f", {summary['not_judged']} not judged (problem unusable or unpaired, no CUDA here, stopped at kgate's memory limits, or the problem's own code raised in the gates)" if summary["not_judged"] else "")
             + ".", "", *_pending(summary), *mixed,
             "| measure | count | % of judged |", "|---|---:|---:|",
             f"| standard test accepts (5 trials, atol=rtol=1e-2) | {summary['standard_accepts']} | "
             f"{summary['standard_accepts_pct']} |",
             f"| >= 1 gate violation | {summary['violation']} | {summary['violation_pct']} |",
             f"| broken (tolerance-free failure, crash, or > 10x the bound) | {summary['broken']} | "
             f"{summary['broken_pct']} |",
             f"| violation only on empty inputs (the shapes gate's size-0 batch, nothing else) | "
             f"{summary['violation_empty_only']} | {summary['violation_empty_only_pct']} |",
             f"| >= 1 violation on non-empty inputs | {summary['violation_on_data']} | {summary['violation_on_data_pct']} |",
             f"| broken on non-empty inputs | {summary['broken_on_data']} | {summary['broken_on_data_pct']} |",
             f"| >= 1 violation with the shapes and layouts gates set aside (contiguous inputs of the problem's "
             f"sizes or its working shape) | {summary['violation_as_given']} | {summary['violation_as_given_pct']} |",
             f"| broken with the shapes and layouts gates set aside | {summary['broken_as_given']} | "
             f"{summary['broken_as_given_pct']} |",
             f"| every gate passes | {summary['all_gates_pass']} | {summary['all_gates_pass_pct']} |",
             f"| candidate modified the problem module | {summary['tampered']} | {_pct(summary['tampered'], n)} |",
             "", "## Standard test vs gates", "",
             "| | gates pass | gates reject |", "|---|---:|---:|",
             f"| standard accepts | {c['standard_accepts_gates_pass']} | {c['standard_accepts_gates_reject']} |",
             f"| standard rejects | {c['standard_rejects_gates_pass']} | {c['standard_rejects_gates_reject']} |", ""]
    if "confusion_matrix.png" in images:
        lines += ["![confusion matrix](confusion_matrix.png)", ""]
    lines += ["## Per gate", "",
              "`fail`: the gate found a violation; `error`: the candidate crashed, hung or raised inside this gate; "
              "`not run`: the candidate never got to this gate (it did not load, or crashed earlier), or the problem's own code raised in it; the failure "
              "rate counts fail + error over the judged candidates; `empty only`: failures on the empty (size-0) "
              "batch alone, every non-empty input passing, which the last column leaves out.", "",
              "| gate | fail | of which empty only | error | not run | skip | failure rate % | on non-empty inputs % |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in summary["per_gate"].items():
        lines.append(f"| {name} | {row['fail']} | {row['empty_only']} | {row['error']} | {row['not_run']} | "
                     f"{row['skip']} | {row['failure_rate']} | {row['failure_rate_on_data']} |")
    lines.append("")
    if "gate_failure_rates.png" in images:
        lines += ["![failure rate per gate](gate_failure_rates.png)", ""]
    if summary.get("per_dtype"):
        lines += ["## By precision (`--dtypes`)", "",
                  "Each precision judged on its own: inputs and both models cast to it, the standard test at "
                  "KernelBench's tolerance for it (1e-2 for float16 and bfloat16), the gates' results under ids "
                  "such as `oracle[float16]`. The standard test accepts a candidate above only at every one.", "",
                  "| precision | candidates | standard accepts | violation |", "|---|---:|---:|---:|"]
        for dtype, row in summary["per_dtype"].items():
            lines.append(f"| {dtype} | {row.get('candidates', 0)} | {row.get('standard_accepts', 0)} | "
                         f"{row.get('violation', 0)} |")
        lines.append("")
    lines += ["## By level", "", "| level | candidates | standard accepts | violation | broken | every gate passes |",
              "|---|---:|---:|---:|---:|---:|"]
    for level, row in summary["per_level"].items():
        lines.append(f"| {level} | {row.get('candidates', 0)} | {row.get('standard_accepts', 0)} | "
                     f"{row.get('violation', 0)} | {row.get('broken', 0)} | {row.get('all_gates_pass', 0)} |")
    lines.append("")
    if "verdict_by_level.png" in images:
        lines += ["![verdict by level](verdict_by_level.png)", ""]
    if not images:
        lines += ["(No plots: matplotlib is not installed; `pip install 'kgate[audit]'`.)", ""]
    h = summary.get("harness")
    if h:
        lines += ["## Against the corpus's own harness labels", "",
                  f"{h['labelled']} candidate(s) carry the generating harness's label; it accepted "
                  f"{h['harness_accepted']}. Of those, this replica of the standard test accepts "
                  f"{h['standard_1e-2_agrees']} at atol=rtol=1e-2 and {h['standard_1e-4_agrees']} at 1e-4; the gates "
                  f"find a violation in {h['violation_among_accepted']} "
                  f"({_pct(h['violation_among_accepted'], h['harness_accepted'])}%) and "
                  f"{h['broken_among_accepted']} ({_pct(h['broken_among_accepted'], h['harness_accepted'])}%) broken.",
                  ""]
    if summary["not_applied"]:
        lines += ["## Gates that could not apply", "", "| problem | gate | why |", "|---|---|---|"]
        for problem, gates in summary["not_applied"].items():
            for gate, why in gates.items():
                lines.append(f"| {problem} | {gate} | {str(why).replace('|', '/')[:200]} |")
        lines.append("")
    if summary.get("working_shape"):
        lines += ["## Where the probing gates ran", "",
                  "Contract, oracle, determinism and the standard test always run at the problem's own sizes; "
                  "the other gates at a smaller working shape where the problem's inputs are large "
                  "(`--work-elements`), or at the own sizes where the kernel or the reference does not accept "
                  "the working shape.", "", "| problem | probing gates |", "|---|---|"]
        for problem, note in summary["working_shape"].items():
            lines.append(f"| {problem} | {str(note).replace('|', '/')[:240]} |")
        lines.append("")
    lines += ["## Hand audit", "",
              f"`sample.csv` holds up to {per_stratum} candidates per stratum (each gate x fail/error, each cell of "
              f"the matrix above), drawn with a fixed seed, each with its message and a reproducing command "
              f"({len(sample)} rows).", ""]
    if summary["internal_errors"] or summary["not_judged"]:
        lines += ["## Not counted", "",
                  f"- kgate internal errors (a gate's own failure, not the candidate's): {summary['internal_errors']}",
                  f"- not judged (problem unusable or unpaired, no CUDA here, stopped at kgate's memory limits, or the problem's own code raised in the gates): {summary['not_judged']}", ""]
        for reason, count in summary["not_judged_reasons"].items():
            lines.append(f"  - {count} x {reason}")
        lines.append("")
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
