"""The isolated runner: hostile kernels cost only their own verdict; results stream to disk."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kgate import procmem
from kgate.manifest import load
from kgate.runner import Runner, RunOptions, kgate_command
from tests.conftest import DATA, ROOT
from tests.process_support import worker_pids


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile")
    manifest = load(DATA / "hostile" / "kgate.yaml")
    results = Runner(manifest, manifest.kernels, RunOptions(out_dir=out)).run()
    return {r.name: r for r in results}, out


def messages(result):
    return [g.message for g in result.gates]


def test_good_kernels_pass_before_and_after_the_hostile_ones(hostile):
    by_name, _ = hostile
    assert by_name["good"].verdict == "pass"
    assert by_name["good-again"].verdict == "pass"


@pytest.mark.parametrize(("name", "cause"), [
    ("raises", "kernel raised ValueError: tile size must divide 8"),
    ("segfault", "worker killed by SIGSEGV (segmentation fault)"),
    ("hard-exit", "worker exited with code 3 before finishing"),
    ("soft-exit", "kernel raised SystemExit: 4"),
    ("hangs", "timed out after 3 s in gate oracle"),
    ("hogs-memory", "memory"),
    ("import-crash", "could not load: ImportError: cannot build extension: nvcc not found"),
])
def test_hostile_kernel_gets_error_with_cause(hostile, name, cause):
    result = hostile[0][name]
    assert result.verdict == "error"
    assert cause in result.gates[0].message
    assert all(g.verdict == "error" for g in result.gates)


def test_a_crashed_worker_is_replaced_for_the_remaining_gates(hostile):
    """The segfault kernel crashes a fresh worker in its second gate too (tests/test_gpu_faults.py: one
    that crashes once gets its real verdicts there)."""
    result = hostile[0]["segfault"]
    assert [g.message for g in result.gates] == ["worker killed by SIGSEGV (segmentation fault)"] * 2
    assert result.error and "SIGSEGV" in result.error and "1 fresh worker" in result.error


def test_remaining_gates_say_why_they_did_not_run(hostile):
    """A worker kgate killed (time or memory limit) is not replaced."""
    result = hostile[0]["hangs"]
    assert result.gates[1].message == "not run: timed out after 3 s in gate oracle earlier"
    assert result.error == "timed out after 3 s in gate oracle"


def test_kernel_output_cannot_forge_results(hostile):
    result = hostile[0]["prints-garbage"]
    oracle = next(g for g in result.gates if g.gate == "oracle")
    assert oracle.verdict == "fail"
    assert "noise" in open(result.log).read()


def test_results_are_streamed_as_jsonl(hostile):
    by_name, out = hostile
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == sum(len(r.gates) for r in by_name.values())
    assert {(line["kernel"], line["gate"]) for line in lines} == {
        (r.name, g.gate) for r in by_name.values() for g in r.gates}


def test_results_written_before_a_later_kernel_hangs(tmp_path):
    """The stream holds the first kernel's verdicts while the second is still running."""
    manifest = load(DATA / "hostile" / "kgate.yaml")
    kernels = [manifest.by_name("good"), manifest.by_name("hangs")]
    seen_during_hang = []

    class Watch(Runner):
        def run_kernel(self, kernel):
            if kernel.name == "hangs":
                seen_during_hang.extend((tmp_path / "results.jsonl").read_text().splitlines())
            return super().run_kernel(kernel)

    Watch(manifest, kernels, RunOptions(out_dir=tmp_path, gates=["oracle"], timeout=2)).run()
    assert [json.loads(x)["kernel"] for x in seen_during_hang] == ["good"]


def test_jobs_beyond_the_kernels_spread_one_kernels_gates_over_workers(tmp_path):
    """-j 3 with one kernel: its gates go to three workers at once; the verdicts are those of -j 1, in the
    kernel's gate order, and the three workers' logs end up in the kernel's one log."""
    manifest = load(DATA / "hostile" / "kgate.yaml")
    kernels = [k for k in manifest.kernels if k.name in ("good", "segfault")]
    gates = ["contract", "oracle", "special_values", "determinism", "input_integrity"]
    serial = Runner(manifest, kernels, RunOptions(out_dir=tmp_path / "serial", gates=gates)).run()
    spread = Runner(manifest, kernels, RunOptions(out_dir=tmp_path / "spread", gates=gates, jobs=6)).run()
    for one, many in zip(serial, spread, strict=True):
        assert [g.gate for g in many.gates] == [g.gate for g in one.gates] == gates
        assert [g.verdict for g in many.gates] == [g.verdict for g in one.gates]
    log = open(spread[0].log).read()
    assert "worker 1 of 3" in log and "worker 3 of 3" in log
    assert sorted(p.name for p in (tmp_path / "spread" / "logs").iterdir()) == ["good.log", "segfault.log"]
    # the crashing kernel: each of its three workers crashed in its first gate and was replaced
    assert "SIGSEGV" in spread[1].error
    lines = (tmp_path / "spread" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2 * len(gates)


def test_resume_judges_only_what_the_results_lack(tmp_path):
    """A run cut short (here: two results lost, one "not run", a line torn by the kill) goes on with
    --resume: the kept results stand as they were, only the missing gates are judged, each once, and
    the report holds all of them."""
    manifest = load(DATA / "hostile" / "kgate.yaml")
    kernels = [manifest.by_name("good"), manifest.by_name("raises")]
    gates = ["contract", "oracle", "special_values"]
    first = Runner(manifest, kernels, RunOptions(out_dir=tmp_path, gates=gates)).run()
    path = tmp_path / "results.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 6
    kept, lost = lines[:3], lines[3:]  # good's three results kept; raises' lost ...
    unjudged = {**lost[0], "verdict": "error", "message": "not run: timed out after 1 s in gate x earlier"}
    path.write_text("".join(json.dumps(r) + "\n" for r in [*kept, unjudged]) + '{"kernel": "raises", "ga')
    started = []

    class Watch(Runner):
        def _judge(self, judging, gates, log_path, **kwargs):
            started.append((judging.kernel.name, list(gates)))
            return super()._judge(judging, gates, log_path, **kwargs)

    again = Watch(manifest, kernels, RunOptions(out_dir=tmp_path, gates=gates, resume=True)).run()
    assert started == [("raises", gates)]  # good: nothing to judge; raises: all three again
    assert [[g.to_json() for g in r.gates] for r in again][0] == [
        {k: v for k, v in line.items() if k not in ("kernel", "digest")} for line in kept]
    assert [g.verdict for g in again[1].gates] == [g.verdict for g in first[1].gates]
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass  # the torn line stays, on its own line
    assert [(r["kernel"], r["gate"]) for r in records[4:]] == [("raises", g) for g in gates]


def test_run_resume_on_the_command_line(tmp_path):
    from kgate.cli import main as kgate_main

    manifest = str(DATA / "hostile" / "kgate.yaml")
    args = ["run", manifest, "-k", "good", "--gate", "contract", "--out", str(tmp_path), "-q"]
    assert kgate_main(args) == 0
    before = (tmp_path / "results.jsonl").read_text()
    assert kgate_main([*args, "--resume"]) == 0  # nothing left to judge: nothing judged, nothing lost
    assert (tmp_path / "results.jsonl").read_text() == before
    report = json.loads((tmp_path / "report.json").read_text())
    assert [g["verdict"] for k in report["kernels"] for g in k["gates"]] == ["pass"]


def test_resume_keeps_only_results_judged_on_the_same_manifest_and_files(tmp_path):
    """--resume keeps a result only under the digest it was recorded with (the manifest's text and the
    kernel's files): after the kernel's file changes, or for lines without that digest (written by anything
    but kgate), the kernel is judged again."""
    import shutil

    folder = tmp_path / "src"
    shutil.copytree(DATA / "hostile", folder)
    manifest = load(folder / "kgate.yaml")
    out = tmp_path / "out"
    options = RunOptions(out_dir=out, gates=["contract"])
    [first] = Runner(manifest, [manifest.by_name("raises")], options).run()
    assert first.gates[0].verdict == "error"
    # the same kernel, fixed: its recorded error no longer belongs to it
    text = (folder / "kernels.py").read_text()
    (folder / "kernels.py").write_text(text.replace("def raises(", "def raises(*args):\n    return good(*args)\n\n\n"
                                                    "def raises_before(", 1))
    manifest = load(folder / "kgate.yaml")
    resumed = Runner(manifest, [manifest.by_name("raises")], RunOptions(out_dir=out, gates=["contract"], resume=True))
    [again] = resumed.run()
    assert resumed.stale == 1 and again.gates[0].verdict == "pass"
    # a forged line (no digest) claiming a pass for a kernel not judged yet is not kept
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps({"kernel": "good", "gate": "contract", "verdict": "fail", "message": "forged",
                            "tolerance_free": True}) + "\n")
    forged = Runner(manifest, [manifest.by_name("good")], RunOptions(out_dir=out, gates=["contract"], resume=True))
    [good] = forged.run()
    assert forged.stale >= 1 and good.gates[0].verdict == "pass" and good.gates[0].message != "forged"
    # the other kernels' lines are no business of a run that judges one kernel: only its own stale line counts
    only_raises = Runner(manifest, [manifest.by_name("raises")], RunOptions(out_dir=out, gates=["contract"],
                                                                              resume=True))
    only_raises.run()
    assert only_raises.stale == 1  # its result from before the fix, not the two lines of `good`


def _workers_in(folder):
    """Pids of kgate workers whose working directory is `folder`."""
    return worker_pids("kgate.worker", lambda proc: (proc / "cwd").resolve() == folder.resolve())


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigterm_stops_kgate_and_its_workers(tmp_path, jobs):
    """A cancelled CI job sends SIGTERM: kgate ends at once, kills its workers (each in a process session
    of its own, they would run on) and keeps what was judged."""
    proc = subprocess.Popen([sys.executable, "-m", "kgate", "run", str(DATA / "hostile" / "kgate.yaml"), "-k",
                             "good or hangs", "--gate", "oracle", "--timeout", "300", "-j", jobs, "--out",
                             str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    results = tmp_path / "results.jsonl"
    try:
        # wait until `good` is judged and a worker is up: then it is the hanging kernel's (with -j 1 the
        # good kernel's worker ends first, and a check between the two workers would see none)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                results.exists() and '"good"' in results.read_text() and _workers_in(DATA / "hostile")):
            time.sleep(0.2)
        time.sleep(1.0)
        # this kgate's own workers (the other parameter's kgate, run beside it by xdist, has its own)
        mine = set(_workers_in(DATA / "hostile")) & set(procmem.descendants(proc.pid, procmem.parents()))
        assert mine, "no worker started"
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
        assert proc.returncode == 2, output
        assert "interrupted" in output
        # gone within seconds, not left running: the death signal reaches a sandboxed template and its
        # workers a little later on a busy machine, hence a deadline
        deadline = time.monotonic() + 10
        while mine & set(_workers_in(DATA / "hostile")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(mine & set(_workers_in(DATA / "hostile"))) == []
        assert '"good"' in results.read_text()  # what was judged is kept
    finally:
        if proc.poll() is None:  # a failed check must not leave kgate and its hanging worker running
            left = set(_workers_in(DATA / "hostile")) & set(procmem.descendants(proc.pid, procmem.parents()))
            proc.kill()
            for pid in left:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)


def test_workers_side_by_side_share_the_cores(monkeypatch):
    manifest = load(DATA / "hostile" / "kgate.yaml")
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert Runner(manifest, manifest.kernels, RunOptions(jobs=4))._threads() == 4
    assert Runner(manifest, manifest.kernels, RunOptions(jobs=32))._threads() == 1
    assert Runner(manifest, manifest.kernels, RunOptions(jobs=1))._threads() is None  # torch's default


def test_a_cpu_worker_is_limited_beyond_the_address_space_its_runtime_maps():
    """A CUDA build of torch maps several GiB of libraries at import, GPU or not: under an address-space
    limit of the manifest's few GiB, every CPU worker on a GPU machine died before its first gate
    ('worker exited with code 1'). Here a 6 GiB reservation stands for those libraries: the worker
    still starts and allocates within its limit, and an allocation past the limit is still refused."""
    script = """
import mmap
reserved = mmap.mmap(-1, 6 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
from kgate.worker import prepare_process
prepare_process({"device": "cpu", "memory": 1 << 30})
import torch
kept = torch.ones(512 << 20, dtype=torch.uint8)
try:
    torch.ones(3 << 30, dtype=torch.uint8)
except Exception as exc:
    print("refused:", type(exc).__name__)
else:
    print("allowed")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("refused:"), proc.stdout


def test_a_worker_that_cannot_start_says_why(tmp_path, monkeypatch):
    """kgate's own start failing (here torch cannot be imported) is reported with its cause, not as a hard
    exit in user code."""
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: failed to map segment')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    manifest = load(DATA / "hostile" / "kgate.yaml")
    [result] = Runner(manifest, [manifest.by_name("good")], RunOptions(out_dir=tmp_path / "out")).run()
    assert result.gates[0].message == ("the worker could not start, before any kernel code ran: ImportError: "
                                       "libtorch_cuda.so: failed to map segment")
    assert all(g.verdict == "error" for g in result.gates)
    assert result.gates[1].message.startswith("not run: the worker could not start")


FORGING_KERNELS = """\
import json, os, sys, time

import torch


def _channel():
    return json.load(open(sys.argv[1]))["event_fd"]  # the worker's job file names kgate's event pipe


def reference(x):
    return x * 2


def make_inputs(seed, shape=None):
    return (torch.ones(4),)


def restarts_the_clock(x):
    while True:  # hangs, forging a gate's start again and again
        os.write(_channel(), b'{"event": "gate_start", "gate": "oracle"}\\n')
        time.sleep(0.2)


def floods_the_pipe(x):
    chunk = b"x" * 2**20
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # 1 MiB a write, never a newline
        os.write(_channel(), chunk)
    return x * 2
"""


def test_the_event_pipe_cannot_hold_off_the_time_limit_or_grow_without_bound(tmp_path):
    """A kernel runs in the process that reports on it and can write to its event pipe: a forged stage start
    must not restart the clock again (each stage starts it once); a flood of bytes without a newline costs
    the flooding kernel its own result (lost in its garbage: an error), nothing else
    (`test_event_lines_split_across_chunks_and_drop_what_grows_past_the_limit` bounds the memory)."""

    (tmp_path / "k.py").write_text(FORGING_KERNELS)
    (tmp_path / "kgate.yaml").write_text(
        "version: 1\ndefaults: {device: cpu, seeds: [0], gates: [oracle], limits: {timeout: 3, memory: 2GiB}}\n"
        "kernels:\n"
        "  - {name: clock, kernel: k.py:restarts_the_clock, reference: k.py:reference, inputs: k.py:make_inputs}\n"
        "  - {name: flood, kernel: k.py:floods_the_pipe, reference: k.py:reference, inputs: k.py:make_inputs,\n"
        "     limits: {timeout: 30}}\n")
    manifest = load(tmp_path / "kgate.yaml")
    start = time.monotonic()
    by_name = {r.name: r for r in Runner(manifest, manifest.kernels, RunOptions(out_dir=tmp_path / "out")).run()}
    assert by_name["clock"].gates[0].message == "timed out after 3 s in gate oracle"
    assert time.monotonic() - start < 60
    assert by_name["flood"].gates[0].verdict == "error", by_name["flood"].gates[0]


def test_event_lines_split_across_chunks_and_drop_what_grows_past_the_limit():
    from kgate.runner import EventLines

    lines = EventLines(limit=10)
    assert lines.feed(b'{"a"') == [] and lines.feed(b': 1}\n{"b": 2}\n{"c"') == [b'{"a": 1}', b'{"b": 2}']
    assert lines.feed(b"x" * 8) == []
    assert lines._size <= 10  # the line grew past the limit: dropped so far, nothing kept of it
    assert lines.feed(b"yy\n{}\n") == [b"{}"]  # its tail is dropped with it, to the line's end
    # ... also when a read ended just where the garbage did: what follows up to the newline is still that
    # line (a fresh-clone CI run saw the flooding worker's own result pass that way, under load)
    assert lines.feed(b"x" * 11) == [] and lines.feed(b'{"event": "result"}\n{"b": 3}\n') == [b'{"b": 3}']
    for _ in range(1000):
        lines.feed(b"z" * 4096)
        assert lines._size <= 10 + 4096


def test_a_killed_worker_takes_its_whole_session(tmp_path):
    """ninja runs each compiler in a process group of its own: killing the worker's group alone left
    them compiling on, orphaned. The kill reaches every process of the worker's process session."""
    from kgate.runner import _kill

    pidfile = tmp_path / "grandchild.pid"
    script = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              "preexec_fn=os.setpgrp)\n"
              f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) != proc.pid  # its own group, as ninja's compilers
    _kill(proc)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        if (Path(f"/proc/{grandchild}/stat").read_text().split(")")[-1].split()[0]) == "Z":
            break  # killed, waiting for its (gone) parent's reaper
        time.sleep(0.1)
    alive = Path(f"/proc/{grandchild}").exists() and \
        Path(f"/proc/{grandchild}/stat").read_text().split(")")[-1].split()[0] != "Z"
    assert not alive


REFUSING_MANIFEST = """\
version: 1
defaults: {device: cpu, seeds: [0]}
kernels:
  - name: refuses-always
    kernel: k.py:refuses
    reference: k.py:ref
    inputs: k.py:make
    shapes: [[4, 6]]
    gates: [oracle, shapes, layouts, distributions]
  - name: refuses-odd
    kernel: k.py:refuses_odd
    reference: k.py:ref
    inputs: k.py:make
    shapes: [[4, 6]]
    gates: [oracle, shapes]
"""
REFUSING_KERNELS = """\
import torch

def make(seed, shape=(4, 6), dtype=None, device=None):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype or torch.float32),)

def ref(x):
    return torch.tanh(x)

def refuses(x):
    raise RuntimeError("not supported on this GPU")

def refuses_odd(x):
    if x.shape[-1] % 2:
        raise ValueError("the last dimension must be even")
    return torch.tanh(x)
"""


def test_a_kernel_that_raises_on_its_own_inputs_errs_in_every_gate(tmp_path):
    """A searching gate's crash finding is that gate's failure only where the kernel runs on the
    manifest's own inputs; a kernel that refuses them gets `error` in every gate, with the cause."""
    (tmp_path / "k.py").write_text(REFUSING_KERNELS)
    (tmp_path / "kgate.yaml").write_text(REFUSING_MANIFEST)
    manifest = load(tmp_path / "kgate.yaml")
    results = {r.name: r for r in Runner(manifest, manifest.kernels, RunOptions(out_dir=tmp_path / "o")).run()}
    always = {g.gate: g for g in results["refuses-always"].gates}
    assert {g: r.verdict for g, r in always.items()} == dict.fromkeys(
        ["oracle", "shapes", "layouts", "distributions"], "error")
    assert all("not supported on this GPU" in r.message for r in always.values())
    assert "on the manifest's own inputs" in always["shapes"].message
    assert always["shapes"].details["replaced"]["verdict"] == "fail"
    odd = {g.gate: g for g in results["refuses-odd"].gates}
    assert odd["oracle"].verdict == "pass"
    assert odd["shapes"].verdict == "fail" and "the last dimension must be even" in odd["shapes"].message



def test_each_worker_has_a_private_folder_removed_after_it(tmp_path, monkeypatch):
    """kgate.runner.supervise gives every worker its own folder (KGATE_PRIVATE_DIR: where kgate's own
    compiled Triton kernels go, out of the candidates' shared cache), seeded with the files kgate holds for
    it (PRIVATE_SEED: a worker that changes its copy changes nobody else's), and removes it when the worker
    ends."""
    from kgate import runner
    from kgate.runner import supervise

    monkeypatch.setattr(runner, "PRIVATE_SEED", {"triton/abc/kernel.cubin": b"compiled by kgate"})
    # (on the import path as kgate is: a worker's own working folder is not on it)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    (tmp_path / "probe_worker.py").write_text(
        "import json, os, sys\n"
        "job = json.load(open(sys.argv[1]))\n"
        "private = os.environ['KGATE_PRIVATE_DIR']\n"
        "seeded = os.path.join(private, 'triton', 'abc', 'kernel.cubin')\n"
        "got = open(seeded, 'rb').read().decode()\n"
        "open(seeded, 'wb').write(b'forged')  # its own copy only\n"
        "json.dump({'private': private, 'isdir': os.path.isdir(private), 'seed': got}, open(job['out'], 'w'))\n")
    seen = []
    for n in range(2):
        out = tmp_path / f"seen{n}.json"
        done = supervise("probe_worker", {"out": str(out)}, log_path=tmp_path / "log.txt", cwd=tmp_path,
                         timeout=60, memory=1 << 34, on_event=lambda event: None, writable=[tmp_path])
        assert done.returncode == 0, (tmp_path / "log.txt").read_text()
        seen.append(json.loads(out.read_text()))
    assert all(s["isdir"] for s in seen) and seen[0]["private"] != seen[1]["private"]
    assert [s["seed"] for s in seen] == ["compiled by kgate"] * 2  # the second is not the first's forgery
    assert not any(os.path.exists(s["private"]) for s in seen)


def test_kgates_triton_kernels_are_precompiled_once_only_when_on_and_on_a_gpu(tmp_path, monkeypatch):
    """seed_private_folders: nothing with KGATE_TRITON_EMULATION=0 or without a GPU; else one process of
    kgate's own compiles them (`python -m kgate.gates.lp_triton warm`) and its files are kept for every
    worker; if it fails, the run goes on (each worker compiles its own) and the line says so."""
    import subprocess as sp

    from kgate import runner

    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        folder = Path(argv[-2])
        if argv[-1] == "cuda:1":
            return sp.CompletedProcess(argv, 1, "", "RuntimeError: no such device")
        (folder / "triton" / "key").mkdir(parents=True)
        (folder / "triton" / "key" / "k.cubin").write_bytes(b"cubin")
        return sp.CompletedProcess(argv, 0, "14 variant(s)", "")

    monkeypatch.setattr(runner.subprocess, "run", fake_run)
    monkeypatch.setattr(runner, "PRIVATE_SEED", {})
    monkeypatch.setattr(runner, "_SEED_TRIED", set())
    monkeypatch.setenv("KGATE_TRITON_EMULATION", "0")
    assert runner.seed_private_folders(["cuda:0"]) is None and not calls  # turned off
    monkeypatch.delenv("KGATE_TRITON_EMULATION")  # on by default (the sequential order)
    assert runner.seed_private_folders(["cpu"]) is None and not calls  # no GPU
    line = runner.seed_private_folders(["cuda:1"])
    assert "not precompiled" in line and "no such device" in line and runner.PRIVATE_SEED == {}
    assert runner.seed_private_folders(["cuda:1"]) is None and len(calls) == 1  # a failure is not tried again
    line = runner.seed_private_folders(["cpu", "cuda:0"])
    assert "1 file(s)" in line and runner.PRIVATE_SEED == {os.path.join("triton", "key", "k.cubin"): b"cubin"}
    assert calls[-1][:-2] == runner.kgate_command("kgate.gates.lp_triton", "warm") and calls[-1][-1] == "cuda:0"
    assert not Path(calls[-1][-2]).exists()  # its folder removed: the files live in this process
    assert runner.seed_private_folders(["cuda:0"]) is None and len(calls) == 2  # once per process


def test_a_kgate_package_beside_the_kernels_does_not_stand_in_for_kgate(write_manifest, tmp_path, monkeypatch):
    """Workers run in the manifest's folder, and `python -m kgate.worker` there imported a `kgate/` package
    a pull request put beside its kernels: it could have reported any verdict. Workers start without the
    working folder on sys.path (kgate.runner.kgate_command)."""
    from kgate.cli import main as kgate_main
    from kgate.report import Report

    marker = tmp_path / "shadow-ran"
    manifest = write_manifest("""
        version: 1
        kernels:
          - name: off-by-one
            kernel: k.py:wrong
            reference: k.py:right
            inputs: k.py:make
            shapes: [[4, 8]]
        """, files={"k.py": """
        import torch
        def right(x):
            return x * 2
        def wrong(x):
            return x * 2 + 1
        def make(shape, dtype, device, seed):
            g = torch.Generator().manual_seed(seed)
            return (torch.randn(shape, generator=g).to(dtype=dtype, device=device),)
        """, "kgate/__init__.py": f"""
        import os, sys
        open({str(marker)!r}, "w").close()
        os._exit(0)
        """})
    monkeypatch.chdir(tmp_path)
    code = kgate_main(["run", str(manifest), "--gate", "oracle", "--device", "cpu", "-q", "--out", str(tmp_path / "o"),
                       "--json", str(tmp_path / "r.json")])
    assert not marker.exists(), "the kgate/ package beside the kernels ran"
    assert code == 1
    [kernel] = Report.read(tmp_path / "r.json").kernels
    assert [g.verdict for g in kernel.gates] == ["fail"]


_PLANTED = ("runpy", "warnings", "types", "functools", "contextlib", "collections", "operator", "keyword",
            "reprlib", "importlib", "site", "platform", "re", "enum")


def _interpreters() -> list[str | None]:
    """This interpreter (None) and the other CPython versions kgate supports that this machine has:
    which modules an interpreter freezes differs between versions (runpy is frozen on 3.11 only)."""
    import shutil

    pythons: list[str | None] = [None]
    for minor in (10, 12, 13):
        pyenv = sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
        for candidate in [shutil.which(f"python3.{minor}"), *map(str, pyenv)]:
            if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
                pythons.append(candidate)
                break
    return pythons


@pytest.mark.parametrize("python", _interpreters())
def test_nothing_in_the_working_folder_runs_before_kgate_is_started(tmp_path, python):
    """Workers and the manifest's path probe start in the kernels' folder. `import runpy, sys` before
    dropping the folder from sys.path ran a pull request's warnings.py (3.12) or runpy.py (3.10) there,
    with the environment's token, ahead of kgate itself."""
    marker = tmp_path / "ran"
    for name in _PLANTED:
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    done = subprocess.run(kgate_command("platform", python=python), cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    assert not marker.exists(), f"{python or sys.executable} ran {marker.read_text().split()} from the folder"
    assert done.returncode == 0, done.stderr  # platform's own main ran: from the standard library


def test_the_manifests_path_probe_gets_no_token(tmp_path, monkeypatch):
    """Validating a manifest with a module reference starts the workers' command in the manifest's folder
    to learn their sys.path: that process gets no token either."""
    import kgate.manifest as manifest

    seen = []
    real = subprocess.run

    def spy(*args, **kwargs):
        seen.append(kwargs.get("env"))
        return real(*args, **kwargs)

    monkeypatch.setenv("GITHUB_TOKEN", "secret")
    monkeypatch.setenv("INPUT_GITHUB-TOKEN", "secret")
    monkeypatch.setattr(manifest.subprocess, "run", spy)
    manifest._started_sys_path.cache_clear()
    path = manifest.worker_sys_path(tmp_path)
    assert path and seen, "the probe did not run"
    assert all(env is not None and "GITHUB_TOKEN" not in env and "INPUT_GITHUB-TOKEN" not in env for env in seen)


def test_kgate_run_and_kgate_audit_check_the_cuda_device_in_one_place(monkeypatch):
    """`kgate run` (resolve_device) and `kgate audit` (make_plan) accept the same CUDA devices and refuse the
    others with the same infrastructure error (exit 2: nothing judged), from runner.visible_cuda."""
    from kgate import runner
    from kgate.audit.scheduler import make_plan
    from kgate.errors import InfrastructureError, UsageError

    for visible in ([], [0, 1]):
        monkeypatch.setattr(runner, "cuda_devices", lambda visible=visible: visible)
        assert runner.resolve_device("auto") == ("cuda" if visible else "cpu")
        assert make_plan("auto", None, 1).devices == ([f"cuda:{i}" for i in visible] or ["cpu"])
        for wanted in ("cuda", "cuda:1", "cuda:2"):
            if wanted == "cuda:2" or not visible:
                with pytest.raises(InfrastructureError, match="no such CUDA device here"):
                    runner.resolve_device(wanted)
                with pytest.raises(InfrastructureError, match="no such CUDA device here"):
                    make_plan(wanted, None, 1)
            else:
                assert runner.resolve_device(wanted) == wanted
                assert make_plan(wanted, None, 1).devices == (["cuda:1"] if wanted == "cuda:1" else ["cuda:0", "cuda:1"])
    with pytest.raises(UsageError, match="use cuda or cuda:N"):
        make_plan("cuda:x", None, 1)
    with pytest.raises(UsageError, match="use cuda or cuda:N"):
        runner.resolve_device("cudax")
    with pytest.raises(UsageError, match="use auto, cpu, cuda or cuda:N"):
        make_plan("gpu", None, 1)


def test_a_kernels_digest_follows_its_own_entry_and_the_defaults_not_the_rest_of_the_manifest(tmp_path):
    """--resume's digest: editing another kernel's entry or a comment keeps a kernel's results; editing its own
    entry, or the defaults every entry takes, makes them stale."""
    (tmp_path / "k.py").write_text("def f(x):\n    return x\n")
    text = ("version: 1\ndefaults:\n  dtypes: [float32]\nkernels:\n"
            "  - name: a\n    kernel: k.py:f\n    reference: k.py:f\n    shapes: [[4]]\n"
            "  - name: b\n    kernel: k.py:f\n    reference: k.py:f\n    shapes: [[4]]\n")
    path = tmp_path / "kgate.yaml"

    def digests(manifest_text: str) -> dict[str, str]:
        path.write_text(manifest_text)
        manifest = load(path)
        return {k.name: k.digest() for k in manifest.kernels}

    first = digests(text)
    assert first["a"] != first["b"]
    other = digests(text.replace("    shapes: [[4]]\n", "    shapes: [[4]]\n    seeds: [3]\n", 2)
                    .replace("    shapes: [[4]]\n    seeds: [3]\n", "    shapes: [[4]]\n", 1))
    assert other["a"] == first["a"] and other["b"] != first["b"]  # only b's entry changed
    assert digests("# a comment\n" + text) == first
    defaults = digests(text.replace("dtypes: [float32]", "dtypes: [float32, float64]"))
    assert defaults["a"] != first["a"] and defaults["b"] != first["b"]
    (tmp_path / "k.py").write_text("def f(x):\n    return x + 0\n")
    assert digests(text)["a"] != first["a"]  # the kernel's file


# a kernel, its reference and inputs that the cache tests' modules share (their caches' marks come first)
_DOUBLING_KERNEL = '''

def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    return (torch.randn(8, 8, generator=torch.Generator().manual_seed(seed), dtype=dtype),)


def kernel(x):
    return x * 2


def reference(x):
    return x * 2
'''

_CACHE_KERNELS = '''
import os
import time

import torch

CACHE = os.environ["TRITON_CACHE_DIR"]
# this worker's mark in the kernel's cache (one per process: the module is loaded once per role, and each
# sandboxed worker has a process-id namespace of its own, so its pid is no name)
token = os.environ.setdefault("KGATE_TEST_MARK", os.urandom(8).hex())
open(os.path.join(CACHE, f"seen-{token}"), "w").close()
deadline = time.monotonic() + 30
while len([n for n in os.listdir(CACHE) if n.startswith("seen-")]) < WORKERS and time.monotonic() < deadline:
    time.sleep(0.05)
print("cache", CACHE, "marks", len([n for n in os.listdir(CACHE) if n.startswith("seen-")]),
      "autotuning", os.environ.get("TRITON_CACHE_AUTOTUNING"), flush=True)
''' + _DOUBLING_KERNEL


def test_a_kernels_workers_share_one_build_cache_and_other_kernels_do_not_see_it(tmp_path):
    """Triton's cache and torch's extension builds: one pair per kernel for the run, written by every worker of
    that kernel (here two at once: each waits until it sees the other's mark), never shown to another kernel's
    workers (each kernel sees its own marks only)."""
    for name, workers in (("first", 2), ("second", 1)):
        (tmp_path / f"{name}.py").write_text(_CACHE_KERNELS.replace("WORKERS", str(workers)))
    (tmp_path / "kgate.yaml").write_text(
        "version: 1\ndefaults: {seeds: [0]}\nkernels:\n"
        + "".join(f"  - {{name: {n}, kernel: '{n}.py:kernel', reference: '{n}.py:reference', "
                  f"inputs: '{n}.py:make_inputs'}}\n" for n in ("first", "second")))
    manifest = load(tmp_path / "kgate.yaml")
    options = RunOptions(out_dir=tmp_path / "out", gates=["contract", "oracle"])
    runner = Runner(manifest, manifest.kernels, options)
    first = runner.run_kernel(manifest.by_name("first"), parts=2)
    second = runner.run_kernel(manifest.by_name("second"))
    assert first.verdict == second.verdict == "pass", (first.error, second.error)
    logs = {r.name: open(r.log).read() for r in (first, second)}
    marks = {name: [line.split() for line in log.splitlines() if line.startswith("cache ")]
             for name, log in logs.items()}
    assert {m[3] for m in marks["first"]} == {"2"}, logs["first"]  # each worker saw both workers' marks
    assert len({m[1] for m in marks["first"]}) == 1
    assert {m[3] for m in marks["second"]} == {"1"}, logs["second"]  # its own mark only
    assert marks["second"][0][1] != marks["first"][0][1]
    assert {m[5] for ms in marks.values() for m in ms} == {"1"}  # Triton's autotuning timings kept in that cache


def test_a_sigkill_kgate_did_not_send_names_the_likely_causes_and_the_memory_held():
    """A worker the system's out-of-memory killer took (a machine with less memory than the workers' limits
    allow together) was reported as a bare 'worker killed by SIGKILL (killed)'."""
    from kgate import procmem
    from kgate.runner import WorkerExit

    killed = WorkerExit(-signal.SIGKILL, peak_memory=21 * 2**30).cause(done=False)
    assert killed.startswith("worker killed by SIGKILL (killed), not by kgate")
    assert "out-of-memory killer" in killed and "21.0 GiB" in killed and "--memory" in killed
    if procmem.machine_memory():
        assert "of this machine's" in killed
    assert WorkerExit(-signal.SIGSEGV).cause(done=False) == "worker killed by SIGSEGV (segmentation fault)"
    assert WorkerExit(-signal.SIGKILL, error="cancelled (the run was interrupted)").cause(done=False) == \
        "cancelled (the run was interrupted)"  # kgate's own kill says why kgate sent it


def test_kgates_triton_kernels_are_precompiled_only_for_runs_that_judge_accumulation(monkeypatch, tmp_path):
    from kgate import runner

    asked = []
    monkeypatch.setattr(runner, "seed_private_folders", lambda devices: asked.append(list(devices)))
    manifest = load(DATA / "hostile" / "kgate.yaml")
    for gates in (["contract"], ["accumulation"]):
        Runner(manifest, [manifest.by_name("good")], RunOptions(out_dir=tmp_path / gates[0], gates=gates)).run()
    assert asked == [[], ["cpu"]]  # no GPU here; on one, the second would compile and the first not


_LIBCACHE_KERNELS = """
import os
import pathlib
import uuid

import torch

WORKER = uuid.uuid4().hex  # (a sandboxed worker's pid is the same in each: its own pid namespace)


def make(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g).to(dtype=dtype, device=device),)


def right(x):
    return x * 2


def _sees_only(tag):
    # a library's own cache: written and read back, and no other kernel's entries in it
    folder = os.environ.get("LIBCACHE_DIR")
    if not folder:
        return False
    path = pathlib.Path(folder)
    (path / f"{tag}-{WORKER}").touch()
    return {f.name.split("-")[0] for f in path.iterdir()} == {tag}


def kernel_a(x):
    return x * 2 if _sees_only("a") else x * 2 + 1


def kernel_b(x):
    return x * 2 if _sees_only("b") else x * 2 + 1
"""


def test_cache_env_gives_each_kernel_one_cache_folder_its_workers_share(write_manifest, tmp_path, monkeypatch):
    """`cache_env: [LIBCACHE_DIR]` (a library's own cache, e.g. FlagGems' tuned configurations): each kernel's
    workers get one folder of that kernel's own, writable, shared by its workers and unseen by the other
    kernel. Without it the variable does not reach a worker at all, even where kgate's own environment sets it
    (the allow-list): the kernels then fail."""
    from kgate import sandbox
    from kgate.cli import main as kgate_main
    from kgate.report import Report

    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("LIBCACHE_DIR", str(shared))  # never reaches a worker: kgate's folders stand instead
    entries = """
        version: 1
        defaults:
          device: cpu
          {cache}
        kernels:
          - name: a
            kernel: k.py:kernel_a
            reference: k.py:right
            inputs: k.py:make
            shapes: [[4, 8]]
          - name: b
            kernel: k.py:kernel_b
            reference: k.py:right
            inputs: k.py:make
            shapes: [[4, 8]]
        """
    manifest = write_manifest(entries.format(cache="cache_env: [LIBCACHE_DIR]"), files={"k.py": _LIBCACHE_KERNELS})
    for gates in ("contract,oracle", "determinism"):  # later workers of the kernel (in this process) too
        code = kgate_main(["run", str(manifest), "--gate", gates, "-j", "2", "-q", "--out", str(tmp_path / gates),
                           "--json", str(tmp_path / "r.json")])
        report = Report.read(tmp_path / "r.json")
        assert code == 0, [(k.name, g.gate, g.message) for k in report.kernels for g in k.gates]
    assert not list(shared.iterdir())
    folders = list(sandbox.process_folder("kgate-caches-").glob("a-*/env/LIBCACHE_DIR"))
    assert len(folders) == 1
    workers = {f.name.split("-")[1] for f in folders[0].iterdir()}
    assert len(workers) >= 2, workers  # the kernel's workers, one folder

    plain = write_manifest(entries.format(cache=""), files={"k.py": _LIBCACHE_KERNELS}, name="plain.yaml")
    assert kgate_main(["run", str(plain), "--gate", "oracle", "-q", "--out", str(tmp_path / "p")]) == 1
    assert not list(shared.iterdir())


_PERSISTENT_CACHE_KERNEL = '''
import os

import torch

CACHE = os.environ["TRITON_CACHE_DIR"]
if "KGATE_TEST_LOADED" not in os.environ:  # one mark per worker process (the file loads once per role)
    os.environ["KGATE_TEST_LOADED"] = "1"
    before = len([n for n in os.listdir(CACHE) if n.startswith("run-")])
    open(os.path.join(CACHE, "run-" + os.urandom(8).hex()), "w").close()
    print("marks-before", before, "cache", CACHE, flush=True)
''' + _DOUBLING_KERNEL


def test_run_cache_keeps_a_kernels_builds_across_runs_and_never_shows_them_to_another(tmp_path):
    """`kgate run --cache DIR`: a kernel's later run finds what its earlier run wrote into its caches (Triton's
    builds and autotuning, not compiled again); another kernel, and the same kernel run without --cache, start
    from an empty folder."""
    for name in ("first", "second"):
        (tmp_path / f"{name}.py").write_text(_PERSISTENT_CACHE_KERNEL)
    (tmp_path / "kgate.yaml").write_text(
        "version: 1\ndefaults: {seeds: [0]}\nkernels:\n"
        + "".join(f"  - {{name: {n}, kernel: '{n}.py:kernel', reference: '{n}.py:reference', "
                  f"inputs: '{n}.py:make_inputs'}}\n" for n in ("first", "second")))
    manifest = load(tmp_path / "kgate.yaml")

    def before(name: str, run: int, cache: Path | None) -> tuple[int, str]:
        options = RunOptions(out_dir=tmp_path / f"out-{run}", gates=["contract"], cache_dir=cache)
        result = Runner(manifest, manifest.kernels, options).run_kernel(manifest.by_name(name))
        assert result.verdict == "pass", result.error
        line = next(x.split() for x in open(result.log).read().splitlines() if x.startswith("marks-before"))
        return int(line[1]), line[3]

    cache = tmp_path / "cache"
    seen, folder = before("first", 1, cache)
    assert seen == 0 and Path(folder).is_relative_to(cache)
    again, same = before("first", 2, cache)
    assert again >= 1 and same == folder  # the earlier run's mark: its folder kept
    other, elsewhere = before("second", 3, cache)
    assert other == 0 and elsewhere != folder
    fresh, temporary = before("first", 4, None)
    assert fresh == 0 and not Path(temporary).is_relative_to(cache)


def test_run_cache_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    from kgate.cli import main as kgate_main

    (tmp_path / "file").write_text("")
    manifest = tmp_path / "kgate.yaml"
    manifest.write_text("version: 1\nkernels: []\n")
    assert kgate_main(["run", str(manifest), "--cache", str(tmp_path / "file")]) == 2
    assert "--cache" in capsys.readouterr().err
