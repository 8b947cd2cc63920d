"""The audit benchmarks (bench/audit_throughput.py, bench/audit_scaling.py on the bundled corpus,
bench/accumulation_emulation.py) on the CPU: they run end to end, report what they claim, and the
scaling run's verdict check can fail."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import pytest

from kgate import gates as registry
from kgate.gates import accumulation
from tests.conftest import DATA, ROOT

CORPUS = DATA / "kernelbench"
SELECT = "ReLU and not (hang or segfault or exit or crash or syntax)"


def _load(name):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


CORPUS_ARGS = ["--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "candidates"), "-k", SELECT]


@pytest.mark.slow
def test_scaling_runs_each_device_count_and_compares_verdicts(tmp_path):
    scaling = _load("audit_scaling")
    out_json, out_md = tmp_path / "scaling.json", tmp_path / "scaling.md"
    assert scaling.main([*CORPUS_ARGS, "--device", "cpu", "--devices", "1,2", "--out", str(tmp_path / "o"),
                         "--json", str(out_json), "--markdown", str(out_md)]) == 0
    result = json.loads(out_json.read_text())
    first, second = result["runs"]
    assert (first["devices"], second["devices"], second["workers"]) == (1, 2, 2)
    assert first["kernels"] == second["kernels"] == result["candidates"] == 5
    assert first["efficiency"] == 1.0 and second["efficiency"] > 0
    assert second["differences"] == []  # the same kgate on the same candidates: the same verdicts
    text = out_md.read_text()
    assert "| 2 | 2 | 5 |" in text and "identical" in text and "python bench/audit_scaling.py" in text


def test_the_benchmarks_name_every_verdict_that_differs():
    scaling, common = _load("audit_scaling"), _load("audit_common")
    gates = [{"gate": "oracle", "verdict": "pass"}, {"gate": "determinism", "verdict": "pass"}]
    a = [{"id": "x", "standard": {"verdict": "pass"}, "gates": gates},
         {"id": "y", "standard": {"verdict": "pass"}, "gates": gates}]
    b = [{"id": "x", "standard": {"verdict": "pass"}, "gates": [gates[0], {"gate": "determinism", "verdict": "fail"}]},
         {"id": "z", "standard": {"verdict": "pass"}, "gates": gates}]
    assert common.differences(a, b) == ["x: determinism pass -> fail", "y: judged in only one run",
                                         "z: judged in only one run"]
    assert common.differences(a, a) == []
    assert scaling.device_counts("1,all", 8) == [1, 8] and scaling.device_counts("1,2,2", 4) == [1, 2]
    with pytest.raises(SystemExit):
        scaling.device_counts("1,3", 2)


@pytest.mark.slow
def test_throughput_times_both_modes(tmp_path):
    throughput = _load("audit_throughput")
    out = tmp_path / "t.json"
    # three candidates (a correct one, one the gates catch, one both tests catch) through seven passes
    three = [*CORPUS_ARGS[:-1], f"{SELECT[:-1]} or patches or tamper)"]
    assert throughput.main([*three, "--device", "cpu", "--jobs", "2", "--more-jobs", "1", "--prestart",
                            "--triton-emulation", "--other-order", "--out", str(tmp_path / "o"), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and len(result["ids"]) == 3 and result["order"] == "longest"
    # in order: the two modes, Triton, the other order, --jobs prestarted, --more-jobs, --more-jobs prestarted
    standard, full, triton, given, prestarted_jobs, narrower, prestarted_more = result["modes"]
    assert given["mode"].endswith("gates, order given") and given["kernels"] == 3
    prestarted = [prestarted_jobs, prestarted_more]
    # every candidate's record of every pass, beside the figures, named by its pass
    records = [json.loads(line) for line in out.with_suffix(".records.jsonl").read_text().splitlines()]
    assert [r["pass"] for r in records[::3]] == [row["mode"] for row in result["modes"]]
    assert {r["id"] for r in records} == set(result["ids"]) and len(records) == 3 * len(result["modes"])
    # the full gates again with the accumulation gate's Triton emulation asked for (on the CPU it takes the
    # torch code all the same): the same verdicts, and the setting is not left behind
    assert "Triton emulation" in triton["mode"] and triton["kernels"] == 3 and triton["differences"] == []
    assert triton["warm"] is None and triton["warm_s"] >= 0  # no GPU: nothing of kgate's to precompile
    assert "KGATE_TRITON_EMULATION" not in os.environ
    assert standard["kernels"] == full["kernels"] == narrower["kernels"] == 3
    assert [("x 2 worker" in r["mode"], "x 1 worker" in r["mode"]) for r in prestarted] == [(True, False), (False, True)]
    for row in prestarted:  # the same candidates, each worker started early and waiting for its turn
        assert row["kernels"] == 3 and "started while they judge" in row["mode"] and "waiting" in row["timeline_median"]
    assert "x 1 worker" in narrower["mode"] and set(narrower["gate_seconds"]) == set(registry.GATE_NAMES)
    assert "gate_start" in full["timeline_median"] and "gate_start" not in standard["timeline_median"]
    assert result["gates_over_standard"] > 0
    # where the gates' time goes: every gate named, none in the standard test alone
    assert set(full["gate_seconds"]) == set(registry.GATE_NAMES) and standard["gate_seconds"] == {}
    assert list(full["gate_seconds"].values()) == sorted(full["gate_seconds"].values(), reverse=True)
    # ... and within the accumulation gate: its phases, and the probes it ran (none without the gates)
    assert full["accumulation_phases"]["probes"] >= 1 and "pairwise" in full["accumulation_phases"]
    assert standard["accumulation_phases"] == {}


def test_a_throughput_run_cut_short_keeps_the_passes_it_finished(tmp_path, monkeypatch):
    throughput, common = _load("audit_throughput"), _load("audit_common")
    real, passes = throughput.timed_pass, []

    def second_pass_dies(*args, **kwargs):
        if passes:
            raise KeyboardInterrupt  # the run is cut short in the second pass
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(throughput, "timed_pass", second_pass_dies)
    out = tmp_path / "t.json"
    with pytest.raises(KeyboardInterrupt):
        throughput.main([*CORPUS_ARGS, "--device", "cpu", "--jobs", "2", "--out", str(tmp_path / "o"),
                         "--json", str(out)])
    result = json.loads(out.read_text())
    assert not result["complete"] and [r["mode"] for r in result["modes"]] == ["standard test alone"]
    assert result["gates_over_standard"] is None
    assert len(out.with_suffix(".records.jsonl").read_text().splitlines()) == 5
    # --spread: a set that spans the list, not its head
    assert common.spread(list(range(10)), 3) == [0, 3, 6] and common.spread([1, 2], 5) == [1, 2]


def test_gates_only_times_the_full_gates_without_the_standard_pass_and_claims_no_ratio(tmp_path):
    throughput = _load("audit_throughput")
    out = tmp_path / "t.json"
    assert throughput.main([*CORPUS_ARGS, "--device", "cpu", "--jobs", "2", "--limit", "2", "--gates-only",
                            "--order", "given", "--out", str(tmp_path / "o"), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and result["order"] == "given" and result["ids"] == sorted(result["ids"])
    assert [r["mode"] for r in result["modes"]] == [f"standard test + {len(registry.GATE_NAMES)} gates"]
    assert result["gates_over_standard"] is None
    assert result["modes"][0]["with_compile_kernels_per_hour"] > 0 and "cache_kept" not in result["compile"]
    row = result["modes"][0]
    assert row["judges"] == 2 and 0 <= row["judges_idle_fraction"] < 1 and row["gpu"] is None  # no GPU sampled
    where = row["judges_idle"]  # the idle judge-seconds split: they sum to the idle fraction's
    assert where["earlier_tries_s"] == 0 and len(where["last"]) == 2 and where["tail_s"] >= 0
    idle = row["judges_idle_fraction"] * row["judges"] * row["wall_s"]
    assert abs(where["tail_idle_s"] + where["before_tail_idle_s"] - idle) < 0.05 * row["wall_s"] + 0.1
    assert all(x["start_s"] <= x["end_s"] <= row["wall_s"] + 0.01 for x in where["last"])
    first = out.with_suffix(".records.jsonl")
    kept = tmp_path / "first.records.jsonl"
    kept.write_text(first.read_text())
    # again on the builds it left: its compile pass timed a cache, so no figure "with compile" is claimed;
    # its verdicts compared with the first run's: the same candidates, the same verdicts
    out2 = tmp_path / "t2.json"
    assert throughput.main([*CORPUS_ARGS, "--device", "cpu", "--jobs", "2", "--limit", "2", "--gates-only",
                            "--keep-cache", "--out", str(tmp_path / "o"), "--json", str(out2),
                            "--compare", str(kept)]) == 0
    result = json.loads(out2.read_text())
    assert result["compile"]["cache_kept"] and result["modes"][0]["with_compile_kernels_per_hour"] is None
    assert result["compare"]["passes"] == {result["modes"][0]["mode"]: []}
    # a record whose verdict differs is named, with what changed
    changed = [json.loads(line) for line in kept.read_text().splitlines()]
    changed[0]["gates"][0]["verdict"] = "changed"
    kept.write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert throughput.main([*CORPUS_ARGS, "--device", "cpu", "--jobs", "2", "--limit", "2", "--gates-only",
                            "--keep-cache", "--out", str(tmp_path / "o"), "--json", str(out2),
                            "--compare", str(kept)]) == 0
    lines = json.loads(out2.read_text())["compare"]["passes"][result["modes"][0]["mode"]]
    assert len(lines) == 1 and lines[0].startswith(changed[0]["id"]) and "changed ->" in lines[0]


def test_the_gpu_sampler_reads_nvml_figures_and_is_silent_without_nvidia_smi(tmp_path, monkeypatch):
    common = _load("audit_common")
    fake = tmp_path / "nvidia-smi"  # prints what `nvidia-smi --query-gpu=... -lms=N` prints, then stays
    fake.write_text("#!/bin/sh\nprintf '0, 50, 1000\\n1, 0, 10\\n0, 100, 3000\\n1, [N/A], 10\\n'\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with common.GpuSampler(period_ms=50) as gpu:
        deadline = time.monotonic() + 10
        while len(gpu.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert gpu.figures() == {"samples": 3, "period_ms": 50, "busy_percent": {"0": 75.0, "1": 0.0},
                             "peak_memory_mib": {"0": 3000.0, "1": 10.0}}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with common.GpuSampler() as gpu:
        pass
    assert gpu.figures() is None


def test_the_accumulation_emulation_benchmark_times_the_baseline_beside_the_current_code(monkeypatch, capsys):
    bench = _load("accumulation_emulation")
    monkeypatch.setattr(sys, "argv", ["accumulation_emulation.py", "--sizes", "4x96x8", "--repeat", "1",
                                      "--chunks", "6"])
    kept = accumulation.PRODUCT_CHUNK
    assert bench.main() == 0
    assert accumulation.PRODUCT_CHUNK == kept  # the chunk size is put back
    lines = capsys.readouterr().out.splitlines()[2:]
    rows = [line.split() for line in lines if not line.startswith(" " * 20)]
    assert [(r[1], r[2]) for r in rows] == [("pairwise", "float16"), ("pairwise", "bfloat16"),
                                          ("sequential", "float16"), ("sequential", "bfloat16")]
    assert all(float(r[5]) > 0 and int(r[6]) <= 32 for r in rows)  # a ratio of two timings; differing outputs
    # each followed by the current code at 2^6 float64 elements per chunk (several chunks here): the same outputs
    chunked = [line.split() for line in lines if line.startswith(" " * 20)]
    assert len(chunked) == 4 and all(r[:2] == ["chunk", "2^6"] and int(r[-1]) == 0 for r in chunked)


def test_the_standard_test_cost_is_fitted_against_the_problems_input_size(tmp_path, capsys, monkeypatch):
    """bench/standard_test_cost.py: the line through (input elements, standard_s) of an audit's records,
    sizes taken from the problems' own get_inputs() shapes (19_ReLU: 4 x 33; 9_Linear_Scale: 3 x 8)."""
    module = _load("standard_test_cost")
    assert module.problem_elements(CORPUS / "problems" / "level1" / "19_ReLU.py") == 4 * 33
    records = [{"problem": "/elsewhere/kb/level1/19_ReLU.py", "standard_s": 1.0 + 132 * 0.5},
               {"problem": "/elsewhere/kb/level2/9_Linear_Scale.py", "standard_s": 1.0 + 24 * 0.5},
               {"problem": "/elsewhere/kb/level1/19_ReLU.py", "standard_s": None}]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(module, "generator_speed", lambda: {"rand": 2e8})
    monkeypatch.setattr(sys, "argv", ["standard_test_cost.py", str(results), "--problems", str(CORPUS / "problems")])
    module.main()
    out = capsys.readouterr().out
    assert "2 record(s) of 3" in out
    assert "standard test s = 1.00 + 500000000.0 x (G input elements)" in out  # 0.5 s per element


def test_each_pass_is_ordered_by_what_it_runs_and_the_sizes_are_counted_once(monkeypatch, tmp_path):
    """An H200 run (2026-12-04) ordered the full gates as the standard test alone (input elements only): the
    DenseNet of level 3 problem 16, small inputs and 103 weighted layers (82 s of the accumulation gate),
    went last, and its 129 s held the wall. Every pass with gates must weigh the layers; the standard test
    must not."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import ProblemSize

    throughput = _load("audit_throughput")
    counted, passes = [], []

    def sizes(problems, options):
        counted.append(len(problems))  # wide: most input elements; deep: most weighted layers
        return {p: ProblemSize(10**9, 0) if "ReLU" in p.name else ProblemSize(10, 500) for p in problems}

    split = []

    def timed_pass(pairs, options, plan, label, parts=None):
        # the corpus's folders, as kgate audit gives them: one view for every worker, so one template forks them all
        assert options.corpus == [str((CORPUS / f).resolve()) for f in ("problems", "candidates")], options.corpus
        passes.append((label, bool(options.gates), [p.problem.name for p in pairs]))
        split.append(sorted(parts or {}))
        row = dict(mode=label, kernels=len(pairs), wall_s=1.0, s_per_kernel=1.0, worker_s_per_kernel=1.0,
                   kernels_per_hour=3600.0, timeline_median={}, gate_seconds={}, accumulation_phases={})
        return row, []

    monkeypatch.setattr(scheduler, "problem_sizes", sizes)
    monkeypatch.setattr(throughput, "timed_pass", timed_pass)
    monkeypatch.setattr(throughput, "compile_stage",
                        lambda pairs, base, jobs, pch: ({"mode": "compile", "kernels": 0, "wall_s": 0.0}, 0.0))
    assert throughput.main(["--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "candidates"),
                            "-k", "ReLU__wrong or Linear", "--device", "cpu", "--jobs", "2", "--other-order",
                            "--out", str(tmp_path / "o"), "--json", str(tmp_path / "t.json")]) == 0
    assert len(counted) == 1  # once, for every pass
    (standard, _, first), (full, gates, by_cost), (other, _, by_id) = passes
    assert standard == "standard test alone" and other.endswith("order given") and gates
    assert "ReLU" in first[0] and "ReLU" not in by_cost[0], passes  # inputs first alone; layers first with gates
    assert len(set(first)) == len(set(by_cost)) == 2
    result = json.loads((tmp_path / "t.json").read_text())
    assert [i for i in result["ids"]] != [i for i in result["standard_ids"]]
    # (several candidates share the deep problem: none of them alone exceeds a judge's share, none is split)
    assert split == [[], [], []], split


def test_the_schedule_replay_gives_each_retry_policy_its_hand_computed_wall(tmp_path, capsys):
    """bench/audit_replay.py on six candidates, 4 judges, one (c, 30 s, 7 of them its standard test) that
    outgrew its share after 5 s: alone at the end 20 + 30 s; in half the slots at once 10 + 30 s, with e and
    f beside it; keeping its standard test 10 + 23 s."""
    replay = _load("audit_replay")
    records = [{"id": i, "duration_s": 10.0} for i in "abdef"]
    records.insert(2, {"id": "c", "duration_s": 30.0, "retried_alone": True, "timeline": {"loaded": 1, "standard": 8}})
    walls = {p: replay.replay(records, 4, p, lost=5.0) for p in replay.POLICIES}
    assert walls == {"alone-at-end": 50.0, "wider": 40.0, "wider+kept": 33.0}
    assert replay.replay(records[:2], 4, "wider", lost=5.0) == 10.0  # nothing outgrew: the durations alone
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({**r, "call": 1}) + "\n" for r in records) + json.dumps({"id": "x", "call": 2,
                                                                                              "duration_s": 1}) + "\n")
    assert replay.main([str(path), "--where", "call=1", "--lost", "5"]) == 0
    out = capsys.readouterr().out
    assert "6 record(s), 4 judges, 1 outgrew" in out and "| given | 50.0 | 40.0 | 33.0 |" in out
    assert "| best |" in out and "| longest |" not in out  # no problem file to count here


def test_the_environment_names_the_imported_kgates_source_beside_the_commit():
    """environment.txt's kgate line: the checkout's commit, and the digest of the kgate that is imported (the one
    an audit's records carry), which tells the code that ran where the git metadata is stale."""
    from kgate.audit.evaluate import kgate_stamp

    environment = _load("environment")
    [line] = [x for x in environment.describe(["torch"]) if x.startswith("kgate ")]
    assert f"source digest {kgate_stamp()['source']}" in line
    assert any(x.startswith("torch ") for x in environment.describe(["torch"]))


def test_idle_breakdown_splits_the_idle_judge_seconds_into_earlier_tries_the_tail_and_the_rest():
    common = _load("audit_common")
    # 2 judges, wall 10: a (0-4), b (1-3, after an earlier try of 1 s), c (4-10) alone in the tail
    records = [{"id": "a", "finished_s": 4.0, "duration_s": 4.0},
               {"id": "b", "finished_s": 3.0, "duration_s": 2.0, "earlier_try_s": 1.0},
               {"id": "c", "finished_s": 10.0, "duration_s": 6.0}]
    where = common.idle_breakdown(records, 10.0, 2)
    assert where["tail_s"] == 6.0 and where["tail_idle_s"] == 6.0  # one judge of two idle after c started
    assert where["earlier_tries_s"] == 1.0
    assert where["before_tail_idle_s"] == 2 * 10 - 12 - 6 - 1  # idle 8 in all: 6 in the tail, 1 earlier tries
    assert [x["id"] for x in where["last"]] == ["b", "a", "c"]
    assert common.idle_breakdown([], 10.0, 2) == {}


def test_idle_breakdown_counts_each_part_of_a_split_candidate_over_its_own_span():
    common = _load("audit_common")
    # 2 judges, wall 10: p judged in two parts at once, 0-6 and 0-10 (its record finished at 10, when the
    # second part ended); nothing else. Idle: judge 1 from 6 to 10, all of it in the tail (after the last start, 0)
    split = {"id": "p", "finished_s": 10.0, "duration_s": 16.0, "ended_at": 110.0,
             "parts": [{"duration_s": 6.0, "ended_at": 106.0}, {"duration_s": 10.0, "ended_at": 110.0}]}
    where = common.idle_breakdown([split], 10.0, 2)
    assert where["tail_s"] == 10.0 and where["tail_idle_s"] == 4.0 and where["before_tail_idle_s"] == 0.0
    assert [(x["start_s"], x["end_s"]) for x in where["last"]] == [(0.0, 6.0), (0.0, 10.0)]
    # a record from before parts kept their ends: its longest part stands for it
    older = {**split, "parts": [{"duration_s": 6.0}, {"duration_s": 10.0}]}
    del older["ended_at"]
    assert common.idle_breakdown([older], 10.0, 2)["tail_idle_s"] == 10.0


def test_call_seconds_sum_each_roles_calls_over_the_gates_and_leave_the_rest_to_other():
    common = _load("audit_common")
    records = [{"gates": [{"gate": "oracle", "duration_s": 5.0,
                           "calls": {"kernel": {"calls": 2, "s": 1.0}, "oracle": {"calls": 1, "s": 3.0}}},
                          {"gate": "shapes", "duration_s": 1.0, "calls": {}}]},
               {"gates": [{"gate": "oracle", "duration_s": 2.0, "calls": {"kernel": {"calls": 1, "s": 2.0}}}]}]
    seen = common.call_seconds(records)
    assert seen["all"] == {"kernel": {"calls": 3, "s": 3.0}, "oracle": {"calls": 1, "s": 3.0},
                           "other": {"calls": 0, "s": 2.0}}
    assert seen["by_gate"] == {"oracle": {"kernel": 3.0, "oracle": 3.0, "other": 1.0}, "shapes": {"other": 1.0}}
    assert common.call_seconds([]) == {"all": {}, "by_gate": {}}


@pytest.mark.parametrize(("script", "args"), [("audit_throughput", "--help"),
                                            ("lockstep_load", "tests/data/kernelbench/problems/level1/19_ReLU.py"),
                                            ("oracle_cost", "tests/data/kernelbench/problems/level1/19_ReLU.py")])
def test_a_benchmark_run_by_a_python_without_torch_says_so_in_one_line_and_exits_2(script, args):
    import subprocess

    code = (f"import runpy, sys; sys.modules['torch'] = None; sys.path.insert(0, 'bench'); "
            f"sys.argv = ['{script}.py', '{args}']; runpy.run_path('bench/{script}.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "torch is not installed in" in proc.stderr


def test_the_lockstep_load_benchmark_times_the_kept_plan_beside_a_load_by_name(tmp_path, capsys):
    """bench/lockstep_load.py: both loads of a BatchNorm model's buffers timed side by side, each leaving the
    state loaded; a model without floating buffers is named as such."""
    (tmp_path / "bn.py").write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.bn = torch.nn.BatchNorm1d(4)\n"
        "    def forward(self, x):\n"
        "        return self.bn(x)\n"
        "def get_inputs():\n"
        "    return [torch.randn(8, 4)]\n")
    (tmp_path / "relu.py").write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.relu(x)\n"
        "def get_inputs():\n"
        "    return [torch.randn(8, 4)]\n")
    out = tmp_path / "rows.json"
    bench = _load("lockstep_load")
    assert bench.main([str(tmp_path / "bn.py"), str(tmp_path / "relu.py"), "--repeat", "2", "--json", str(out)]) == 0
    bn, relu = json.loads(out.read_text())
    assert bn["buffers"] == 3 and relu == {"problem": "relu.py", "buffers": 0}
    for label in ("kernel", "reference", "float64 copy"):
        assert bn[f"{label}_plan_ms"] > 0 and bn[f"{label}_by_name_ms"] > 0 and bn[f"{label}_equal"] is True
    text = capsys.readouterr().out
    assert "| bn.py | 3 | float64 copy |" in text and "| relu.py | 0 | no floating buffers |" in text
    assert bench.main([str(tmp_path / "missing.py")]) == 2
