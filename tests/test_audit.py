"""kgate audit end to end on the CPU: hostile candidates, the report, kill-and-resume, shards, Ray."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kgate.audit.report import summarize
from kgate.audit.results import ResultsFile, shard
from kgate.audit.scheduler import DeviceLease, Outgrown
from kgate.cli import main as kgate_main
from kgate.commands.audit import CACHE_ENV
from kgate.gates.base import GateResult
from kgate.kernelbench import Pair, discover
from tests.conftest import DATA, ROOT
from tests.process_support import worker_pids

CORPUS = DATA / "kernelbench"
GATES = "contract,oracle,special_values,shapes"
PLAIN = "(level1/19_ReLU or level2/9_Linear_Scale) and not __"  # the two correct candidates
BASE = ["audit", "--format", "kernelbench", "--problems", str(CORPUS / "problems"),
        "--candidates", str(CORPUS / "candidates"), "--device", "cpu", "--gate", GATES]


def _records(out):
    return {r["id"]: r for r in ResultsFile(out / "results.jsonl").read().values()}


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    code = kgate_main([*BASE, "--jobs", "2", "--timeout", "12", "--out", str(out / "run"),
                       "--report", str(out / "report"), "--json", str(out / "audit.json"),
                       "--junit", str(out / "junit.xml"), "-q"])
    return code, out, _records(out / "run")


def _gate(record, name):
    return next(g for g in record["gates"] if g["gate"] == name)


def test_every_candidate_gets_a_record_and_the_run_exits_1(audited):
    code, out, records = audited
    assert code == 1
    assert set(records) == {p.id for p in discover(CORPUS / "problems", CORPUS / "candidates")}
    assert (out / "run" / "logs" / "problem-sizes.log").is_file()  # two judges: the longest problems first


def test_order_given_counts_nothing_and_keeps_the_id_order(tmp_path, capsys):
    out = tmp_path / "run"
    four = "not (hang or exit or segfault or crash or patches or tamper or syntax or nan)"  # more than 2 judges take
    assert kgate_main([*BASE[:-2], "--gate", "contract", "-k", four, "--jobs", "2", "--timeout", "30",
                       "--order", "given", "--out", str(out)]) in (0, 1)
    assert len(_records(out)) == 4
    assert not (out / "logs" / "problem-sizes.log").exists()
    assert "longest problems first" not in capsys.readouterr().out


def test_correct_candidates_pass_both(audited):
    records = audited[2]
    for name in ("level1/19_ReLU", "level2/9_Linear_Scale"):
        r = records[name]
        assert r["standard"]["verdict"] == "pass", r["standard"]
        assert all(g["verdict"] in ("pass", "skip") for g in r["gates"]), r["gates"]
        # timings the throughput figures come from: the standard test's own, and the whole record's
        assert 0 < r["standard_s"] < r["duration_s"], (r["standard_s"], r["duration_s"])
        t = r["timeline"]  # where a candidate's time goes: worker up, loaded, standard test, gates, done
        # (times in milliseconds: a tiny candidate's standard test may end, and the gates start, within the
        # millisecond the one before ended)
        assert 0 < t["loading"] < t["loaded"] <= t["standard"] <= t["gate_start"] < t["done"] <= r["duration_s"], t
        # ... and within each gate, the calls of user code it made, by role, inside the gate's seconds
        oracle = _gate(r, "oracle")["calls"]
        assert {"kernel", "reference", "oracle"} <= set(oracle), oracle
        assert all(v["calls"] >= 1 and v["s"] > 0 for v in oracle.values()), oracle
        assert sum(v["s"] for v in oracle.values()) <= _gate(r, "oracle")["duration_s"]


def test_standard_accepts_what_the_gates_reject(audited):
    records = audited[2]
    nan = records["level1/19_ReLU__nan_masking"]
    assert nan["standard"]["verdict"] == "pass"
    assert _gate(nan, "special_values")["verdict"] == "fail"
    fixed = records["level2/9_Linear_Scale__fixed_batch"]
    assert fixed["standard"]["verdict"] == "pass"
    assert _gate(fixed, "shapes")["verdict"] == "fail"
    wrong = records["level1/19_ReLU__wrong"]
    assert wrong["standard"]["verdict"] == "fail" and _gate(wrong, "oracle")["verdict"] == "fail"


@pytest.mark.parametrize(("name", "cause"), [
    ("crash", "RuntimeError: kernel launch failed"),
    ("hang", "timed out after 12 s"),
    ("exit", "worker exited with code 3"),
    ("segfault", "SIGSEGV"),
    ("syntax_error", "SyntaxError"),
])
def test_hostile_candidates_are_errors_and_the_audit_goes_on(audited, name, cause):
    r = audited[2][f"level1/19_ReLU__{name}"]
    assert r["standard"]["verdict"] == "error"
    texts = [r["standard"]["message"]] + [g["message"] for g in r["gates"]]
    assert any(cause in t for t in texts), texts
    assert all(g["verdict"] != "pass" for g in r["gates"])


def test_tampering_with_the_problem_is_recorded(audited):
    r = audited[2]["level1/19_ReLU__tamper"]
    assert r["tamper"] and "get_inputs" in r["tamper"]


def test_patching_torch_under_the_reference_is_recorded(audited):
    r = audited[2]["level1/19_ReLU__patches_torch"]
    assert r["tamper"] and "torch.relu" in r["tamper"]
    assert audited[2]["level1/19_ReLU"]["tamper"] is None


def test_report_numbers_match_the_records(audited):
    _, out, records = audited
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary == json.loads(json.dumps(summarize(list(records.values()), GATES.split(","))))
    c = summary["confusion"]
    assert sum(c.values()) == summary["judged"] == len(records)
    assert c["standard_accepts_gates_reject"] >= 3  # nan masking, fixed batch, tamper
    assert summary["violation"] == sum(1 for r in records.values()
                                       if any(g["verdict"] in ("fail", "error") for g in r["gates"]) or r["tamper"])
    text = (out / "report" / "report.md").read_text()
    assert "Standard test vs gates" in text and "confusion_matrix.png" in text
    for png in ("gate_failure_rates.png", "confusion_matrix.png", "verdict_by_level.png"):
        assert (out / "report" / png).read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader((out / "report" / "sample.csv").open()))
    assert {"special_values:fail", "shapes:fail"} <= {r["stratum"] for r in rows}
    assert all(r["repro"].startswith("kgate audit") for r in rows if r["stratum"].endswith(":fail"))
    data = json.loads((out / "audit.json").read_text())
    assert len(data["kernels"]) == len(records) and data["audit"]["summary"]["judged"] == len(records)
    assert (out / "junit.xml").read_text().count("<testsuite ") == len(records)


def test_every_record_names_the_kgate_that_judged_it_and_the_report_flags_a_mix(audited, tmp_path):
    from kgate.audit.evaluate import kgate_stamp
    from kgate.audit.report import write_markdown

    records = list(audited[2].values())
    stamps = {json.dumps(r["kgate"], sort_keys=True) for r in records}
    assert stamps == {json.dumps(kgate_stamp(), sort_keys=True)} and len(kgate_stamp()["source"]) == 16
    one = write_markdown(tmp_path / "one", summarize(records, GATES.split(",")), records, command="x")
    assert "more than one kgate source" not in one.read_text()
    mixed = [dict(r, kgate={"version": "0.1.0", "source": "0" * 16}) if n < 2 else r for n, r in enumerate(records)]
    mixed[2] = {k: v for k, v in mixed[2].items() if k != "kgate"}  # a record from before the stamp
    summary = summarize(mixed, GATES.split(","))
    assert summary["kgate_sources"] == {kgate_stamp()["source"]: len(records) - 3, "0" * 16: 2, "unrecorded": 1}
    text = write_markdown(tmp_path / "mixed", summary, mixed, command="x").read_text()
    assert "more than one kgate source" in text and f"`{'0' * 16}`: 2" in text and "`unrecorded`: 1" in text


def test_a_report_of_a_run_cut_short_says_it_is_interim(audited, tmp_path):
    """Candidates the run covers but has no record of yet (--max-time, an interrupt) are counted apart, and
    the markdown report opens by saying its figures are interim; a complete run's report does not."""
    from kgate.audit.report import write_markdown

    records = list(audited[2].values())
    partial = summarize(records, GATES.split(","), selected=len(records) + 3)
    assert partial["pending"] == 3 and partial["candidates"] == len(records)
    assert "**Interim: 3 more candidate(s)" in write_markdown(tmp_path / "p", partial, records, command="x").read_text()
    done = summarize(records, GATES.split(","), selected=len(records))
    assert done["pending"] == 0 and "Interim" not in write_markdown(tmp_path / "d", done, records, command="x").read_text()


def test_shards_cover_every_candidate_exactly_once():
    pairs = [Pair(f"c{i:03d}", CORPUS / "x.py", None) for i in range(23)]
    for n in (1, 2, 3, 7, 30):
        seen = [p.id for i in range(1, n + 1) for p in shard(pairs, (i, n))]
        assert sorted(seen) == sorted(p.id for p in pairs)
        sizes = [len(shard(pairs, (i, n))) for i in range(1, n + 1)]
        assert max(sizes) - min(sizes) <= 1


def test_cli_shards_partition_the_corpus(tmp_path):
    ids = set()
    for i in (1, 2):
        out = tmp_path / f"s{i}"
        kgate_main([*BASE[:-1], "contract", "-k", PLAIN, "--shard", f"{i}/2",
                    "--out", str(out), "-q"])
        got = set(_records(out))
        assert not ids & got
        ids |= got
    assert ids == {"level1/19_ReLU", "level2/9_Linear_Scale"}


def test_resume_judges_again_a_candidate_whose_file_changed(tmp_path):
    """A record says what files it was judged on (`sources`): --resume keeps it only while they are the same."""
    import shutil

    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS / "problems" / "level1", corpus / "problems" / "level1")
    (corpus / "candidates" / "level1").mkdir(parents=True)
    for name in ("19_ReLU.py", "19_ReLU__wrong.py"):
        shutil.copy(CORPUS / "candidates" / "level1" / name, corpus / "candidates" / "level1" / name)
    args = ["audit", "--format", "kernelbench", "--problems", str(corpus / "problems"), "--candidates",
            str(corpus / "candidates"), "--device", "cpu", "--gate", "contract,oracle", "--out", str(tmp_path / "out"),
            "-q"]
    assert kgate_main(args) == 1
    first = _records(tmp_path / "out")
    shutil.copy(CORPUS / "candidates" / "level1" / "19_ReLU.py", corpus / "candidates" / "level1" / "19_ReLU__wrong.py")
    assert kgate_main([*args, "--resume"]) == 0  # the fixed candidate judged again; the other kept as it was
    again = _records(tmp_path / "out")
    assert again["level1/19_ReLU"] == first["level1/19_ReLU"]
    assert again["level1/19_ReLU__wrong"]["sources"] != first["level1/19_ReLU__wrong"]["sources"]
    assert {g["verdict"] for g in again["level1/19_ReLU__wrong"]["gates"]} == {"pass"}


def test_kill_and_resume_loses_nothing_and_repeats_nothing(tmp_path):
    out = tmp_path / "run"
    select = "not (crash or hang or exit or segfault or syntax or tamper or patches)"  # the five quick candidates
    args = [*BASE[:-1], "contract,oracle", "-k", select, "--jobs", "1", "--out", str(out), "-q"]
    proc = subprocess.Popen([sys.executable, "-m", "kgate", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if results.exists() and results.read_text().count("\n") >= 2:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = results.read_text().splitlines()
    assert 2 <= len(before) < 5
    with open(results, "a") as f:
        f.write('{"id": "level1/19_ReLU__wro')  # a line torn by the kill
    code = kgate_main([*args, "--resume"])
    assert code == 1
    lines = results.read_text().splitlines()
    assert lines[:len(before)] == before  # what was judged is kept as it was
    ids = []
    for line in lines:
        try:
            ids.append(json.loads(line)["id"])
        except ValueError:
            continue
    assert sorted(ids) == sorted(set(ids)), "a candidate was judged twice"
    assert len(ids) == 5


def _workers_of(out: Path) -> list[int]:
    """Audit worker processes of the audit writing into `out` (their extension folder is under it: in the
    environment they started with, or, forked from a template, among their mounts)."""
    return worker_pids("kgate.audit.worker", lambda proc: str(out.resolve()).encode() in (proc / "environ").read_bytes()
                       + (proc / "mountinfo").read_bytes())


def test_sigterm_during_a_hang_kills_the_worker_and_records_nothing_for_it(tmp_path):
    out = tmp_path / "run"
    args = [*BASE[:-1], "contract", "-k", "hang", "--jobs", "1", "--timeout", "120", "--out", str(out), "-q"]
    env = {k: v for k, v in os.environ.items() if k != CACHE_ENV}  # its builds under `out`, where _workers_of looks
    proc = subprocess.Popen([sys.executable, "-m", "kgate", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _workers_of(out):
            time.sleep(0.2)
        assert _workers_of(out), "the hanging candidate's worker never started"
        time.sleep(3)  # well inside the standard test's hang
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert time.monotonic() - started < 30
        time.sleep(0.5)
        assert _workers_of(out) == [], "an interrupted audit left a worker running"
        assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text().strip()
    finally:
        for pid in [proc.pid, *_workers_of(out)]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def test_max_time_stops_early_and_exits_3(tmp_path):
    out = tmp_path / "run"
    args = [*BASE[:-1], "contract", "-k", PLAIN, "--jobs", "1", "--out", str(out), "-q"]
    assert kgate_main([*args, "--max-time", "0.001"]) == 3
    assert kgate_main([*args, "--resume"]) == 0
    assert len(_records(out)) == 2


def test_rejudge_stale_judges_again_only_what_another_kgate_recorded(tmp_path):
    out = tmp_path / "run"
    args = [*BASE[:-1], "contract", "-k", PLAIN, "--jobs", "1", "--out", str(out), "-q"]
    assert kgate_main(args) == 0
    first = _records(out)
    lines = (out / "results.jsonl").read_text().splitlines()
    old = json.loads(lines[0])
    old["kgate"] = {"version": "0.0.1", "source": "0" * 16}  # as if an earlier kgate had judged it
    old["duration_s"] = -1.0  # a value no judging gives: a record judged again cannot keep it by chance
    lines[0] = json.dumps(old)
    (out / "results.jsonl").write_text("\n".join(lines) + "\n{\"torn")  # and a torn last line
    assert kgate_main([*args, "--resume", "--rejudge-stale"]) == 0
    now = _records(out)
    assert set(now) == set(first)
    assert now[old["id"]]["kgate"] != old["kgate"] and now[old["id"]]["duration_s"] != old["duration_s"]
    other = next(i for i in first if i != old["id"])
    assert now[other] == first[other]  # the current kgate's record is kept as it was
    replaced = [json.loads(line) for line in (out / "results.replaced.jsonl").read_text().splitlines()]
    assert [r["kgate"] for r in replaced] == [old["kgate"]]
    assert kgate_main([*args, "--resume", "--rejudge-stale"]) == 0  # nothing stale now: nothing judged again
    assert _records(out) == now and len((out / "results.jsonl").read_text().splitlines()) == 2
    assert kgate_main([*args, "--rejudge-stale"]) == 2  # needs --resume
    # --keep-source: an earlier kgate's records named as current are kept; the others are judged again
    lines = (out / "results.jsonl").read_text().splitlines()
    marked = [json.loads(line) for line in lines]
    marked[0]["kgate"] = {"version": "0.0.1", "source": "a" * 16}
    marked[1]["kgate"] = {"version": "0.0.1", "source": "b" * 16}
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in marked))
    assert kgate_main([*args, "--resume", "--rejudge-stale", "--keep-source", "a" * 16]) == 0
    after = _records(out)
    assert after[marked[0]["id"]] == marked[0]
    assert after[marked[1]["id"]]["kgate"] == now[marked[1]["id"]]["kgate"]  # the current kgate's again
    assert kgate_main([*args, "--resume", "--keep-source", "a" * 16]) == 2  # needs --rejudge-stale


TRIU_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return torch.triu(torch.matmul(A, B))


N = 12


def get_inputs():
    return [torch.triu(torch.rand(N, N)), torch.triu(torch.rand(N, N))]


def get_init_inputs():
    return []
"""

TRIU_SKIPS_ZEROS = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A, B):  # out[i, j] = sum over i <= k <= j: the zero halves are never multiplied
        n = A.shape[0]
        i, k, j = torch.meshgrid(*(torch.arange(n, device=A.device),) * 3, indexing="ij")
        keep = (i <= k) & (k <= j)
        return torch.where(keep, A[:, :, None] * B[None, :, :], torch.zeros((), device=A.device)).sum(1)
"""


def test_a_triangular_problems_kernel_may_skip_its_declared_zeros(tmp_path):
    """The audit knows a KernelBench problem's triangular inputs (kgate.kernelbench.matrix_structure):
    a kernel that skips their zero halves is not failed by special_values for the NaN the oracle gets
    from 0 * NaN there; one that drops a NaN it did multiply still is."""
    problems, candidates = tmp_path / "problems" / "level1", tmp_path / "candidates" / "level1"
    problems.mkdir(parents=True)
    candidates.mkdir(parents=True)
    (problems / "14_Triu.py").write_text(TRIU_PROBLEM)
    (candidates / "14_Triu.py").write_text(TRIU_SKIPS_ZEROS)
    (candidates / "14_Triu__drops_nan.py").write_text(
        TRIU_SKIPS_ZEROS.replace("return torch.where(", "return torch.nan_to_num(torch.where(").replace(
            ".sum(1)", ".sum(1), nan=0.0, posinf=0.0, neginf=0.0)"))
    out = tmp_path / "run"
    assert kgate_main(["audit", "--format", "kernelbench", "--problems", str(tmp_path / "problems"),
                       "--candidates", str(tmp_path / "candidates"), "--device", "cpu", "--gate", "special_values",
                       "--out", str(out), "-q"]) == 1
    records = _records(out)
    skips, drops = _gate(records["level1/14_Triu"], "special_values"), _gate(records["level1/14_Triu__drops_nan"],
                                                                             "special_values")
    assert skips["verdict"] == "pass" and "declared zero" in skips["message"], skips["message"]
    assert drops["verdict"] == "fail", drops["message"]


@pytest.mark.parametrize("listed, device, sees, told", [
    (None, "cuda:1", "1", "cuda:0"),
    ("4,5", "cuda:1", "5", "cuda:0"),
    ("GPU-aa, GPU-bb", "cuda:0", "GPU-aa", "cuda:0"),
    ("4", "cuda:2", None, "cuda:2"),  # not visible: left for the worker to say so
    (None, "cuda", None, "cuda"),
    (None, "cpu", None, "cpu"),
])
def test_a_gpu_worker_sees_its_own_gpu_only(monkeypatch, listed, device, sees, told):
    from kgate.audit.evaluate import pin_gpu

    if listed is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    env: dict[str, str] = {}
    assert pin_gpu(device, env) == told
    assert env.get("CUDA_VISIBLE_DEVICES") == sees


def test_the_worker_judging_on_a_second_gpu_is_given_that_gpu_as_cuda_0(monkeypatch, tmp_path):
    """On several GPUs a candidate that names cuda:0 or allocates on 'cuda' runs where it was sent, and the
    record still says which GPU that was."""
    from kgate.audit import evaluate
    from kgate.runner import WorkerExit

    seen = []

    def supervise(module, job, *, env, on_event, **kw):
        seen.append((job["device"], env.get("CUDA_VISIBLE_DEVICES")))
        on_event({"event": "problem_error", "message": "stop here"})
        return WorkerExit(0)

    monkeypatch.setattr(evaluate, "supervise", supervise)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    (tmp_path / "c.py").write_text("")
    (tmp_path / "p.py").write_text("")
    pair = Pair(id="p", candidate=tmp_path / "c.py", problem=tmp_path / "p.py")
    record = evaluate.evaluate_pair(pair, evaluate.AuditOptions(gates=["contract"], out_dir=tmp_path), "cuda:1")
    assert seen == [("cuda:0", "3")] and record["device"] == "cuda:1"


def test_device_lease_gives_one_candidate_the_whole_device():
    slots = DeviceLease(2)
    slots.acquire()
    got = threading.Event()

    def alone():
        slots.acquire(2)
        got.set()
        slots.release(2)

    t = threading.Thread(target=alone)
    t.start()
    time.sleep(0.1)
    assert not got.is_set(), "exclusive must wait for the shared slot"
    slots.release()
    t.join(timeout=5)
    assert got.is_set()


def test_what_a_problem_outgrew_only_grows():
    """A problem's candidates go to the wider share once one outgrew a single share, to the whole device once
    one outgrew the wider share; a later candidate that outgrew only a single share does not undo that."""
    seen = Outgrown()
    pair = Pair(id="p", candidate=Path("c.py"), problem=Path("p.py"))
    other = Pair(id="q", candidate=Path("d.py"), problem=Path("q.py"))
    assert not seen.needs({"oom": False}, pair, whole=False)
    assert not seen.wider(pair) and not seen.known(pair)
    assert seen.needs({"oom": True}, pair, whole=False)
    assert seen.wider(pair) and not seen.known(pair) and not seen.wider(other)
    assert seen.needs({"host_memory": True}, pair, whole=True)
    assert seen.known(pair) and not seen.wider(pair)
    assert seen.needs({"oom": True}, pair, whole=False)
    assert seen.known(pair), "a whole device once needed stays needed"
    unpaired = Pair(id="u", candidate=Path("u.py"), problem=None)
    assert seen.needs({"oom": True}, unpaired) and not seen.known(unpaired)


def test_a_wider_request_waits_first_and_the_slots_go_to_it_as_they_free_up():
    """No single candidate starts while a wider one waits (else the stream of single ones would starve it),
    and it starts once enough slots are free, with the others still in flight."""
    slots = DeviceLease(4)
    for _ in range(3):
        slots.acquire()
    order = []

    def take(name, width):
        slots.acquire(width)
        order.append(name)

    wide = threading.Thread(target=take, args=("wide", 2))
    wide.start()
    time.sleep(0.1)
    single = threading.Thread(target=take, args=("single", 1))
    single.start()
    time.sleep(0.1)
    assert order == [], "one slot is free, but the wider request waits for two and goes first"
    slots.release()  # two free: the wider one, not the single one that came later
    wide.join(timeout=5)
    time.sleep(0.1)
    assert order == ["wide"] and slots.used == 4
    slots.release(2)
    single.join(timeout=5)
    assert order == ["wide", "single"] and slots.used == 3


def test_manifest_entry_drives_the_audit(tmp_path, write_manifest):
    manifest = write_manifest(f"""
        version: 1
        kernels:
          - name: corpus
            format: kernelbench
            problems: {CORPUS / 'problems'}
            candidates: {CORPUS / 'candidates'}
        """)
    code = kgate_main(["audit", "--manifest", str(manifest), "--device", "cpu", "--gate", "contract",
                       "-k", "9_Linear_Scale and not __", "--out", str(tmp_path / "o"), "-q"])
    assert code == 0
    assert set(_records(tmp_path / "o" / "corpus")) == {"level2/9_Linear_Scale"}
    bad = write_manifest("""
        version: 1
        kernels:
          - name: corpus
            format: kernelbench
            problems: nowhere/
            candidates: nowhere/
        """, name="bad.yaml")
    assert kgate_main(["audit", "--manifest", str(bad)]) == 2
    # flags the manifest would silently override
    assert kgate_main(["audit", "--manifest", str(manifest), "--problems", "elsewhere"]) == 2


def test_usage_errors_exit_2(capsys):
    assert kgate_main(["audit", "--problems", str(CORPUS / "problems")]) == 2
    assert "--candidates" in capsys.readouterr().err
    assert kgate_main([*BASE, "--shard", "3/2"]) == 2
    assert kgate_main([*BASE[:-2], "--gate", "nope"]) == 2


@pytest.mark.slow
def test_ray_backend_on_a_local_instance(tmp_path):
    pytest.importorskip("ray")
    from kgate.audit.evaluate import AuditOptions
    from kgate.audit.ray_backend import run_ray

    pairs = [p for p in discover(CORPUS / "problems", CORPUS / "candidates")
             if p.id in ("level1/19_ReLU", "level1/19_ReLU__nan_masking", "level1/19_ReLU__segfault")]
    options = AuditOptions(gates=["contract", "special_values"], out_dir=tmp_path, timeout=60)
    records = []
    judged = run_ray(pairs, options, address="local", device="cpu", slots=1, sink=records.append, num_cpus=2)
    assert judged == 3
    by_id = {r["id"]: r for r in records}
    assert by_id["level1/19_ReLU"]["standard"]["verdict"] == "pass"
    assert _gate(by_id["level1/19_ReLU__nan_masking"], "special_values")["verdict"] == "fail"
    assert "SIGSEGV" in by_id["level1/19_ReLU__segfault"]["standard"]["message"]
    assert by_id["level1/19_ReLU"]["candidate"] == str(pairs[0].candidate)  # the driver's paths, not the node's


class _FakeRay:
    """Just enough of Ray for run_ray's scheduling: tasks run when their result is asked for, in order."""

    def __init__(self):
        self.started, self.pending, self.asked = False, {}, []

    def is_initialized(self):
        return self.started

    def init(self, **kwargs):
        self.started = True

    def shutdown(self):
        self.started = False

    def cluster_resources(self):
        return {"GPU": 1.0, "CPU": 4.0}

    def remote(self, fn):
        fake = self

        class Task:
            def options(self, **opts):
                self.opts = opts
                return self

            def remote(self, *args):
                ref = object()
                fake.pending[ref] = (fn, args, self.opts)
                return ref

        return Task()

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        fn, args, opts = self.pending.pop(ref)
        self.asked.append((args[0]["id"], opts["num_gpus"], args[5]))  # args[5]: the memory fraction
        return fn(*args)

    def cancel(self, ref, force=False):
        self.pending.pop(ref, None)


def test_ray_sends_a_problems_other_candidates_to_a_whole_gpu_once_one_outgrew_its_share(monkeypatch, tmp_path):
    """The Ray backend's scheduling with a fake Ray: a candidate that ran out of GPU memory while sharing is
    judged again with a whole GPU, and the problem's candidates submitted after that ask for a whole GPU at
    once (those already in flight are judged again like the first)."""
    from kgate.audit import ray_backend, scheduler
    from kgate.audit.evaluate import AuditOptions

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_backend, "NODE_CACHE", tmp_path / "node")
    monkeypatch.setattr(ray_backend, "needs_compile", lambda pair: False)

    earliers = {}

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        earliers.setdefault(pair.id, []).append(earlier)
        oom = pair.problem.name == "huge.py" and gpu_memory_fraction is not None
        return {"id": pair.id, "oom": oom, "gates": [], "device": device, "standard": {"verdict": "pass"},
                "standard_s": 1.5, "tamper": None}

    monkeypatch.setattr(ray_backend, "evaluate_pair", fake_evaluate)
    for name in ("huge.py", "small.py", "c.py"):
        (tmp_path / name).write_text("# a file\n")
    huge, small, source = tmp_path / "huge.py", tmp_path / "small.py", tmp_path / "c.py"
    ids = ["huge__a", "small__a", "huge__b", "small__b", "small__c", "huge__c"]
    pairs = [Pair(i, source, huge if i.startswith("huge") else small) for i in ids]
    held, records = [], []

    class Heard(scheduler.Progress):
        def held(self, pair, why):
            held.append((pair.id, why))

    judged = ray_backend.run_ray(pairs, AuditOptions(gates=[], out_dir=tmp_path), address="local", device="cuda",
                                 slots=2, sink=records.append, progress=Heard())
    assert judged == len(ids) and sorted(r["id"] for r in records) == sorted(ids)
    tries = {}
    for pair_id, gpus, fraction in fake.asked:
        tries.setdefault(pair_id, []).append((gpus, fraction))
    assert tries["huge__a"] == [(0.5, 0.475), (1.0, None)] and tries["small__a"] == [(0.5, 0.475)]
    # the try alone hears of the try in a share (its standard test may stand: kept_standard)
    assert earliers["huge__a"] == [None, {"standard": {"verdict": "pass"}, "standard_s": 1.5, "tamper": None,
                                          "gates": []}]
    assert tries["huge__b"] == [(0.5, 0.475), (1.0, None)]  # in flight before huge__a's result came
    assert tries["huge__c"] == [(1.0, None)]  # submitted after it: a whole GPU at once
    by_id = {r["id"]: r for r in records}
    assert by_id["huge__a"]["retried_alone"] and by_id["huge__c"]["alone"] == scheduler.HELD_PROBLEM
    assert "retried_alone" not in by_id["huge__c"] and "alone" not in by_id["small__c"]
    assert ("huge__c", scheduler.HELD_PROBLEM) in held and ("huge__a", scheduler.HELD_OOM) in held
    assert not fake.started  # the instance it started is shut down


def test_ray_tasks_budget_gpu_memory_like_the_local_backend():
    """A task sharing a GPU asks Ray for its share and its worker may use only that share of the memory;
    the second try of a candidate that ran out of it asks for the whole GPU, with no memory limit."""
    from kgate.audit.ray_backend import task_share

    assert task_share(gpu=True, slots=4, alone=False) == (0.25, 0.2375)
    assert task_share(gpu=True, slots=4, alone=True) == (1.0, None)
    assert task_share(gpu=True, slots=1, alone=False) == (1.0, None)
    assert task_share(gpu=False, slots=4, alone=False) == (0.0, None)
    # both backends judge again alone on the same signs: out of GPU memory, or past the host memory limit
    from kgate.audit.evaluate import needs_whole_gpu

    assert needs_whole_gpu({"oom": True}) and needs_whole_gpu({"host_memory": True})
    assert not needs_whole_gpu({"oom": False, "host_memory": False}) and not needs_whole_gpu({})


def test_gpu_oom_while_sharing_is_judged_again_alone(monkeypatch, tmp_path):
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    calls = []

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        calls.append((pair.id, gpu_memory_fraction))
        oom = pair.id == "big" and gpu_memory_fraction is not None  # fits only with the whole device
        return {"id": pair.id, "oom": oom, "gates": [], "device": device}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair("big", CORPUS / "x.py", None), Pair("small", CORPUS / "y.py", None)]
    plan = scheduler.Plan(devices=["cuda:0"], slots=2, compile_jobs=1, compile_stage=False)
    records = []
    judged = scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append)
    assert judged == 2
    by_id = {r["id"]: r for r in records}
    assert by_id["big"]["retried_alone"] and not by_id["big"]["oom"]
    assert ("big", None) in calls and ("big", 0.475) in calls  # shared: a budgeted share; alone: all of it
    assert "retried_alone" not in by_id["small"]


def test_judges_sharing_a_machine_share_its_cores(monkeypatch, tmp_path):
    """Each worker gets its share of the cores for torch's threads, on GPUs as on the CPU: 8 judges each
    taking all 16 cores (torch's default) ran their CPU work 8x oversubscribed. A caller's choice stands."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    seen = []

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        seen.append(options.threads)
        return {"id": pair.id, "oom": False, "gates": [], "device": device}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    pairs = [Pair("a", CORPUS / "x.py", None)]
    for devices, slots, threads, expected in [(["cuda:0"], 8, None, 2), (["cuda:0", "cuda:1"], 3, None, 2),
                                              (["cpu"], 4, None, 4), (["cuda:0"], 1, None, None),
                                              (["cuda:0"], 8, 5, 5)]:
        seen.clear()
        plan = scheduler.Plan(devices=devices, slots=slots, compile_jobs=1, compile_stage=False)
        assert scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path, threads=threads), plan,
                                   lambda r: None) == 1
        assert seen == [expected], (devices, slots)


def test_host_memory_limit_while_sharing_is_judged_again_alone(monkeypatch, tmp_path):
    """A worker killed at its host memory limit while it shared the GPU (its float64 oracle did not fit in
    its share and moved to the CPU) is judged again with the whole GPU, like an out-of-memory error."""
    from kgate.audit import evaluate, scheduler
    from kgate.audit.evaluate import AuditOptions
    from kgate.runner import MEMORY_LIMIT

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        record = {"id": pair.id, "device": device, "problem_error": None, "standard": {}}
        cause = f"{MEMORY_LIMIT} 24.0 GiB (resident 24.1 GiB)" if gpu_memory_fraction is not None else None
        record["error"] = cause
        results = {} if cause else {"oracle": GateResult("oracle", "pass", "ok", False)}
        return evaluate._finish(record, ["oracle"], results, cause, time.perf_counter())

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair("big", CORPUS / "x.py", None)]
    plan = scheduler.Plan(devices=["cuda:0"], slots=2, compile_jobs=1, compile_stage=False)
    records = []
    assert scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append) == 1
    (record,) = records
    assert record["retried_alone"] and not record["host_memory"] and record["gates"][0]["verdict"] == "pass"


def test_a_problem_that_outgrew_a_share_sends_its_other_candidates_straight_to_the_whole_device(monkeypatch, tmp_path):
    """Once one candidate of a problem ran out of memory while sharing, the problem's other candidates are
    not tried in a share at all (what outgrows a share is the problem's own size): they are judged alone,
    once, and the record says why; the console's progress hears of each held candidate."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    calls, held = [], []
    lock = threading.Lock()

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        with lock:
            calls.append((pair.id, gpu_memory_fraction))
        time.sleep(0.05)
        oom = pair.problem.name == "huge.py" and gpu_memory_fraction is not None
        return {"id": pair.id, "oom": oom, "gates": [], "device": device}

    class Heard(scheduler.Progress):
        def held(self, pair, why):
            held.append((pair.id, why))

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    huge, small = CORPUS / "huge.py", CORPUS / "small.py"
    pairs = [Pair("huge__a", CORPUS / "a.py", huge), Pair("small__a", CORPUS / "b.py", small),
             Pair("huge__b", CORPUS / "c.py", huge), Pair("small__b", CORPUS / "d.py", small),
             Pair("huge__c", CORPUS / "e.py", huge)]
    plan = scheduler.Plan(devices=["cuda:0"], slots=2, compile_jobs=1, compile_stage=False)
    records = []
    judged = scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append,
                                 progress=Heard())
    assert judged == 5 and sorted(r["id"] for r in records) == sorted(p.id for p in pairs)
    shared = [i for i, f in calls if f is not None]
    assert "huge__a" in shared and "huge__c" not in shared  # huge__c comes after huge__a's failure
    assert sorted(i for i, f in calls if f is None) == ["huge__a", "huge__b", "huge__c"]
    by_id = {r["id"]: r for r in records}
    assert by_id["huge__a"]["retried_alone"] and by_id["huge__a"]["alone"] == scheduler.HELD_OOM
    assert by_id["huge__c"]["alone"] == scheduler.HELD_PROBLEM and "retried_alone" not in by_id["huge__c"]
    assert all("alone" not in by_id[i] for i in ("small__a", "small__b"))
    assert ("huge__a", scheduler.HELD_OOM) in held and ("huge__c", scheduler.HELD_PROBLEM) in held
    assert {i for i, _ in held} == {"huge__a", "huge__b", "huge__c"}


def test_second_tries_alone_wait_until_no_shared_work_is_left(monkeypatch, tmp_path):
    """Taking the whole device in mid-run would idle every other slot while the longest candidate in flight
    ends; the second try of a candidate that ran out of memory while sharing comes after the shared work."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    events = []
    lock = threading.Lock()

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        with lock:
            events.append(("start", pair.id, gpu_memory_fraction))
        time.sleep(0.05)
        with lock:
            events.append(("end", pair.id, gpu_memory_fraction))
        oom = pair.id.startswith("big") and gpu_memory_fraction is not None
        return {"id": pair.id, "oom": oom, "gates": [], "device": device}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    ids = ["big1", "s1", "s2", "big2", "s3", "s4", "s5", "s6"]
    pairs = [Pair(i, CORPUS / f"{i}.py", None) for i in ids]
    plan = scheduler.Plan(devices=["cuda:0"], slots=2, compile_jobs=1, compile_stage=False)
    records = []
    judged = scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append)
    assert judged == len(ids) and sorted(r["id"] for r in records) == sorted(ids)
    alone_starts = [n for n, e in enumerate(events) if e[0] == "start" and e[2] is None]
    shared_ends = [n for n, e in enumerate(events) if e[0] == "end" and e[2] is not None]
    assert len(alone_starts) == 2
    assert min(alone_starts) > max(shared_ends), events
    for n in alone_starts:  # alone means alone: nothing else runs until it ends
        assert events[n + 1][:2] == ("end", events[n][1]), events
    assert {r["id"] for r in records if r.get("retried_alone")} == {"big1", "big2"}


def test_the_whole_device_waits_until_no_candidate_in_a_share_can_still_ask_for_a_wider_one(monkeypatch, tmp_path):
    """A candidate held for the whole device is judged once no shared work is left (the scheduler's
    docstring), not as soon as the slots happen to be free: a judge that has just released its slot may be
    about to ask for a wider share for its own candidate, which must not come after the whole device. The
    device's slots here keep each judge that frees one away for a moment, as a busy machine's scheduler may."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    class SlowToComeBack(DeviceLease):
        def release(self, width: int = 1) -> None:
            super().release(width)
            time.sleep(0.3)

    lock, calls = threading.Lock(), []

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        with lock:
            calls.append((pair.id, gpu_memory_fraction))
        first_big = pair.id == "big__a" and earlier is None
        time.sleep(0.6 if first_big else 0.05)
        need = {"big.py": 0.4, "huge.py": 0.9}[pair.problem.name]
        return {"id": pair.id, "oom": gpu_memory_fraction is not None and gpu_memory_fraction < need, "gates": [],
                "device": device, "share_tried": gpu_memory_fraction}

    monkeypatch.setattr(scheduler, "DeviceLease", SlowToComeBack)
    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair("huge__a", CORPUS / "h.py", CORPUS / "huge.py"), Pair("big__a", CORPUS / "a.py", CORPUS / "big.py")]
    plan = scheduler.Plan(devices=["cuda:0"], slots=4, compile_jobs=1, compile_stage=False)
    records = []
    assert scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append) == 2
    assert ("big__a", 0.475) in calls, calls  # big__a outgrew a quarter and took half
    assert calls[-1] == ("huge__a", None), f"a share was taken after the whole device: {calls}"
    assert {r["id"] for r in records if r.get("retried_alone")} == {"huge__a"}


def test_with_four_judges_a_candidate_that_outgrew_its_share_is_judged_again_in_half_the_memory_at_once(
        monkeypatch, tmp_path):
    """On the H200 (throughput benchmark of 2026-12-04): a 2 G-element reduction outgrew a quarter of the memory, was judged alone at
    the end and held the GPU for 100 s with three judges idle; it fits in half. The second try takes half the
    slots as soon as they free up while the others go on; the problem's other candidates go straight there;
    what outgrows half too is judged alone at the end."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    lock = threading.Lock()
    calls, running, peak_beside, earliers = [], {}, {}, {}

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        with lock:
            calls.append((pair.id, gpu_memory_fraction))
            earliers.setdefault(pair.id, []).append(earlier and earlier["share_tried"])
            running[pair.id] = gpu_memory_fraction
            for wide in [i for i, f in running.items() if f == 0.475]:  # what runs beside a wider try
                peak_beside[wide] = max(peak_beside.get(wide, 0), len(running) - 1)
        time.sleep(0.15 if pair.id.startswith("s") else 0.3)
        with lock:
            del running[pair.id]
        need = {"big.py": 0.4, "huge.py": 0.9}.get(pair.problem.name, 0.1)
        return {"id": pair.id, "oom": gpu_memory_fraction is not None and gpu_memory_fraction < need, "gates": [],
                "device": device, "share_tried": gpu_memory_fraction}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    big, huge, small = CORPUS / "big.py", CORPUS / "huge.py", CORPUS / "small.py"
    pairs = [Pair("big__a", CORPUS / "a.py", big), Pair("huge__a", CORPUS / "h.py", huge)]
    pairs += [Pair(f"s{i}", CORPUS / f"s{i}.py", small) for i in range(10)]
    pairs += [Pair("big__b", CORPUS / "b.py", big), Pair("huge__b", CORPUS / "i.py", huge)]
    plan = scheduler.Plan(devices=["cuda:0"], slots=4, compile_jobs=1, compile_stage=False)
    records, widened = [], []

    class Heard(scheduler.Progress):
        def widened(self, pair, share):
            widened.append((pair.id, share))

    assert scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append,
                               progress=Heard()) == 14
    assert sorted(widened) == [("big__a", 0.475), ("huge__a", 0.475)]  # the console hears of each second try
    by_id = {r["id"]: r for r in records}
    tried = {i: [f for j, f in calls if j == i] for i in by_id}
    assert tried["big__a"] == [0.2375, 0.475] and tried["big__b"] == [0.475]  # no quarter for the second
    assert by_id["big__a"]["retried_wider"] and by_id["big__a"]["share"] == 0.475 and "alone" not in by_id["big__a"]
    assert by_id["big__b"]["wider"] == scheduler.WIDER_PROBLEM and "retried_wider" not in by_id["big__b"]
    assert tried["huge__a"] == [0.2375, 0.475, None] and by_id["huge__a"]["retried_alone"]
    assert tried["huge__b"] == [None] and by_id["huge__b"]["alone"] == scheduler.HELD_PROBLEM
    # each try after the first hears of the one before (its standard test may stand: kept_standard)
    assert earliers["big__a"] == [None, 0.2375] and earliers["huge__a"] == [None, 0.2375, 0.475]
    assert earliers["big__b"] == [None] and earliers["huge__b"] == [None]
    assert all(tried[f"s{i}"] == [0.2375] and "wider" not in by_id[f"s{i}"] for i in range(10))
    # beside the wider tries the other judges went on, in the other half of the slots (no more)
    assert peak_beside and max(peak_beside.values()) <= 2 and peak_beside.get("big__a", 0) >= 1, peak_beside
    # the whole device still only at the end, nothing beside it
    alone_at = calls.index(("huge__a", None))
    assert all(f is None for _, f in calls[alone_at:])
    assert scheduler.wider_width(4, False) == 2 and scheduler.wider_width(8, False) == 4
    assert scheduler.wider_width(2, False) is None and scheduler.wider_width(4, True) is None
    from kgate.audit.report import summarize  # and the report counts each way

    for r in records:
        r.update(standard={"verdict": "pass"}, labels={}, level=1, problem_error=None, error=None)
    s = summarize(records, [])
    assert (s["retried_wider_after_oom"], s["wider_for_problem"]) == (1, 1)  # big__a, big__b (huge__a: alone)
    assert (s["retried_alone_after_oom"], s["alone_for_problem"]) == (1, 1)
    assert scheduler.wider_width(2, False) is None and scheduler.wider_width(4, True) is None


def test_the_console_counts_second_tries_in_a_wider_share_while_they_run():
    import io

    from rich.console import Console

    from kgate.audit import scheduler
    from kgate.commands import audit as audit_command

    out = io.StringIO()
    console = audit_command._ConsoleProgress(Console(file=out, width=200), total=3, quiet=False)
    a, b = (Pair(id=i, candidate=Path(f"{i}.py"), problem=Path("p.py")) for i in ("a", "b"))
    console.widened(a, 0.475)
    console.widened(b, 0.475)
    assert console.counts[audit_command.WIDER] == 2
    console.held(b, scheduler.HELD_OOM)  # outgrew the wider share too: waits for the whole device
    assert console.counts[audit_command.WIDER] == 1 and console.counts[audit_command.HELD] == 1
    console.finished({"id": "a", "gates": [], "standard": {"verdict": "pass"}, "retried_wider": True})
    assert console.counts[audit_command.WIDER] == 0 and console.counts["pass"] == 1
    assert "again in a wider share 0" in console._text()
    assert out.getvalue().count("judged again now with 48% of the GPU's memory") == 2


def test_past_the_deadline_a_candidate_that_outgrew_its_share_is_left_to_resume(monkeypatch, tmp_path):
    """--max-time starts nothing new past its deadline: a second try in more memory is a new start, so the
    candidate is left out of this run's records (and --resume judges it), as with the tries alone."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    calls = []

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        calls.append((pair.id, gpu_memory_fraction))
        time.sleep(2.0)  # both start inside the deadline, even on a busy machine; both end past it
        return {"id": pair.id, "oom": pair.id == "big" and gpu_memory_fraction == 0.2375, "gates": [],
                "device": device}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair("big", CORPUS / "b.py", CORPUS / "big.py"), Pair("small", CORPUS / "s.py", CORPUS / "small.py")]
    plan = scheduler.Plan(devices=["cuda:0"], slots=4, compile_jobs=1, compile_stage=False)
    records = []
    judged = scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append,
                                 stop_at=time.monotonic() + 1.0)
    assert judged == 1 and [r["id"] for r in records] == ["small"]
    assert sorted(calls) == [("big", 0.2375), ("small", 0.2375)]  # no second try


def test_a_try_with_more_memory_keeps_the_standard_test_no_limit_touched_and_runs_the_gates_again(tmp_path):
    """On the giants KernelBench's check is nearly all the time (55-100 s on the H200) and what outgrows a
    share comes after it (the float64 oracle): the try with more memory keeps that result and runs only the
    gates. One that a memory limit touched, or that ended in an error, is run again."""
    from kgate.audit.evaluate import AuditOptions, evaluate_pair, kept_standard, outgrew
    from kgate.runner import MEMORY_LIMIT

    pair = Pair("level1/19_ReLU__wrong", CORPUS / "candidates/level1/19_ReLU__wrong.py",
                CORPUS / "problems/level1/19_ReLU.py")
    options = AuditOptions(gates=["contract"], out_dir=tmp_path, timeout=120)
    first = evaluate_pair(pair, options, "cpu")
    assert first["standard"]["verdict"] == "fail" and "standard" in first["timeline"]
    earlier = {**first, "oom": True, "tamper": "seen in the share"}
    again = evaluate_pair(pair, options, "cpu", earlier=earlier)
    assert again["standard"] == first["standard"] and "standard" not in again["timeline"]  # not run again
    assert again["gates"][0]["gate"] == "contract" and "loading" in again["timeline"]  # the gates ran again
    assert again["tamper"] == "seen in the share" and "smaller share" in again["notes"]["standard"]
    assert again["notes"]["earlier_try"].endswith("in: (not said)")
    assert again["earlier_try_s"] == first["duration_s"] > 0  # the judge-seconds of the try no verdict came of
    oom = {"gate": "oracle", "verdict": "error", "message": "torch.OutOfMemoryError: CUDA out of memory. Tried"}
    assert outgrew({"standard": first["standard"], "gates": [oom, {**oom, "gate": "shapes", "verdict": "pass"}]}) \
        == "oracle"
    for touched in ({**first["standard"], "message": "torch.OutOfMemoryError: CUDA out of memory."},
                    {**first["standard"], "trace": f"{MEMORY_LIMIT} 24.0 GiB"},
                    {**first["standard"], "verdict": "error"}, None):
        assert kept_standard({"standard": touched}) is None
    rerun = evaluate_pair(pair, options, "cpu", earlier={"standard": {**first["standard"], "verdict": "error"}})
    assert "standard" in rerun["timeline"] and rerun["standard"]["verdict"] == "fail"


def _two_device_run(monkeypatch, tmp_path, *, prestart, seconds):
    """run_local on two devices x two slots over 24 pairs, with a fake evaluation that takes `seconds` and
    runs out of memory for p03 while sharing; returns (records, the peak of evaluations at once per
    device, each evaluation's (pair, device, memory fraction, turns))."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    lock = threading.Lock()
    running = {"cuda:0": 0, "cuda:1": 0}
    peak = dict(running)
    seen = []

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        with lock:
            running[device] += 1
            peak[device] = max(peak[device], running[device])
            seen.append((pair.id, device, gpu_memory_fraction, turns))
        time.sleep(seconds)
        with lock:
            running[device] -= 1
        return {"id": pair.id, "oom": pair.id == "p03" and gpu_memory_fraction is not None, "gates": [],
                "device": device}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair(f"p{i:02d}", CORPUS / f"p{i}.py", None) for i in range(24)]
    plan = scheduler.Plan(devices=["cuda:0", "cuda:1"], slots=2, compile_jobs=1, compile_stage=False,
                          prestart=prestart)
    records = []
    assert scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append) == 24
    assert sorted(r["id"] for r in records) == [p.id for p in pairs]
    assert next(r for r in records if r["id"] == "p03")["retried_alone"]
    return records, peak, seen


def test_several_devices_share_the_work_each_within_its_slots(monkeypatch, tmp_path):
    """The per-GPU worker pool (issue 8) without GPUs: two devices x two slots judge every pair once,
    both devices work, no device ever runs more than its slots at once, and a second try alone takes
    one whole device while the other goes on."""
    _, peak, seen = _two_device_run(monkeypatch, tmp_path, prestart=False, seconds=0.02)
    assert {d for _, d, _, _ in seen} == {"cuda:0", "cuda:1"} and max(peak.values()) <= 2
    assert [f for i, _, f, _ in seen if i == "p03"] == [0.475, None]
    assert all(t is None for *_, t in seen)


def test_prestart_plans_twice_the_workers_with_the_memory_and_turns_of_the_judging_slots(monkeypatch, tmp_path):
    """--prestart on two devices of two slots: four workers per device at once, each capped at a judging
    slot's share of the memory and given that device's two turns; the second try alone has neither."""
    from kgate.audit.evaluate import turn_folder

    # 0.2 s: long enough for every thread of a device to be in at once
    _, peak, seen = _two_device_run(monkeypatch, tmp_path, prestart=True, seconds=0.2)
    assert peak == {"cuda:0": 4, "cuda:1": 4}
    shared = [(d, f, t) for i, d, f, t in seen if t is not None]
    assert {f for _, f, _ in shared} == {0.475}
    assert {(d, t["path"], t["count"]) for d, _, t in shared} == {
        (d, str(turn_folder(tmp_path, d)), 2) for d in ("cuda:0", "cuda:1")}
    assert [(f, t) for i, _, f, t in seen if i == "p03"][1] == (None, None)  # alone: the whole device, no turn


def test_a_deadline_leaves_the_second_tries_to_resume(monkeypatch, tmp_path):
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        time.sleep(0.3)
        return {"id": pair.id, "oom": pair.id == "big" and gpu_memory_fraction is not None, "gates": [],
                "device": device}

    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair("big", CORPUS / "x.py", None), Pair("small", CORPUS / "y.py", None)]
    plan = scheduler.Plan(devices=["cuda:0"], slots=2, compile_jobs=1, compile_stage=False)
    records = []
    judged = scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, records.append,
                                 stop_at=time.monotonic() + 0.1)
    assert judged == 1 and [r["id"] for r in records] == ["small"]  # no record of big: --resume judges it


def test_manifest_kernelbench_entry_errors_name_line_and_key(write_manifest, capsys):
    bad = write_manifest("""
        version: 1
        kernels:
          - name: corpus
            format: kernelbench
            problem: p/
            candidates: c/
        """)
    assert kgate_main(["audit", "--manifest", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "kgate.yaml:6:5" in err and "unknown key 'problem'" in err and "did you mean 'problems'" in err


def test_a_crash_in_one_gate_costs_only_that_gate(tmp_path):
    code = kgate_main(["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "restart"),
                       "--device", "cpu", "--gate", "shapes,layouts,input_integrity", "--out", str(tmp_path), "-q"])
    assert code == 1
    (record,) = _records(tmp_path).values()
    assert record["standard"]["verdict"] == "pass"
    assert _gate(record, "shapes")["verdict"] == "error" and "SIGSEGV" in _gate(record, "shapes")["message"]
    assert record["restarts"] == 1  # the worker was replaced and judged the gates after the crash
    assert _gate(record, "layouts")["verdict"] == "pass"
    assert _gate(record, "input_integrity")["verdict"] == "pass"


def test_probing_gates_run_at_the_working_shape(tmp_path):
    # 19_ReLU's inputs are 4 x 33; a budget of 40 elements gives the working shape (4, 8)
    code = kgate_main([*BASE[:-2], "--gate", "oracle,shapes,distributions", "--work-elements", "40",
                       "-k", "level1/19_ReLU and not __", "--out", str(tmp_path / "run"),
                       "--report", str(tmp_path / "report"), "-q"])
    assert code == 0
    (record,) = _records(tmp_path / "run").values()
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["working_shape"] == {"19_ReLU": record["notes"]["working_shape"]}
    assert summary["not_applied"] == {}  # a working shape is not a gate that could not apply
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Where the probing gates ran" in report and "batch_size=4, dim=8" in report
    assert "batch_size=4, dim=8" in record["notes"]["working_shape"]
    assert "problem's own shape (batch_size=4, dim=33)" in record["notes"]["working_shape"]
    assert [g["verdict"] for g in record["gates"]] == ["pass", "pass", "pass"]
    # the oracle gate judged the problem's own shape, the shapes gate swept around the working one
    assert _gate(record, "oracle")["evidence"][0]["case"]["shape"] == [4, 33]
    assert _gate(record, "shapes")["details"]["generated"], _gate(record, "shapes")


def test_no_working_shape_is_set_up_when_no_selected_gate_would_probe_there(tmp_path):
    # the same budget as above, but only gates that keep the problem's own shape: nothing to set up
    code = kgate_main([*BASE[:-2], "--gate", "oracle,determinism", "--work-elements", "40",
                       "-k", "level1/19_ReLU and not __", "--out", str(tmp_path / "run"), "-q"])
    assert code == 0
    (record,) = _records(tmp_path / "run").values()
    assert "working_shape" not in record["notes"]
    assert [g["verdict"] for g in record["gates"]] == ["pass", "pass"]


def test_a_kernel_that_only_works_at_its_own_shape_keeps_it_for_every_gate(tmp_path):
    candidates = tmp_path / "candidates" / "level1"
    candidates.mkdir(parents=True)
    (candidates / "19_ReLU.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x) if x.shape[1] == 33 else x\n")
    code = kgate_main(["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(tmp_path / "candidates"),
                       "--device", "cpu", "--gate", "oracle,shapes,distributions", "--work-elements", "40",
                       "--out", str(tmp_path / "run"), "-q"])
    assert code == 1
    (record,) = _records(tmp_path / "run").values()
    assert "own shape for every gate" in record["notes"]["working_shape"]
    assert "misses the oracle" in record["notes"]["working_shape"]
    verdicts = {g["gate"]: g["verdict"] for g in record["gates"]}
    assert verdicts == {"oracle": "pass", "shapes": "fail", "distributions": "pass"}


def test_run_on_a_kernelbench_only_manifest_points_to_audit(write_manifest, tmp_path, capsys):
    (tmp_path / "p").mkdir()
    (tmp_path / "c").mkdir()
    path = write_manifest("""
        version: 1
        kernels:
          - name: corpus
            format: kernelbench
            problems: p/
            candidates: c/
        """)
    assert kgate_main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "kgate audit --manifest" in capsys.readouterr().err.replace("\n", "")


def test_compile_only_with_pch_fills_the_cache_and_later_runs_build_nothing(tmp_path, monkeypatch):
    """One build serves every later run: the judging run after --compile-only, and a new run (--fresh) after
    that. With --pch the shared header, built by the parent before any build, survives every worker: a
    worker's own load_inline (use_pch=False) would delete it, cache hit or not. The header here is a stand-in
    the parent writes where torch keeps the real one (GCC ignores a file that is no valid precompiled
    header); torch's own builder of it is tested in test_pch_build_uses_torchs_builder_and_workers_keep_the_header
    (building the real one takes minutes of the suite)."""
    import torch.utils.cpp_extension as ce

    from kgate.audit import pch

    gch = Path(ce._TORCH_PATH) / "include" / "torch" / "extension.h.gch"
    if gch.exists():
        pytest.skip(f"a precompiled header is in place ({gch}): this test would remove it")
    built = []

    def stand_in() -> tuple[bool, str]:
        gch.write_bytes(b"not a precompiled header: GCC ignores it")
        built.append(gch)
        return True, "--pch: a stand-in header"

    monkeypatch.setattr(pch, "build", stand_in)
    monkeypatch.delenv(CACHE_ENV, raising=False)  # the builds under --out, as by default
    base = ["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "extension"),
            "--device", "cpu", "--gate", "contract", "--out", str(tmp_path), "-q", "--pch"]
    try:
        assert kgate_main(base + ["--compile-only"]) == 0
        assert built and (tmp_path / "torch_extensions").is_dir() and gch.is_file()
        assert not _records(tmp_path)  # nothing judged, nothing recorded
        assert kgate_main(base) == 0
        (record,) = _records(tmp_path).values()
        assert record["compile"]["ok"] and record["standard"]["verdict"] == "pass"
        assert record["compile"]["seconds"] < 5  # found built in the cache
        assert gch.is_file()  # the judging worker kept the shared header
        assert kgate_main([*base, "--fresh"]) == 0  # a new run (not --resume): the build is found in the cache
        (again,) = _records(tmp_path).values()
        assert again["compile"]["ok"] and again["compile"]["seconds"] < 5
        assert gch.is_file()
    finally:
        gch.unlink(missing_ok=True)


def test_audits_into_other_folders_with_one_cache_keep_the_builds_there_and_share_a_worker_template(tmp_path,
                                                                                                    monkeypatch):
    """--cache keeps every candidate's build folders (torch extensions, Triton) out of --out, so that audits
    into other --out folders reuse them; their workers then fork from one template (its view holds the
    folders that hold the builds). Without it each --out has its builds, and its own template."""
    from kgate import forkserver

    monkeypatch.delenv(CACHE_ENV, raising=False)
    started = []
    real = forkserver.Template.__init__

    def counted(self, key, *args, **kwargs):
        started.append(key)
        real(self, key, *args, **kwargs)

    monkeypatch.setattr(forkserver.Template, "__init__", counted)
    one = [*BASE[:-1], "contract", "-k", "level1/19_ReLU and not __", "-q"]
    for name in ("a", "b"):
        assert kgate_main([*one, "--out", str(tmp_path / name), "--cache", str(tmp_path / "cache")]) == 0
    digest = {p.name for p in (tmp_path / "cache" / "triton_cache").iterdir()}
    assert len(digest) == 1 and (tmp_path / "cache" / "torch_extensions" / digest.pop()).is_dir()
    assert not (tmp_path / "a" / "triton_cache").exists() and not (tmp_path / "b" / "torch_extensions").exists()
    sharing = [k for k in started if k[2] == "kgate.audit.worker"]
    if forkserver.enabled() and sharing:  # (workers start one by one where no template can)
        assert len(sharing) == 1, f"two audits with one --cache started {len(sharing)} templates"
    assert kgate_main([*one, "--out", str(tmp_path / "c")]) == 0  # the default: under --out
    assert (tmp_path / "c" / "triton_cache").is_dir()


def test_compile_only_leaves_the_results_alone_and_skips_judged_candidates_on_resume(tmp_path, capsys):
    """A build pass before (or beside) a resumed audit must not truncate its results.jsonl: on the H200 the
    records of earlier slices would have been lost, and every candidate built and judged again."""
    out = tmp_path / "run"
    judged = [*BASE[:-1], "contract", "-k", PLAIN, "--jobs", "1", "--out", str(out), "-q"]
    assert kgate_main(judged) == 0
    before = (out / "results.jsonl").read_text()
    assert len(before.splitlines()) == 2
    ext = ["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "candidates"),
           "--device", "cpu", "--out", str(out), "--compile-only", "--max-time", "0"]
    capsys.readouterr()
    assert kgate_main([*ext, "-k", PLAIN]) in (0, 3)
    assert (out / "results.jsonl").read_text() == before
    assert kgate_main([*ext, "-k", PLAIN, "--resume"]) == 0  # both judged: nothing to build
    assert (out / "results.jsonl").read_text() == before


def test_compile_only_after_max_time_starts_nothing(tmp_path, capsys):
    args = ["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "extension"),
            "--device", "cpu", "--out", str(tmp_path), "--compile-only", "--max-time", "0", "-q"]
    assert kgate_main(args) == 3
    assert "0 built, 0 failed, 1 not started" in capsys.readouterr().out


def test_a_killed_builds_lock_is_cleared_before_the_next_build(tmp_path):
    """torch waits forever on the lock file of a build that was killed; the next build of that candidate
    (a resumed audit, a fresh worker) would hang to its time limit and be recorded as a compile failure."""
    from kgate.audit.evaluate import AuditOptions, clear_stale_locks, worker_env

    (pair,) = [p for p in discover(CORPUS / "problems", CORPUS / "candidates") if p.id == "level1/19_ReLU"]
    options = AuditOptions(gates=["oracle"], out_dir=tmp_path)
    folder = tmp_path / "torch_extensions"
    assert clear_stale_locks(pair, options) == []  # nothing built yet: nothing to do
    build = Path(worker_env(pair, options, gpu=False)["TORCH_EXTENSIONS_DIR"]) / "ext_abc"
    build.mkdir(parents=True)
    (build / "lock").write_text("")
    (build / "main.o").write_text("kept")
    assert clear_stale_locks(pair, options) == [build / "lock"]
    assert not (build / "lock").exists() and (build / "main.o").exists()
    assert str(folder) in str(build)


def _fake_record(id_, gates, **extra):
    return {"id": id_, "level": 1, "problem_name": "p", "labels": {}, "standard": {"verdict": "pass"},
            "gates": gates, "error": None, "problem_error": None, "tamper": None, **extra}


def _fake_gate(name, verdict, broken=False, details=None, message="m"):
    return {"gate": name, "verdict": verdict, "broken": broken, "details": details or {}, "message": message,
            "tolerance_free": False}


def test_the_summary_counts_failures_only_on_empty_inputs_apart():
    passing = [_fake_gate(g, "pass") for g in ("oracle", "layouts")]
    records = [
        _fake_record("empty-only", passing + [_fake_gate("shapes", "fail", True, {"empty_only": True})]),
        _fake_record("on-data", passing + [_fake_gate("shapes", "fail", True, {"empty_only": False})]),
        _fake_record("empty-and-layouts", [_fake_gate("oracle", "pass"), _fake_gate("layouts", "fail", True),
                                           _fake_gate("shapes", "fail", True, {"empty_only": True})]),
        _fake_record("clean", passing + [_fake_gate("shapes", "pass")]),
    ]
    s = summarize(records, ["oracle", "layouts", "shapes"])
    assert (s["violation"], s["broken"]) == (3, 3)
    assert s["violation_empty_only"] == 1 and s["violation_on_data"] == 2 and s["broken_on_data"] == 2
    assert s["violation_empty_only_pct"] == 25.0
    shapes = s["per_gate"]["shapes"]
    assert (shapes["fail"], shapes["empty_only"], shapes["failure_rate"], shapes["failure_rate_on_data"]) == \
        (3, 2, 75.0, 25.0)
    assert s["per_gate"]["layouts"]["failure_rate_on_data"] == s["per_gate"]["layouts"]["failure_rate"] == 25.0
    # with the shapes and layouts gates set aside, none of the four has a violation
    assert (s["violation_as_given"], s["broken_as_given"]) == (0, 0)


def test_the_summary_reads_the_candidates_as_given_with_shapes_and_layouts_aside():
    records = [
        _fake_record("layouts-only", [_fake_gate("oracle", "pass"), _fake_gate("layouts", "fail", True),
                                      _fake_gate("special_values", "pass")]),
        _fake_record("nan-dropped", [_fake_gate("oracle", "pass"), _fake_gate("layouts", "fail", True),
                                     _fake_gate("special_values", "fail", True)]),
        _fake_record("loose", [_fake_gate("oracle", "fail", False), _fake_gate("layouts", "pass"),
                               _fake_gate("special_values", "pass")]),
        _fake_record("crash", [_fake_gate("oracle", "error", True, message="worker died: SIGSEGV"),
                               _fake_gate("layouts", "pass"), _fake_gate("special_values", "pass")], error="SIGSEGV"),
    ]
    s = summarize(records, ["oracle", "layouts", "special_values"])
    assert (s["violation"], s["broken"]) == (4, 3)
    assert (s["violation_as_given"], s["broken_as_given"]) == (3, 2)
    assert s["violation_as_given_pct"] == 75.0


def test_a_memory_limit_below_the_workers_start_judges_nothing_and_says_why(tmp_path, monkeypatch):
    """A --memory under what the worker needs before the candidate loads: the standard test records the
    candidate as never loaded (compiled False), which used to count as a crash, so such a candidate was
    "judged" with no violation: `pass`, exit 0, even with a syntax error. It is not judged, and the
    console says why. (Workers started on their own, each importing torch: one forked from the template
    shares the template's pages and starts far below this limit.)"""
    monkeypatch.setenv("KGATE_FORKSERVER", "0")
    from kgate.audit.report import LIMITED, classify, not_judged_reason
    from kgate.runner import MEMORY_LIMIT

    limit = f"{MEMORY_LIMIT} 200 MiB (resident 203 MiB)"
    record = _fake_record("tiny-limit", [_fake_gate("contract", "error", True, message=f"not run: {limit} earlier")],
                          error=limit, standard={"verdict": "error", "compiled": False})
    c = classify(record)
    assert not c["judged"] and c["limited"] and not_judged_reason(record, c) == LIMITED
    s = summarize([record], ["contract"])
    assert (s["judged"], s["all_gates_pass"], s["not_judged_reasons"]) == (0, 0, {LIMITED: 1})
    never_loaded = _fake_record("syntax", [_fake_gate("contract", "error", True, message="not run: could not load")],
                                standard={"verdict": "error", "compiled": False})
    assert classify(never_loaded)["judged"] and classify(never_loaded)["broken"]  # without a limit: a crash
    out = tmp_path / "o"
    code = kgate_main(["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "candidates"),
                       "--device", "cpu", "-k", "19_ReLU and (syntax or not __)", "--gate", "contract",
                       "--memory", "150MiB", "--out", str(out)])
    assert code == 2  # no candidate could be judged
    from kgate.audit.results import ResultsFile

    records = ResultsFile(out / "results.jsonl").read()
    assert len(records) == 2 and all(not classify(r)["judged"] for r in records.values())


def test_the_summary_sets_apart_candidates_stopped_at_kgates_memory_limits():
    """Out of GPU memory with the whole GPU, or killed at the host memory limit, with nothing else
    wrong: most likely kgate's float64 oracle, so not judged (under that reason) rather than a crash. A
    candidate with a real violation besides stays judged, with that violation only."""
    from kgate.runner import MEMORY_LIMIT

    host = f"{MEMORY_LIMIT} 24.0 GiB (resident 24.3 GiB)"
    records = [
        _fake_record("host-limit", [_fake_gate("oracle", "pass"), _fake_gate("shapes", "error", True, message=host),
                                    _fake_gate("layouts", "error", True, message=f"not run: {host} earlier")],
                     error=host),
        _fake_record("gpu-oom", [_fake_gate("oracle", "error", True, message="CUDA out of memory. Tried to allocate"),
                                 _fake_gate("shapes", "pass"), _fake_gate("layouts", "pass")]),
        _fake_record("oom-and-wrong", [_fake_gate("oracle", "fail", True),
                                       _fake_gate("shapes", "error", True, message="torch.OutOfMemoryError: CUDA"),
                                       _fake_gate("layouts", "pass")]),
        _fake_record("crash", [_fake_gate("oracle", "error", True, message="worker died: SIGSEGV"),
                               _fake_gate("shapes", "pass"), _fake_gate("layouts", "pass")], error="SIGSEGV"),
    ]
    s = summarize(records, ["oracle", "shapes", "layouts"])
    assert (s["judged"], s["not_judged"], s["stopped_at_limits"]) == (2, 2, 2)
    assert (s["violation"], s["broken"]) == (2, 2)
    shapes = s["per_gate"]["shapes"]  # the judged candidates' OOM: not run, not a failure
    assert (shapes["not_run"], shapes["error"], shapes["fail"], shapes["failure_rate"]) == (1, 0, 0, 0.0)
    assert s["per_gate"]["oracle"]["fail"] == 1 and s["per_gate"]["oracle"]["error"] == 1  # the wrong one, the crash
    assert any("memory limits" in reason for reason in s["not_judged_reasons"])


def test_an_error_the_problems_own_code_raised_is_not_the_candidates_violation():
    """A gate `error` raised by the reference, its float64 oracle or the inputs (kgate.worker records the
    role) says nothing of the candidate: not a violation, and a candidate with nothing else is not judged,
    under that reason (the H200 audit's MiniGPTBlock, whose lambda kgate's float64 copy did not follow);
    the candidate's own errors still count."""
    from kgate.audit.report import REFERENCE_FAILED

    by_reference = {"role": "reference (float64 oracle)"}
    records = [
        _fake_record("only-reference", [_fake_gate(g, "error", True, by_reference, "reference (float64 oracle) "
                                                   "raised RuntimeError: mat1 and mat2") for g in ("oracle", "shapes")]),
        _fake_record("reference-and-wrong", [_fake_gate("oracle", "fail", True),
                                             _fake_gate("shapes", "error", True, {"role": "inputs factory"})]),
        _fake_record("kernel-raised", [_fake_gate("oracle", "error", True, {"role": "kernel"}),
                                       _fake_gate("shapes", "pass")]),
    ]
    s = summarize(records, ["oracle", "shapes"])
    assert (s["judged"], s["not_judged"], s["violation"]) == (2, 1, 2)
    assert s["not_judged_reasons"] == {REFERENCE_FAILED: 1}
    shapes = s["per_gate"]["shapes"]  # the inputs factory's error: no verdict on the candidate
    assert (shapes["error"], shapes["not_run"], shapes["pass"]) == (0, 1, 1)
    assert s["per_gate"]["oracle"]["error"] == 1 and s["per_gate"]["oracle"]["fail"] == 1


def test_pch_build_uses_torchs_builder_and_workers_keep_the_header(monkeypatch):
    from torch.utils import cpp_extension

    from kgate.audit import pch

    calls = []
    monkeypatch.setattr(cpp_extension, pch._BUILDER, lambda cflags, paths: calls.append((cflags, paths)))
    monkeypatch.setattr(cpp_extension, pch._REMOVER, lambda: calls.append("removed"))
    built, line = pch.build()
    assert built and "precompiled" in line and calls == [([], [])]
    pch.keep_shared()
    getattr(cpp_extension, pch._REMOVER)()
    getattr(cpp_extension, pch._BUILDER)(["-O3"], [])
    assert calls == [([], [])]  # neither deletes nor rebuilds any more


def test_a_failed_pch_build_leaves_the_audit_as_it_was(monkeypatch):
    from torch.utils import cpp_extension

    from kgate.audit import pch

    def refuse(cflags, paths):
        raise PermissionError("read-only torch folder")

    monkeypatch.setattr(cpp_extension, pch._BUILDER, refuse)
    built, line = pch.build()
    assert not built and "could not precompile" in line and "read-only" in line and "building without it" in line


def test_a_worker_that_cannot_start_says_why(tmp_path, monkeypatch):
    """kgate's own start failing in the audit's worker (here torch cannot be imported) is the record's error
    with its cause, not 'worker exited with code 1'."""
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: failed to map segment')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    kgate_main([*BASE, "-k", "level1/19_ReLU and not __", "--gate", "oracle",
                "--out", str(tmp_path / "run"), "-q"])
    [record] = _records(tmp_path / "run").values()
    cause = "the worker could not start, before any kernel code ran: ImportError: libtorch_cuda.so: failed to map segment"
    assert record["error"] == cause
    assert _gate(record, "oracle")["message"] == f"not run: {cause} earlier"
    # the compile stage's worker says the same
    from kgate.audit.evaluate import AuditOptions, compile_pair

    pair = next(p for p in discover(CORPUS / "problems", CORPUS / "candidates") if p.id == "level1/19_ReLU")
    outcome = compile_pair(pair, AuditOptions(gates=[], out_dir=tmp_path / "compile"))
    assert not outcome["ok"] and outcome["message"] == f"compile stage: {cause}"


def test_prestart_gives_the_same_verdicts_and_a_candidate_cannot_stop_the_clock(audited, tmp_path):
    """--prestart: twice the workers, --jobs of them judging, the others started and waiting for a turn
    (kgate.audit.turns). The verdicts are those of the plain audit; the wait is recorded and untimed; a
    candidate that forges the `waiting` event on its worker's pipe still times out."""
    import shutil

    candidates = tmp_path / "candidates"
    shutil.copytree(CORPUS / "candidates", candidates)
    (candidates / "level1" / "19_ReLU__forges_waiting.py").write_text(
        "import json, os, sys, time\n\nimport torch.nn as nn\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        fd = json.load(open(sys.argv[1]))['event_fd']  # kgate's event pipe, named in the job file\n"
        "        while True:\n"
        "            os.write(fd, b'{\"event\": \"waiting\"}\\n')\n"
        "            time.sleep(0.5)\n")
    out = tmp_path / "run"
    kgate_main(["audit", "--format", "kernelbench", "--problems", str(CORPUS / "problems"), "--candidates",
                str(candidates), "--device", "cpu", "--gate", GATES, "--jobs", "2", "--prestart", "--timeout", "12",
                "--out", str(out), "-q"])
    records = _records(out)
    forged = records.pop("level1/19_ReLU__forges_waiting")
    assert forged["standard"]["message"].endswith("timed out after 12 s in the standard test"), forged["standard"]

    def verdicts(r):
        return r["standard"]["verdict"], [(g["gate"], g["verdict"]) for g in r["gates"]], bool(r["tamper"])

    plain = audited[2]
    assert {k: verdicts(r) for k, r in records.items()} == {k: verdicts(plain[k]) for k in records}
    for r in records.values():
        t = r["timeline"]
        assert 0 < t["waiting"] <= t["loading"], t
    assert sorted(p.name for p in (out / "turns" / "cpu").iterdir()) == ["turn0.lock", "turn1.lock"]


def test_a_turn_is_held_until_its_worker_exits_and_not_by_a_child_it_forked(tmp_path):
    """kgate.audit.turns: one turn, two workers; the second gets it only when the first exits, even though
    the first left a forked child behind that still runs."""
    take = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from kgate.audit import turns; "
            f"turns.take(turns.open_turns({str(tmp_path)!r}, 1))")
    first = subprocess.Popen([sys.executable, "-c", take + "; import os, time\n"
                              "if os.fork() == 0:\n    time.sleep(10); os._exit(0)\n"
                              "print('held', flush=True); time.sleep(2)"], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        start = time.monotonic()
        second = subprocess.run([sys.executable, "-c", take], timeout=20)
        waited = time.monotonic() - start
        assert second.returncode == 0 and first.poll() is not None
        assert 1.0 < waited < 10, waited
    finally:
        first.kill()


def test_an_audit_folder_with_records_is_not_emptied_by_mistake_and_bad_options_stop_before_any_work(
        tmp_path, capsys):
    """A run without --resume emptied OUT/results.jsonl silently (hours of records); now it is refused
    unless --resume or --fresh says which. Output paths and numbers that cannot work are usage errors
    before anything is judged; a damaged results file (a garbage line, bytes that are not UTF-8) is read
    around, and the console says so."""
    def said():  # the console's words (errors on stderr), its line wrapping undone
        captured = capsys.readouterr()
        return " ".join((captured.out + captured.err).split())

    out = tmp_path / "o"
    base = ["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "candidates"),
            "--device", "cpu", "-k", "19_ReLU and not __", "--gate", "contract", "--out", str(out), "-q"]
    assert kgate_main(base) == 0
    results = out / "results.jsonl"
    first = results.read_bytes()
    assert kgate_main(base) == 2  # refused, nothing lost
    assert "holds 1 record(s) of an earlier audit" in said()
    assert results.read_bytes() == first
    assert kgate_main([*base, "--fresh", "--resume"]) == 2
    with results.open("ab") as f:
        f.write(b"\xff\xfe garbage\n")
    assert kgate_main([*base, "--resume"]) == 0
    told = said()
    assert "1 line(s) of" in told and "could not be read" in told
    assert kgate_main([*base[:-5], "--gate", "oracle", "--out", str(out), "-q", "--resume"]) == 0
    assert "1 record(s) kept by --resume were judged with other gates" in said()
    assert kgate_main([*base, "--fresh"]) == 0  # judged again: one record, the garbage gone
    assert [json.loads(line)["id"] for line in results.read_text().splitlines()] == ["level1/19_ReLU"]
    (tmp_path / "afile").write_text("")
    for extra, message in [(["--report", str(tmp_path / "afile")], "a file is there; give a folder"),
                           (["--json", str(tmp_path)], "a folder is there"),
                           (["--junit", str(tmp_path / "afile" / "j.xml")], "is a file, not a folder")]:
        assert kgate_main([*base, "--fresh", *extra]) == 2
        assert message in said()
    assert results.read_bytes() != b""  # refused before start() could empty it
    for extra in (["--timeout", "0"], ["--compile-jobs", "-1"], ["--sample", "-1"], ["--max-time", "-1"]):
        assert kgate_main([*base, "--resume", *extra]) == 2
        assert "must be" in said()


@pytest.mark.parametrize("raiser, part", [("get_inputs", "get_inputs()"), ("forward", "Model")])
def test_a_problem_that_raises_in_the_standard_test_is_named_and_not_judged(tmp_path, raiser, part):
    problems, candidates = tmp_path / "p", tmp_path / "c"
    problems.mkdir()
    candidates.mkdir()
    source = (CORPUS / "problems" / "level1" / "19_ReLU.py").read_text()
    if raiser == "get_inputs":
        source = source.replace("def get_inputs():", "def get_inputs():\n    raise ValueError('boom')")
    else:
        source = source.replace("        return torch.relu(x)", "        raise ValueError('boom')")
    assert "boom" in source
    (problems / "19_ReLU.py").write_text(source)
    (candidates / "19_ReLU.py").write_text((CORPUS / "candidates" / "level1" / "19_ReLU.py").read_text())
    out = tmp_path / "o"
    assert kgate_main(["audit", "--problems", str(problems), "--candidates", str(candidates), "--device", "cpu",
                       "--gate", "contract", "--out", str(out), "-q"]) == 2
    (record,) = _records(out).values()
    assert record["problem_error"] == f"the problem's {part} raised in the standard test: ValueError: boom"


def test_a_candidate_that_pairs_with_no_problem_fails_the_audit_as_the_junit_file_says(tmp_path, capsys):
    problems, candidates = tmp_path / "p", tmp_path / "c"
    problems.mkdir()
    candidates.mkdir()
    problem = CORPUS / "problems" / "level1" / "19_ReLU.py"
    (problems / "19_ReLU.py").write_text(problem.read_text())
    (candidates / "19_ReLU.py").write_text((CORPUS / "candidates" / "level1" / "19_ReLU.py").read_text())
    (candidates / "99_Missing.py").write_text("raise SystemExit('never imported')\n")
    base = ["audit", "--problems", str(problems), "--candidates", str(candidates), "--device", "cpu",
            "--gate", "contract"]
    junit = tmp_path / "junit.xml"
    assert kgate_main([*base, "--out", str(tmp_path / "o"), "--junit", str(junit), "-q"]) == 1
    said = capsys.readouterr().out
    assert "99_Missing: no problem 99_Missing.py" in said  # up front
    assert "1 candidate(s) pair with no problem" in said  # and again, with the exit code
    records = _records(tmp_path / "o")
    assert records["19_ReLU"]["gates"][0]["verdict"] == "pass"  # the paired one is still judged, and passes
    assert 'errors="1"' in junit.read_text() and 'failures="0"' in junit.read_text()
    # with nothing paired, nothing is judged: exit 2
    (candidates / "19_ReLU.py").unlink()
    assert kgate_main([*base, "--out", str(tmp_path / "o2"), "-q"]) == 2


def test_a_candidate_that_is_not_judged_keeps_the_audit_from_passing(tmp_path, capsys):
    """Unverified is not a pass: with one candidate judged and passing and one not judged (its problem's
    get_inputs() raises), the audit exited 0."""
    problems, candidates = tmp_path / "p", tmp_path / "c"
    problems.mkdir()
    candidates.mkdir()
    source = (CORPUS / "problems" / "level1" / "19_ReLU.py").read_text()
    candidate = (CORPUS / "candidates" / "level1" / "19_ReLU.py").read_text()
    (problems / "19_ReLU.py").write_text(source)
    (problems / "20_Raiser.py").write_text(source.replace("def get_inputs():",
                                                          "def get_inputs():\n    raise ValueError('boom')"))
    (candidates / "19_ReLU.py").write_text(candidate)
    (candidates / "20_Raiser.py").write_text(candidate)
    out = tmp_path / "o"
    args = ["audit", "--problems", str(problems), "--candidates", str(candidates), "--device", "cpu",
            "--gate", "contract", "--out", str(out), "-q"]
    assert kgate_main(args) == 1
    said = capsys.readouterr().out.replace("\n", " ")
    assert "1 candidate(s) not judged" in said and "passes only when every candidate is judged" in said
    records = _records(out)
    assert len(records) == 2 and sum(bool(r["problem_error"]) for r in records.values()) == 1
    # the judged one alone passes
    (candidates / "20_Raiser.py").unlink()
    assert kgate_main([*args[:-3], "--out", str(tmp_path / "o2"), "-q"]) == 0


def _sized_problem(folder: Path, name: str, body: str, layers: int = 0) -> Path:
    path = folder / f"{name}.py"
    path.write_text("import torch\nimport torch.nn as nn\n" + body + f"""
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range({layers})])
        self.scale = nn.Parameter(torch.ones(8))  # one dimension: not a layer's weight

    def forward(self, x):
        return self.body(x)

def get_init_inputs():
    return []
""")
    return path


def test_problem_sizes_are_counted_in_a_worker_that_survives_hostile_problems(monkeypatch, tmp_path):
    """The elements each problem's get_inputs() makes and the weighted layers of its Model, counted on the
    meta device in kgate's own worker: a problem that raises, hangs or ends its process at import costs only
    its own count."""
    from kgate.audit import evaluate

    monkeypatch.setattr(evaluate, "SIZE_TIMEOUT_S", 3.0)
    folder = tmp_path / "problems"
    folder.mkdir()
    paths = {
        "small": _sized_problem(folder, "small", "def get_inputs():\n    return [torch.rand(4, 4)]\n", layers=3),
        "big": _sized_problem(folder, "big", "import os\nprint('ran in', os.getppid(), flush=True)\n"
                                             "def get_inputs():\n    return [torch.rand(1000, 1000), torch.rand(10)]\n"),
        "raises": _sized_problem(folder, "raises", "raise RuntimeError('broken problem')\n"),
        "hangs": _sized_problem(folder, "hangs", "import time\ntime.sleep(600)\n"),
        "exits": _sized_problem(folder, "exits", "import os\nos._exit(3)\n"),
        "after": _sized_problem(folder, "after", "def get_inputs():\n    return [torch.rand(7, 3)]\n", layers=40),
    }
    order = ["small", "raises", "hangs", "big", "exits", "after"]
    started = time.monotonic()
    sizes = evaluate.problem_sizes([paths[n] for n in order],
                                   evaluate.AuditOptions(gates=[], out_dir=tmp_path / "out"))
    got = {n: (s.elements, s.layers, s.parameters) if (s := sizes.get(paths[n])) else None for n in order}
    # parameters: each Linear(8, 8) holds 72 elements, the one-dimensional scale 8
    assert got == {"small": (16, 3, 3 * 72 + 8), "raises": (None, None, None), "hangs": None,
                   "big": (1_000_010, 0, 8), "exits": None, "after": (21, 40, 40 * 72 + 8)}
    log = (tmp_path / "out" / "logs" / "problem-sizes.log").read_text()
    assert "ran in" in log and f"ran in {os.getpid()}\n" not in log  # the problems' code ran in a worker, not here
    assert time.monotonic() - started < 60  # the hang cost its own limit, not the audit's


def test_longest_first_orders_by_the_estimated_cost_and_puts_the_uncounted_last(monkeypatch, tmp_path):
    """Input elements weigh for the standard test; weighted layers and parameter elements too once gates run
    (the accumulation gate emulates every layer's products; the gates convert, save and change every
    weight)."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions, ProblemSize

    wide, deep, small, odd, heavy = (tmp_path / f"{n}.py" for n in ("wide", "deep", "small", "odd", "heavy"))
    sizes = {wide: ProblemSize(2 * 10**9, 0), deep: ProblemSize(10**6, 400), small: ProblemSize(10, 1),
             odd: ProblemSize(None, None), heavy: ProblemSize(10, 0, 10**9)}
    monkeypatch.setattr(scheduler, "problem_sizes", lambda problems, options: sizes)
    pairs = [Pair("a", CORPUS / "a.py", small), Pair("b", CORPUS / "b.py", odd), Pair("c", CORPUS / "c.py", deep),
             Pair("d", CORPUS / "d.py", None, problem_error="no problem"), Pair("e", CORPUS / "e.py", wide),
             Pair("f", CORPUS / "f.py", small), Pair("g", CORPUS / "g.py", heavy)]
    gates = scheduler.longest_first(pairs, AuditOptions(gates=["accumulation"], out_dir=tmp_path))
    # 320 s of layers, 61 s of inputs, 30 s of a billion parameter elements (no layer, as few inputs as a)
    assert [p.id for p in gates] == ["c", "e", "g", "a", "f", "b", "d"]
    standard = scheduler.longest_first(pairs, AuditOptions(gates=[], out_dir=tmp_path))
    assert [p.id for p in standard] == ["e", "c", "a", "f", "g", "b", "d"]  # inputs alone


def test_judges_take_the_earliest_candidate_in_the_given_order_whatever_order_the_builds_end_in(monkeypatch, tmp_path):
    """longest_first's order must hold through the compile stage: builds that end in another order (the
    longest problem's candidate built last) do not decide who is judged next."""
    from kgate.audit import scheduler
    from kgate.audit.evaluate import AuditOptions

    build_s = {"a": 0.0, "b": 0.3, "c": 0.2, "d": 0.1}  # b, c and d end in reverse order while a is judged
    started = []

    def fake_compile(pair, options, *, cancel=None):
        time.sleep(build_s[pair.id])
        return {"ok": True, "seconds": build_s[pair.id], "build_failed": False, "message": ""}

    def fake_evaluate(pair, options, device, *, gpu_memory_fraction=None, compiled=None, cancel=None, turns=None,
                      earlier=None):
        started.append(pair.id)
        time.sleep(2.0 if pair.id == "a" else 0.0)  # the builds of b, c, d end long before
        return {"id": pair.id, "oom": False, "gates": [], "device": device}

    monkeypatch.setattr(scheduler, "compile_pair", fake_compile)
    monkeypatch.setattr(scheduler, "needs_compile", lambda pair: True)
    monkeypatch.setattr(scheduler, "evaluate_pair", fake_evaluate)
    pairs = [Pair(i, CORPUS / f"{i}.py", CORPUS / "x.py") for i in "abcd"]
    plan = scheduler.Plan(devices=["cpu"], slots=1, compile_jobs=4)
    assert scheduler.run_local(pairs, AuditOptions(gates=[], out_dir=tmp_path), plan, lambda record: None) == 4
    assert started == ["a", "b", "c", "d"]


INTEGER = DATA / "kernelbench" / "integer"
INPUT_GATES = "contract,oracle,special_values,shapes,layouts,distributions,accumulation,input_integrity"


def test_integer_inputs_reach_the_problem_unchanged_and_every_probe_keeps_them_legal(tmp_path):
    """A cross-entropy problem's get_inputs() gives int64 class indices: the standard test cast them to
    float32, the problem's own Model raised, and both of its candidates ended not judged. Every gate that
    makes inputs must leave them valid indices too: the reference would raise on any other value, and the
    gate would skip the probe or not judge at all; only the distributions gate's integer families leave the
    range on purpose (ids past narrower types' ranges, negated), and the probes the reference rejects are
    skipped and listed. Its -100 targets are cross_entropy's ignore_index, which the correct candidate honours."""
    out = tmp_path / "run"
    assert kgate_main(["audit", "--problems", str(INTEGER / "problems"), "--candidates", str(INTEGER / "candidates"),
                       "--device", "cpu", "--gate", INPUT_GATES, "--out", str(out), "-q"]) == 1
    records = _records(out)
    correct, wrong = records["level1/95_CrossEntropyLoss"], records["level1/95_CrossEntropyLoss__first_class"]
    for r in (correct, wrong):
        assert r["problem_error"] is None, r["problem_error"]
    assert correct["standard"]["verdict"] == "pass", correct["standard"]
    for g in correct["gates"]:
        assert g["verdict"] == "pass", (g["gate"], g["message"])
        if g["gate"].startswith("distributions"):  # its integer families leave the class range on purpose
            assert "integer- or boolean-input probe(s)" in g["message"], g["message"]
            continue
        assert "rejects" not in g["message"], (g["gate"], g["message"])  # no probe the reference refused
    assert wrong["standard"]["verdict"] == "fail"
    assert _gate(wrong, "oracle")["verdict"] == "fail"


DRAWS = DATA / "kernelbench" / "draws"


def test_a_reference_that_draws_its_initial_state_inside_forward_is_judged(tmp_path):
    """KernelBench's LSTM and GRU problems draw h0/c0 with torch.randn in forward, in torch's default dtype:
    the float64 oracle raised 'mat1 and mat2 must have the same dtype', so they could never be judged. Now
    the oracle runs with float64 as the default dtype and both models draw from the same seed: the oracle
    computes from the reference's own draws (its error against the reference stays at rounding level), a
    candidate that draws them the same way passes and one that starts from zeros fails."""
    out = tmp_path / "run"
    assert kgate_main(["audit", "--problems", str(DRAWS / "problems"), "--candidates", str(DRAWS / "candidates"),
                       "--device", "cpu", "--gate", "contract,oracle,determinism", "--out", str(out), "-q"]) == 1
    records = _records(out)
    correct, zeros = records["level3/35_LSTM"], records["level3/35_LSTM__zero_state"]
    assert correct["problem_error"] is None and zeros["problem_error"] is None
    for g in correct["gates"]:
        assert g["verdict"] == "pass", (g["gate"], g["message"])
    missed = _gate(zeros, "oracle")
    assert missed["verdict"] == "fail", missed["message"]
    ref_err = float(re.search(r"x reference error (\S+)", missed["message"]).group(1))
    assert ref_err < 1e-5, missed["message"]  # the oracle drew what the reference drew, upcast
    assert _gate(zeros, "determinism")["verdict"] == "pass"


def _findings_records():
    """One record per kind of record-level finding, as kgate.audit.evaluate writes them, with the text the
    console shows for it."""
    return [({"candidate": f"c/{r['id']}.py", "problem": "p/x.py", "device": "cpu",
              "repro": f"kgate audit -k {r['id']}", **r}, text) for r, text in _findings_kinds()]


def _findings_kinds():
    ok = [_fake_gate(g, "pass") for g in ("contract", "oracle")]
    build = "Error building extension 'relu_ext': nvcc exited 1"
    env = "this machine cannot run the candidate (CUDA_HOME environment variable is not set); audit it on a CUDA host"
    return [
        (_fake_record("tampers", ok, tamper="the candidate replaced torch functions the reference uses too: "
                      "torch.relu"), "the candidate replaced torch functions the reference uses too: torch.relu"),
        (_fake_record("problem-broken", [_fake_gate(g, "error", True, message="not judged: the problem's Model could "
                                                    "not be built: ValueError: boom") for g in ("contract", "oracle")],
                      problem_error="the problem's Model could not be built: ValueError: boom"),
         "the problem's Model could not be built: ValueError: boom"),
        (_fake_record("unpaired", [_fake_gate("contract", "error", True, message="not judged: no problem 9_X.py")],
                      problem_error="no problem 9_X.py"), "no problem 9_X.py"),
        (_fake_record("no-cuda", [_fake_gate(g, "error", True, message="could not load the candidate: OSError: "
                                             "CUDA_HOME environment variable is not set") for g in ("contract",)],
                      environment_error=env, standard={"verdict": "error", "compiled": False}), env),
        (_fake_record("build-fails", [_fake_gate(g, "error", True, message=f"not run: compile failed: {build} earlier")
                                      for g in ("contract", "oracle")], error=f"compile failed: {build}",
                      compile={"build_failed": True, "message": build}, standard={"verdict": "error", "compiled": False}),
         "compile failed"),
        (_fake_record("out-of-memory", ok[:1] + [_fake_gate("oracle", "error", message="CUDA out of memory. Tried to "
                                                            "allocate 4.00 GiB")]),
         "stopped at kgate's memory limits"),
        (_fake_record("reference-raises", ok[:1] + [_fake_gate("oracle", "error", details={"role": "reference"},
                                                               message="the reference raised ValueError")]),
         "the problem's own code"),
    ]


def _console_line(record):
    import io

    from rich.console import Console

    from kgate.commands.audit import _ConsoleProgress

    buffer = io.StringIO()
    progress = _ConsoleProgress(Console(file=buffer, width=400, highlight=False), 1, quiet=False)
    progress.finished({**record, "duration_s": 1.0})
    return buffer.getvalue()


def test_what_the_console_says_of_a_record_names_each_finding():
    for record, text in _findings_records():
        line = _console_line(record)
        assert text in line or record["gates"][0]["gate"] in line, (record["id"], line)
        assert not line.lstrip().startswith("pass"), line
    assert "violated: tamper" in _console_line(_findings_records()[0][0])


def test_the_junit_xml_holds_every_finding_the_console_shows():
    """A candidate that replaced a torch function the reference uses was a violation on the console while its
    JUnit XML showed every testcase passing."""
    import xml.etree.ElementTree as ET

    from kgate.audit.report import to_report
    from kgate.reports import junit

    records = _findings_records()
    root = ET.fromstring(junit.to_xml(to_report([r for r, _ in records], "corpus")))
    for record, text in records:
        (suite,) = [s for s in root.iter("testsuite") if s.get("name") == record["id"]]
        bad = [e for case in suite.iter("testcase") for e in case if e.tag in ("failure", "error")]
        assert bad, f"{record['id']}: every testcase passes in the JUnit XML; the console says {text!r}"
        said = " ".join(f"{e.get('message')} {e.text}" for e in bad)
        assert text in said, (record["id"], text, said)
    (tamper,) = [c for c in root.iter("testcase") if c.get("name") == "tamper"]
    assert "reproduce: kgate audit -k tampers" in tamper.find("failure").text


def test_the_json_report_holds_every_finding_the_console_shows(tmp_path):
    from kgate.audit.report import summarize, write_json
    from kgate.report import Report

    records = [r for r, _ in _findings_records()]
    path = tmp_path / "audit.json"
    write_json(path, records, summarize(records, ["contract", "oracle"]), "corpus")
    report = Report.read(path)
    assert report.exit_code == 1
    for record, text in _findings_records():
        (kernel,) = [k for k in report.kernels if k.name == record["id"]]
        assert kernel.verdict != "pass", (record["id"], [g.message for g in kernel.gates])
        assert any(text in g.message for g in kernel.violated), (record["id"], text, [g.message for g in kernel.gates])


def test_the_pr_comment_holds_every_finding_the_console_shows(tmp_path):
    from kgate.audit.report import to_report
    from kgate.reports.github import comment_markdown

    records = _findings_records()
    body = comment_markdown(to_report([r for r, _ in records], "corpus"), key="k", fail_on="violation",
                            workspace=tmp_path, run_exit_code=1)
    assert "❌" in body
    for record, text in records:
        assert record["id"] in body and text in body, (record["id"], text)


def test_dtypes_judge_each_precision_with_its_own_verdicts_and_standard_test(tmp_path):
    """--dtypes float32,float16: each candidate is judged at both, with results per precision in the record,
    the JUnit XML and the report, and KernelBench's standard test at each precision's tolerance. A kernel
    that returns float32 for float16 input is right at float32 and violates the contract at float16."""
    out, junit_path, report = tmp_path / "run", tmp_path / "junit.xml", tmp_path / "report"
    assert kgate_main(["audit", "--problems", str(CORPUS / "problems"),
                       "--candidates", str(CORPUS / "dtypes" / "candidates"), "--device", "cpu",
                       "--gate", "contract,oracle", "--dtypes", "float32,float16", "--out", str(out),
                       "--junit", str(junit_path), "--report", str(report), "-q"]) == 1
    records = _records(out)
    correct, upcast = records["level1/19_ReLU"], records["level1/19_ReLU__float32_out"]
    ids = ["contract[float32]", "oracle[float32]", "contract[float16]", "oracle[float16]"]
    assert [g["gate"] for g in correct["gates"]] == ids
    assert all(g["verdict"] == "pass" for g in correct["gates"]), correct["gates"]
    assert {d: s["verdict"] for d, s in correct["standards"].items()} == {"float32": "pass", "float16": "pass"}
    assert correct["standards"]["float16"]["tolerance"] == 1e-2 and correct["standard"]["verdict"] == "pass"
    assert _gate(upcast, "contract[float32]")["verdict"] == "pass"
    bad = _gate(upcast, "contract[float16]")
    assert bad["verdict"] == "fail", bad["message"]
    assert "--dtypes float16 --gate contract" in bad["repro"] and "float32,float16" not in bad["repro"]
    assert upcast["standards"]["float32"]["verdict"] == "pass"
    assert upcast["standards"]["float16"]["verdict"] != "pass"
    xml = junit_path.read_text()
    assert 'name="contract[float16]"' in xml and 'name="oracle[float32]"' in xml
    summary = json.loads((report / "summary.json").read_text())
    assert summary["per_dtype"]["float16"] == {"candidates": 2, "standard_accepts": 1, "violation": 1}
    assert summary["per_dtype"]["float32"] == {"candidates": 2, "standard_accepts": 2, "violation": 0}
    assert "## By precision" in (report / "report.md").read_text()
    assert kgate_main(["audit", "--problems", str(CORPUS / "problems"), "--candidates", str(CORPUS / "candidates"),
                       "--dtypes", "float8", "--out", str(tmp_path / "x")]) == 2


def test_dtypes_a_precision_the_problem_cannot_run_at_is_skipped_and_the_others_judged(tmp_path):
    """A problem whose Model refuses bfloat16 (it raises there, as a reference built on an op without a bfloat16
    kernel does): the candidate is judged at float32, its bfloat16 gates are skipped naming why, and the record
    has no problem_error; a problem that refuses every precision asked for still gets one."""
    problems, candidates = tmp_path / "problems", tmp_path / "candidates"
    problems.mkdir()
    candidates.mkdir()
    (problems / "scale.py").write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                if x.dtype == torch.bfloat16:
                    raise TypeError("no bfloat16 kernel for this op")
                return x * 2

        def get_inputs():
            return [torch.randn(4, 8)]

        def get_init_inputs():
            return []
    """))
    (candidates / "scale.py").write_text("from torch import nn\n\n\nclass ModelNew(nn.Module):\n"
                                         "    def forward(self, x):\n        return x + x\n")
    out = tmp_path / "run"
    assert kgate_main(["audit", "--problems", str(problems), "--candidates", str(candidates), "--device", "cpu",
                       "--gate", "oracle", "--dtypes", "float32,bfloat16", "--out", str(out), "-q"]) == 0
    record = _records(out)["scale"]
    assert record["problem_error"] is None, record["problem_error"]
    assert _gate(record, "oracle[float32]")["verdict"] == "pass"
    skipped = _gate(record, "oracle[bfloat16]")
    assert skipped["verdict"] == "skip" and "no bfloat16 kernel for this op" in skipped["message"], skipped
    assert kgate_main(["audit", "--problems", str(problems), "--candidates", str(candidates), "--device", "cpu",
                       "--gate", "oracle", "--dtypes", "bfloat16", "--out", str(tmp_path / "only"), "-q"]) != 0
    assert "no bfloat16 kernel" in _records(tmp_path / "only")["scale"]["problem_error"]


def test_the_console_keeps_a_precisions_gate_ids_whole():
    """The per-gate table is rich markup: an id such as oracle[float16] read as a style tag came out as a second
    'oracle' row."""
    from rich.console import Console

    from kgate.audit.report import render

    records = [_fake_record("a", [_fake_gate("oracle", "pass"), _fake_gate("oracle[float16]", "fail")])]
    console = Console(width=200, record=True)
    render(console, summarize(records, ["oracle", "oracle[float16]"]))
    rows = [line for line in console.export_text().splitlines() if "oracle" in line]
    assert any("oracle[float16]" in line and " 1 " in line for line in rows), rows


def test_an_audit_worker_forked_from_its_template_loads_a_problem_without_importing_anything_heavy():
    """A worker forked from a template (kgate.forkserver) has what the template imported; what a worker
    imports itself is paid by every candidate. Loading a problem and counting its dimensions on the meta
    device (kgate.kernelbench.free_dims) imported sympy in each worker: 0.5-0.9 s of a 1.5 s candidate."""
    problem = CORPUS / "problems" / "level1" / "19_ReLU.py"
    code = textwrap.dedent(f"""\
        import importlib, json, sys
        from pathlib import Path
        from kgate.forkserver import WARM
        for name in (*WARM, "kgate.audit.worker"):
            importlib.import_module(name)
        for name in sys.modules["kgate.audit.worker"].TEMPLATE_WARM:
            importlib.import_module(name)
        before = set(sys.modules)
        from kgate import kernelbench as kb
        module = kb.exec_problem(Path({str(problem)!r}), "inputs")
        kb.free_dims(module)
        kb.exec_candidate(Path({str(CORPUS / "candidates" / "level1" / "19_ReLU.py")!r}), Path({str(problem)!r}))
        new = sorted(m for m in set(sys.modules) - before if not m.startswith(("kgate_kb_", "_kgate_kb_")))
        print(json.dumps(new))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    new = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [m for m in new if m.split(".")[0] in ("sympy", "mpmath") or m.startswith("torch.fx")], new
    assert len(new) <= 5, new


def test_kgates_source_digest_is_the_same_for_a_checkout_and_a_wheel_that_carries_the_catalogue(tmp_path):
    """A wheel carries the control catalogue as kgate/catalogue; the digest a record names covers kgate's own
    code only, so one commit gives one digest installed or checked out; a change to a gate's file changes it."""
    import shutil

    from kgate.audit.evaluate import kgate_stamp, package_digest

    checkout = ROOT / "kgate"
    assert package_digest(checkout) == kgate_stamp()["source"]
    wheel = tmp_path / "kgate"
    shutil.copytree(checkout, wheel, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "gates" / "oracle", wheel / "catalogue" / "oracle",
                    ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    assert any((wheel / "catalogue").rglob("*.py"))
    assert package_digest(wheel) == package_digest(checkout)
    gate = wheel / "gates" / "oracle.py"
    gate.write_text(gate.read_text() + "\n# changed\n")
    assert package_digest(wheel) != package_digest(checkout)


def test_the_default_worker_memory_limit_fits_the_machine(monkeypatch):
    """32 GiB, or 90 % of the machine's memory where that is less: a worker past the machine's memory is taken
    by the system's OOM killer (a bare SIGKILL) before kgate's own limit, with its cause, can stop it."""
    from kgate import procmem
    from kgate.commands import audit as audit_command

    monkeypatch.setattr(procmem, "machine_memory", lambda: 24 * 2**30)
    assert audit_command.default_worker_memory() == int(0.9 * 24 * 2**30)
    monkeypatch.setattr(procmem, "machine_memory", lambda: 128 * 2**30)
    assert audit_command.default_worker_memory() == 32 * 2**30
    monkeypatch.setattr(procmem, "machine_memory", lambda: 0)  # unknown: the fixed default
    assert audit_command.default_worker_memory() == 32 * 2**30


HALF_NORM_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):  # float16 rows, their norms accumulated and returned in float32
        return torch.linalg.vector_norm(x.float(), dim=-1)


def get_inputs():
    return [torch.randn(16, 2048).half()]


def get_init_inputs():
    return []
"""

HALF_NORM_HALF_TOTAL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):  # the running total of the squares kept in the input's dtype
        total = torch.zeros(x.shape[0], dtype=x.dtype)
        for j in range(0, x.shape[1], 256):
            total = total + (x[:, j:j + 256].float() ** 2).sum(-1).to(x.dtype)
        return total.float().sqrt()
"""


def test_a_problem_whose_inputs_are_float16_is_judged_at_float16_unless_dtypes_says_otherwise(tmp_path):
    """Without --dtypes each problem is judged at its own inputs' precision: a float16 running total is seen
    there (oracle); with --dtypes float32 (KernelBench's cast) the same candidate sees float32 inputs, its
    total is float32, and it passes. The float32 problems of a corpus are judged as before (no note)."""
    problems, candidates = tmp_path / "problems", tmp_path / "candidates"
    problems.mkdir()
    candidates.mkdir()
    (problems / "half_norm.py").write_text(HALF_NORM_PROBLEM)
    (candidates / "half_norm__half_total.py").write_text(HALF_NORM_HALF_TOTAL)
    base = ["audit", "--format", "kernelbench", "--problems", str(problems), "--candidates", str(candidates),
            "--device", "cpu", "--gate", "oracle", "-q"]
    assert kgate_main([*base, "--out", str(tmp_path / "own")]) == 1
    record = _records(tmp_path / "own")["half_norm__half_total"]
    oracle = _gate(record, "oracle")
    assert oracle["verdict"] == "fail" and oracle["case"]["dtype"] == "float16", oracle
    assert "judged at float16" in record["notes"]["precision"]
    assert record["standard"]["verdict"] == "pass"  # the field's test accepts it at float16 too
    assert "--dtypes" not in oracle["repro"]
    assert kgate_main([*base, "--dtypes", "float32", "--out", str(tmp_path / "cast")]) == 0
    record = _records(tmp_path / "cast")["half_norm__half_total"]
    passed = _gate(record, "oracle")
    assert passed["verdict"] == "pass" and "dtype=float32" in passed["message"], passed["message"]
    assert "precision" not in record["notes"]


def test_the_problems_own_precision_is_read_from_what_get_inputs_gives():
    import types

    import torch

    from kgate.audit.worker import own_precision

    def problem(make):
        return types.SimpleNamespace(get_inputs=make)

    assert own_precision(problem(lambda: [torch.randn(4, 4).half(), torch.randint(0, 3, (4,))])) == "float16"
    assert own_precision(problem(lambda: [torch.randn(4, 4, dtype=torch.bfloat16)])) == "bfloat16"
    assert own_precision(problem(lambda: [torch.randn(4, 4)])) is None
    assert own_precision(problem(lambda: [torch.randn(4).half(), torch.randn(4)])) is None  # a mix
    assert own_precision(problem(lambda: [torch.randint(0, 3, (4,))])) is None
    assert own_precision(problem(lambda: 1 / 0)) is None
    # drawn on the meta device: nothing of this size is allocated
    assert own_precision(problem(lambda: [torch.randn(1 << 20, 1 << 20).half()])) == "float16"


EMA_PROBLEM = '''import torch
import torch.nn as nn
class Model(nn.Module):
    """An exponential moving average of the inputs' column means, kept in a buffer and written from the inputs,
    taken off them with a learned scale."""
    def __init__(self, cols):
        super().__init__()
        self.register_buffer("ema", torch.zeros(cols))
        self.scale = nn.Parameter(torch.ones(cols))
    def forward(self, x):
        self.ema.mul_(0.9).add_(0.1 * x.mean(dim=0))
        return (x - self.ema) * self.scale
rows, cols = 16, 24
def get_inputs():
    return [torch.randn(rows, cols)]
def get_init_inputs():
    return [cols]
'''


def test_a_buffer_written_from_inputs_that_require_grad_stays_copyable(tmp_path):
    """The special_values gate calls the reference under autograd (which lines it never reads); its forward writes
    its buffer from those inputs, which joins the buffer to their graph. The isolation gate's change of the
    parameters has the float64 oracle copy the module again (deepcopy refuses a tensor in a graph): without the buffer made a leaf again, isolation ends in
    `error` and the candidate is not judged."""
    (tmp_path / "problems").mkdir()
    (tmp_path / "candidates").mkdir()
    (tmp_path / "problems" / "ema.py").write_text(EMA_PROBLEM)
    (tmp_path / "candidates" / "ema__own.py").write_text("ModelNew = Model  # noqa: F821\n")
    code = kgate_main(["audit", "--format", "kernelbench", "--problems", str(tmp_path / "problems"), "--candidates",
                       str(tmp_path / "candidates"), "--device", "cpu", "--jobs", "1", "--timeout", "60",
                       "--gate", "special_values", "--gate", "isolation", "--out", str(tmp_path / "out"), "-q"])
    record = next(iter(ResultsFile(tmp_path / "out" / "results.jsonl").read().values()))
    verdicts = {g["gate"]: (g["verdict"], g["message"][:200]) for g in record["gates"]}
    assert code == 0 and {g: v for g, (v, _) in verdicts.items()} == {"special_values": "pass", "isolation": "pass"}, \
        verdicts
