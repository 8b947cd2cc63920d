"""kgate audit, a long candidate's gates judged in parts: which candidates split_parts splits and how the parts
are balanced, how merge_parts makes one record of them, and a split pair judged on the CPU with the same
verdicts as unsplit."""

from __future__ import annotations

from pathlib import Path

from kgate.audit.evaluate import AuditOptions, ProblemSize
from kgate.audit.scheduler import GATE_WEIGHTS, Plan, merge_parts, run_local, split_parts
from kgate.kernelbench import Pair, discover
from tests.conftest import DATA

GATES = ["contract", "oracle", "special_values", "determinism", "shapes", "layouts", "distributions",
         "accumulation", "input_integrity", "initialization", "bounds", "isolation"]


def _pairs(sizes: dict[str, ProblemSize]) -> tuple[list[Pair], dict[Path, ProblemSize]]:
    pairs = [Pair(name, Path(f"/c/{name}.py"), Path(f"/p/{name}.py")) for name in sizes]
    return pairs, {p.problem: sizes[p.id] for p in pairs}


def test_only_a_candidate_above_a_judges_share_is_split_into_balanced_parts():
    """A deep model (103 weighted layers) among small ones with 4 judges: its gates alone exceed a judge's fair
    share of the whole audit, so they are split; each part holds about as much gate weight; the small ones stay
    whole, and so does everything with one judge or one gate."""
    pairs, sizes = _pairs({"densenet": ProblemSize(1_500_000, 103, 30_000_000),
                           **{f"small{i}": ProblemSize(4_000_000, 1, 4_000) for i in range(12)}})
    options = AuditOptions(gates=GATES, out_dir=Path("/tmp/unused"))
    parts = split_parts(pairs, options, 4, sizes)
    assert set(parts) == {"densenet"}
    groups = parts["densenet"]
    assert 2 <= len(groups) <= 4 and sorted(g for group in groups for g in group) == sorted(GATES)
    assert all(group == [g for g in GATES if g in group] for group in groups)  # each in the gates' order
    loads = [sum(GATE_WEIGHTS[g] for g in group) for group in groups]
    assert max(loads) < 1.6 * min(loads), loads
    assert split_parts(pairs, options, 1, sizes) == {}
    assert split_parts(pairs, AuditOptions(gates=["oracle"], out_dir=Path("/tmp/unused")), 4, sizes) == {}
    even, even_sizes = _pairs({f"same{i}": ProblemSize(4_000_000, 5, 1_000_000) for i in range(8)})
    assert split_parts(even, options, 4, even_sizes) == {}


def test_parts_merge_into_one_record_in_the_gates_order():
    def part(gates, **extra):
        return {"id": "x", "standard": {"verdict": "pass"} if "contract" in gates else None, "notes": {},
                "gates": [{"gate": g, "verdict": "pass"} for g in gates], "duration_s": 2.0, "restarts": 0,
                "oom": False, "host_memory": False, "complete": True, "error": None, "problem_error": None,
                "tamper": None, "timeline": {"done": 2.0}, **extra}

    merged = merge_parts([part(["contract", "shapes"]), part(["oracle"], tamper="patched torch.add", restarts=1)],
                         ["contract", "oracle", "shapes"])
    assert [g["gate"] for g in merged["gates"]] == ["contract", "oracle", "shapes"]
    assert merged["standard"] == {"verdict": "pass"} and merged["tamper"] == "patched torch.add"
    assert merged["duration_s"] == 4.0 and merged["restarts"] == 1
    assert [p["gates"] for p in merged["parts"]] == [["contract", "shapes"], ["oracle"]]


def test_a_split_pair_gets_the_verdicts_it_gets_whole(tmp_path):
    corpus = DATA / "kernelbench"
    pair = next(p for p in discover(corpus / "problems", corpus / "candidates") if p.id == "level2/9_Linear_Scale")
    gates = ["contract", "oracle", "special_values", "determinism"]
    records = {}
    for label, parts in (("whole", None), ("split", {pair.id: [["contract", "determinism"],
                                                               ["oracle", "special_values"]]})):
        options = AuditOptions(gates=gates, out_dir=tmp_path / label, timeout=60)
        got = []
        assert run_local([pair], options, Plan(["cpu"], 2, 1), got.append, parts=parts) == 1
        records[label] = got[0]
    whole, split = records["whole"], records["split"]
    assert [(g["gate"], g["verdict"]) for g in split["gates"]] == [(g["gate"], g["verdict"]) for g in whole["gates"]]
    assert split["standard"]["verdict"] == whole["standard"]["verdict"] == "pass"
    assert [p["gates"] for p in split["parts"]] == [["contract", "determinism"], ["oracle", "special_values"]]
    assert "parts" not in whole


_DEEP = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Sixteen small linear layers: light inputs, many weighted layers (gates estimated past SPLIT_MIN_S)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(8, 8) for _ in range(16)])

    def forward(self, x):
        return self.layers(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


def test_audit_judges_one_deep_candidate_in_parts_unless_no_split(tmp_path, capsys):
    """Even alone: with two judges, a candidate whose gates are estimated past a judge's share (here the whole
    audit's half) takes both; --no-split keeps it in one worker. The same verdicts either way."""
    from kgate.audit.results import ResultsFile
    from kgate.cli import main as kgate_main

    (tmp_path / "problems").mkdir()
    (tmp_path / "candidates").mkdir()
    (tmp_path / "problems" / "deep.py").write_text(_DEEP)
    (tmp_path / "candidates" / "deep__self.py").write_text(_DEEP + "\nModelNew = Model\n")
    base = ["audit", "--format", "kernelbench", "--problems", str(tmp_path / "problems"), "--candidates",
            str(tmp_path / "candidates"), "--device", "cpu", "--jobs", "2", "--gate",
            "contract,oracle,special_values,determinism", "--timeout", "60"]
    records = {}
    for label, extra in (("split", []), ("whole", ["--no-split"])):
        assert kgate_main([*base, *extra, "--out", str(tmp_path / label)]) == 0
        records[label] = next(iter(ResultsFile(tmp_path / label / "results.jsonl").read().values()))
    out = capsys.readouterr().out
    assert "1 candidate(s) judged in parts" in out and out.count("judged in parts") == 1, out
    split, whole = records["split"], records["whole"]
    assert len(split["parts"]) == 2 and "parts" not in whole
    assert [(g["gate"], g["verdict"]) for g in split["gates"]] == [(g["gate"], g["verdict"]) for g in whole["gates"]]
    assert all(g["verdict"] in ("pass", "skip") for g in split["gates"]), split["gates"]
