"""`kgate run -j N` on one GPU: each worker judges in its share of the GPU's memory, and what ran out of memory
in a share is judged again alone, with the whole GPU, so that one kernel's memory never becomes another's
verdict. Without a GPU here, the decision "this device is shared" (kgate.runner.gpu_share) is patched in this
process for the CPU, and the test kernels read their share from their worker's job."""

from __future__ import annotations

import json

import pytest

from kgate import runner
from kgate.gates.base import GateResult
from kgate.manifest import load
from kgate.runner import HELD, MEMORY_LIMIT, OUTGREW, Events, Runner, RunOptions, gpu_share, outgrew_share

KERNELS = """\
import json
import os
import sys

import torch


def _share():
    # the worker's job file (its argv) holds the share of the GPU's memory kgate gave it
    return json.load(open(sys.argv[1])).get("gpu_memory_fraction")


def make_inputs(seed, shape=None):
    return (torch.randn(shape or (4, 8), generator=torch.Generator().manual_seed(seed)),)


def reference(x):
    return x * 2


def good(x):
    return x + x


def big(x):
    if _share():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                     "of 79.18 GiB of which 100 MiB is free.")
    return x + x


def huge(x):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 900.00 GiB. GPU 0 has a total capacity "
                                 "of 79.18 GiB of which 78.00 GiB is free.")


def dies(x):
    if _share():
        print("terminate called after throwing an instance of 'c10::OutOfMemoryError'", file=sys.stderr)
        print("  what():  CUDA out of memory. Tried to allocate 1.00 GiB.", file=sys.stderr, flush=True)
        os._exit(6)
    return x + x


def wrong(x):
    if _share():
        raise ValueError("bad tile")
    return x * 3
"""

MANIFEST = """\
version: 1
defaults:
  device: cpu
  seeds: [0]
  gates: [oracle, determinism]
  limits: {timeout: 60, memory: 2GiB}
kernels:
""" + "".join(f"  - {{name: {n}, kernel: k.py:{n}, reference: k.py:reference, inputs: k.py:make_inputs}}\n"
              for n in ("good", "big", "huge", "dies", "wrong"))


def _shared_on_the_cpu(device: str, workers: int) -> float | None:
    """gpu_share as on a GPU, for the CPU workers of these tests."""
    return 0.475 if workers > 1 else None


class Recorded(Events):
    def __init__(self):
        self.seen: list[tuple[str, str, str]] = []

    def gate_started(self, kernel, gate):
        self.seen.append(("start", kernel.name, gate))

    def kernel_held(self, kernel, why):
        self.seen.append(("held", kernel.name, why))

    def kernel_finished(self, result):
        self.seen.append(("finished", result.name, result.verdict))


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shares")
    (folder / "k.py").write_text(KERNELS)
    (folder / "kgate.yaml").write_text(MANIFEST)
    manifest = load(folder / "kgate.yaml")
    events = Recorded()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "gpu_share", _shared_on_the_cpu)
        results = Runner(manifest, manifest.kernels, RunOptions(out_dir=folder / "out", jobs=2), events).run()
    lines = [json.loads(line) for line in (folder / "out" / "results.jsonl").read_text().splitlines()]
    return {r.name: r for r in results}, events.seen, lines


def test_out_of_gpu_memory_in_a_share_is_judged_again_alone(shared_run):
    by_name, seen, _ = shared_run
    big = by_name["big"]
    assert [g.verdict for g in big.gates] == ["pass", "pass"], [g.message for g in big.gates]
    assert big.notes["judged_alone"].startswith(f"the first try {OUTGREW} (0.475) in: oracle, determinism")
    first = big.gates[0].details["outgrew_share"]
    assert first["share"] == 0.475 and first["verdict"] == "error" and "CUDA out of memory" in first["message"]
    assert big.error is None
    # alone: after every kernel that judged in a share finished, and only then
    last_shared = max(i for i, (kind, name, _) in enumerate(seen) if kind == "finished" and name in ("good", "wrong"))
    again = [i for i, (kind, name, _) in enumerate(seen) if kind == "start" and name == "big"][2:]
    assert again and min(again) > last_shared, seen
    assert ("held", "big", f"{OUTGREW} (0.475) in: oracle, determinism") in seen
    assert "judged again alone, with the whole GPU: oracle, determinism" in open(big.log).read()


def test_a_worker_that_died_of_it_in_a_share_is_judged_again_alone(shared_run):
    dies = shared_run[0]["dies"]
    assert [g.verdict for g in dies.gates] == ["pass", "pass"], [g.message for g in dies.gates]
    assert "worker exited with code 6" in dies.gates[0].details["outgrew_share"]["message"]
    assert dies.error is None  # the first try's early end was the share's: the notes say so instead
    assert "oracle" in dies.notes["judged_alone"]


def test_out_of_memory_alone_is_a_result(shared_run):
    huge = shared_run[0]["huge"]
    assert [g.verdict for g in huge.gates] == ["error", "error"]
    assert huge.gates[0].message.startswith("kernel raised OutOfMemoryError: CUDA out of memory")
    assert "outgrew_share" in huge.gates[0].details


def test_a_real_failure_in_a_share_is_not_judged_again(shared_run):
    by_name, seen, _ = shared_run
    wrong = by_name["wrong"]
    assert [g.verdict for g in wrong.gates] == ["error", "error"]
    assert all("ValueError: bad tile" in g.message for g in wrong.gates)
    assert not wrong.notes and all("outgrew_share" not in g.details for g in wrong.gates)
    assert by_name["good"].verdict == "pass" and not by_name["good"].notes
    assert not [s for s in seen if s[0] == "held" and s[1] in ("good", "wrong")]


def test_only_the_second_try_is_recorded(shared_run):
    by_name, _, lines = shared_run
    markers = [line for line in lines if line["message"].startswith(HELD)]
    results = [line for line in lines if not line["message"].startswith(HELD)]
    assert sorted((line["kernel"], line["gate"]) for line in results) == sorted(
        (r.name, g.gate) for r in by_name.values() for g in r.gates)  # each result once: the first try held
    kept = {(line["kernel"], line["gate"]): line["verdict"] for line in results}
    assert kept[("big", "oracle")] == "pass" and kept[("dies", "determinism")] == "pass"
    # the first try left a marker, not a verdict: read back, it judges nothing
    assert {("big", "oracle"), ("big", "determinism")} <= {(m["kernel"], m["gate"]) for m in markers}
    assert all(m["verdict"] == "error" and m["details"]["outgrew_share"]["share"] == 0.475 for m in markers)
    assert all(lines.index(m) < lines.index(next(r for r in results if (r["kernel"], r["gate"]) ==
                                                 (m["kernel"], m["gate"]))) for m in markers)


def test_a_run_stopped_before_the_alone_phase_has_resume_judge_the_held_gates_alone_first(tmp_path, monkeypatch):
    """A run cut into time-limited slices (bench/field_kgate.sh --time T --resume): a slice stopped before its
    alone phase must not leave the held gates to be judged in a share, held and stopped again in every later
    slice. Seen on an H100: Liger's cross-entropy gates were held in two slices and never judged."""
    (tmp_path / "k.py").write_text(KERNELS)
    (tmp_path / "kgate.yaml").write_text(MANIFEST)
    manifest = load(tmp_path / "kgate.yaml")
    kernels = [manifest.by_name("good"), manifest.by_name("big")]
    monkeypatch.setattr(runner, "gpu_share", _shared_on_the_cpu)
    with monkeypatch.context() as stopped:  # the slice's time ends when the shared work is done
        stopped.setattr(Runner, "_again_alone", lambda self, judging: None)
        Runner(manifest, kernels, RunOptions(out_dir=tmp_path / "out", jobs=2)).run()
    held: dict = {}
    judged, _ = runner.read_judged((tmp_path / "out" / "results.jsonl").read_text(), held=held)
    assert set(held) == {"big"} and set(held["big"]) == {"oracle", "determinism"}
    assert "big" not in judged and set(judged["good"]) == {"oracle", "determinism"}

    events = Recorded()
    results = Runner(manifest, kernels, RunOptions(out_dir=tmp_path / "out", jobs=2, resume=True), events).run()
    big = next(r for r in results if r.name == "big")
    assert [g.verdict for g in big.gates] == ["pass", "pass"], [g.message for g in big.gates]
    assert big.gates[0].details["outgrew_share"]["share"] == 0.475
    assert "CUDA out of memory" in big.gates[0].details["outgrew_share"]["message"]
    assert "judged alone first, with the whole device: oracle, determinism" in open(big.log).read()
    assert not [s for s in events.seen if s[0] == "held"]  # judged alone first: nothing held again
    judged, _ = runner.read_judged((tmp_path / "out" / "results.jsonl").read_text(), held=(held := {}))
    assert not held and set(judged["big"]) == {"oracle", "determinism"}


def test_the_report_says_which_kernels_were_judged_again_alone(shared_run):
    from io import StringIO

    from rich.console import Console

    from kgate.report import Report
    from kgate.reports.console import render

    by_name, _, _ = shared_run
    report = Report(manifest="kgate.yaml", kernels=list(by_name.values()))
    assert report.to_json()["summary"]["judged_alone"] == 3  # big, dies, huge
    out = StringIO()
    render(Console(file=out, width=200), report, 1.0)
    text = out.getvalue()
    assert "3 kernel(s) outgrew their share of the GPU's memory" in text
    assert f"big: the first try {OUTGREW} (0.475) in: oracle, determinism" in text


def test_a_kernels_gates_spread_over_workers_in_shares_are_judged_again_in_one_worker_alone(tmp_path, monkeypatch):
    """-j 2 with one kernel: its two gates in two workers, each in a share; both outgrow it, and one worker
    judges both again alone."""
    (tmp_path / "k.py").write_text(KERNELS)
    (tmp_path / "kgate.yaml").write_text(MANIFEST)
    manifest = load(tmp_path / "kgate.yaml")
    monkeypatch.setattr(runner, "gpu_share", _shared_on_the_cpu)
    [big] = Runner(manifest, [manifest.by_name("big")], RunOptions(out_dir=tmp_path / "out", jobs=2)).run()
    assert [g.verdict for g in big.gates] == ["pass", "pass"], [g.message for g in big.gates]
    assert big.notes["judged_alone"].startswith(f"the first try {OUTGREW} (0.475) in: oracle, determinism")
    log = open(big.log).read()
    assert "worker 1 of 2: oracle" in log and "worker 2 of 2: determinism" in log
    assert log.count("judged again alone, with the whole GPU: oracle, determinism") == 1


def test_each_worker_on_a_gpu_gets_its_share_of_its_memory(tmp_path, monkeypatch):
    """The workers that judge at once on one device: at most -j, and per kernel at most its gates to judge
    (and -j // kernels with fewer kernels than -j); one alone, or a device that is not a GPU, takes all."""
    (tmp_path / "k.py").write_text(KERNELS)
    (tmp_path / "kgate.yaml").write_text(MANIFEST)
    manifest = load(tmp_path / "kgate.yaml")
    monkeypatch.setattr(runner, "resolve_device", lambda device: device)
    two = manifest.kernels[:2]  # two gates each

    def shares(kernels, jobs, device="cuda"):
        run = Runner(manifest, kernels, RunOptions(jobs=jobs, device=device, out_dir=tmp_path))
        return run.shares(max(1, jobs // len(kernels)))

    assert shares(manifest.kernels, 16) == {"cuda:0": 0.095}  # 5 kernels x 2 gates: 10 workers at once
    assert shares(manifest.kernels, 4) == {"cuda:0": 0.2375}
    assert shares(two, 3) == {"cuda:0": 0.475}  # one worker a kernel (3 // 2)
    assert shares(manifest.kernels[:1], 8) == {"cuda:0": 0.475}  # its two gates, one worker each
    assert shares(two, 8, "cuda:1") == {"cuda:1": 0.2375}
    assert shares(two, 8, "cpu") == {"cpu": None}
    assert gpu_share("cuda:0", 1) is None and gpu_share("cuda", 2) == 0.475


@pytest.mark.parametrize(("message", "outgrew"), [
    ("kernel raised OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
     "capacity of 79.18 GiB of which 100 MiB is free", True),
    ("reference raised OutOfMemoryError: CUDA out of memory", True),
    ("kgate internal error in gate shapes: OutOfMemoryError: CUDA out of memory", True),
    ("compute-sanitizer memcheck reported 2 error(s): cudaErrorMemoryAllocation", True),
    ("kernel raised RuntimeError: Triton Error [CUDA]: out of memory", True),
    (f"{MEMORY_LIMIT} 24.0 GiB (resident 24.1 GiB): kgate's memory limit was reached", True),
    ("not run: worker killed by SIGABRT (abort) earlier", False),
    ("max abs error 1.0 at (0, 3), allowed 1e-05", False),
    ("kernel raised RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered", False),
])
def test_what_outgrew_a_share(message, outgrew):
    assert outgrew_share(GateResult("oracle", "error", message, False)) is outgrew
    assert outgrew_share(GateResult("oracle", "fail", message, False)) is outgrew
    assert not outgrew_share(GateResult("oracle", "pass", message, False))  # a pass stands


def test_a_dead_workers_log_tail_says_whether_it_ran_out_of_gpu_memory():
    died = "worker killed by SIGABRT (abort)"
    assert outgrew_share(GateResult("oracle", "error", died, False, details={
        "log_tail": "terminate called after throwing an instance of 'c10::OutOfMemoryError'"}))
    assert not outgrew_share(GateResult("oracle", "error", died, False, details={"log_tail": "Fatal Python error"}))
