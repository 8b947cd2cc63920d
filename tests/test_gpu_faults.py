"""GPU faults that destroy the CUDA context (kgate.faults), simulated on the CPU.

A kernel's illegal memory access surfaces asynchronously, at whatever touches the device next, and
the process can then launch nothing more. The worker charges it to the gate during which it surfaced
(it synchronizes after each gate) and stops; the runner goes on with the remaining gates in a fresh
worker, a bounded number of times. The simulated kernels are in tests/data/gpufault/kernels.py.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import kgate.subject
from kgate import gates as registry
from kgate.cli import main as kgate_main
from kgate.faults import ContextLost, context_lost, fault_message, reference_fault_message
from kgate.gates.base import Gate, GateResult
from kgate.manifest import load
from kgate.runner import Runner, RunOptions
from kgate.subject import UserCodeError
from kgate.worker import run_gates
from tests.conftest import DATA
from tests.gate_harness import subject_for
from tests.process_support import unsandboxed

ILLEGAL = "CUDA error: an illegal memory access was encountered"
TORCH_TAIL = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
              "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
              "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


# --- recognising a lost context ----------------------------------------------------------------------

@pytest.mark.parametrize(("message", "line"), [
    (ILLEGAL + TORCH_TAIL, ILLEGAL),
    ("CUDA error: unspecified launch failure" + TORCH_TAIL, "CUDA error: unspecified launch failure"),
    ("CUDA error: device-side assert triggered" + TORCH_TAIL, "CUDA error: device-side assert triggered"),
    ("CUDA error: misaligned address" + TORCH_TAIL, "CUDA error: misaligned address"),
    ("CUDA error: an illegal instruction was encountered", "CUDA error: an illegal instruction was encountered"),
    ("Triton Error [CUDA]: an illegal memory access was encountered",
     "Triton Error [CUDA]: an illegal memory access was encountered"),
    ("CUDA driver error: CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA driver error: CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("cudaErrorLaunchFailure: unspecified launch failure", "cudaErrorLaunchFailure: unspecified launch failure"),
])
def test_sticky_cuda_errors_are_recognised_by_their_first_line(message, line):
    assert context_lost(message) == line
    assert context_lost(torch.AcceleratorError(message)) == line
    assert context_lost(RuntimeError(message)) == line


@pytest.mark.parametrize("message", [
    # Launch-configuration errors leave the context usable, though torch's message names
    # device-side assertions (in the hint every CUDA error carries).
    "CUDA error: invalid configuration argument" + TORCH_TAIL,
    "CUDA error: too many resources requested for launch" + TORCH_TAIL,
    "CUDA error: invalid argument" + TORCH_TAIL,  # what an empty grid gives on the H200
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
    "the address is not legal tender",
    "",
])
def test_other_errors_are_not_a_lost_context(message):
    assert context_lost(message) is None
    assert context_lost(torch.AcceleratorError(message)) is None
    assert context_lost(None) is None


def test_the_cuda_message_is_found_inside_wrappers():
    """The factory's error wraps the CUDA one (InputFactory, then UserCodeError): the CUDA line, not the
    wrapper's, is reported."""
    try:
        try:
            raise torch.AcceleratorError(ILLEGAL + TORCH_TAIL)
        except RuntimeError as inner:
            raise ValueError(f"inputs factory raised AcceleratorError: {inner}") from inner
    except ValueError as outer:
        wrapped = UserCodeError("inputs factory", outer)
    assert context_lost(wrapped) == ILLEGAL


def test_fault_message_blames_the_kernel_not_who_saw_it_first():
    assert fault_message(ILLEGAL).startswith(f"the kernel faulted on the GPU (CUDA context lost): {ILLEGAL}; ")
    assert "compute-sanitizer" in fault_message(ILLEGAL)
    late = fault_message(ILLEGAL, "inputs factory")
    assert late.startswith("the kernel faulted on the GPU (CUDA context lost by an earlier launch; first "
                           "reported by the inputs factory): ")


# --- the worker's gate loop, in-process ----------------------------------------------------------------

class Channel:
    def __init__(self):
        self.events: list[dict] = []

    def send(self, event, **payload):
        self.events.append({"event": event, **payload})

    def results(self):
        return {e["result"]["gate"]: e["result"] for e in self.events if e["event"] == "result"}


class Passes(Gate):
    """A gate that reaches its verdict without synchronizing (as a gate that swallowed a crash does)."""

    name, summary, tolerance_free = "oracle", "test double", False

    def check(self, subject):
        return self.passed("fine")


def double(x):
    return x * 2


def inputs(seed, shape=None):
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)),)


def test_the_device_is_synchronized_after_every_gate_and_a_clean_run_passes(monkeypatch):
    """Isolation included: the worker's synchronize after a gate changes nothing it watches."""
    calls = []
    real = kgate.subject.synchronize
    monkeypatch.setattr(kgate.subject, "synchronize", lambda device: (calls.append(device), real(device)))
    channel = Channel()
    names = ["oracle", "determinism", "isolation"]
    assert run_gates(channel, subject_for(double, double, inputs), names, None) is None
    assert {g: r["verdict"] for g, r in channel.results().items()} == dict.fromkeys(names, "pass")
    assert len(calls) >= len(names) and all(d == torch.device("cpu") for d in calls)


def test_a_fault_reported_after_the_gate_replaces_its_verdict_and_stops_the_worker(monkeypatch):
    def dead(device):
        raise torch.AcceleratorError(ILLEGAL + TORCH_TAIL)

    monkeypatch.setitem(registry._cache, "oracle", Passes())
    monkeypatch.setattr(kgate.subject, "synchronize", dead)
    channel = Channel()
    assert run_gates(channel, subject_for(double, double, inputs), ["oracle", "determinism"], None).line == ILLEGAL
    assert [e["event"] for e in channel.events] == ["gate_start", "result"]  # determinism never started
    result = GateResult.from_json(channel.results()["oracle"])
    assert result.verdict == "error" and result.broken
    assert result.message == fault_message(ILLEGAL)
    assert result.repro == "kgate run kgate.yaml -k k --gate oracle --device cpu"
    assert result.details["replaced"] == {"verdict": "pass", "message": "fine"}
    assert result.details["first_reported_by"] == "the synchronize after the gate"


def test_another_error_after_the_gate_is_that_gates_error_and_the_worker_goes_on(monkeypatch):
    real, calls = kgate.subject.synchronize, []

    def fails_once(device):  # the first call is the one after the test double
        calls.append(device)
        if len(calls) == 1:
            raise torch.AcceleratorError("CUDA error: invalid configuration argument" + TORCH_TAIL)
        real(device)

    monkeypatch.setitem(registry._cache, "oracle", Passes())
    monkeypatch.setattr(kgate.subject, "synchronize", fails_once)
    channel = Channel()
    subject = subject_for(double, double, inputs)
    assert run_gates(channel, subject, ["oracle", "determinism"], None) is None
    results = channel.results()
    assert results["oracle"]["verdict"] == "error"
    assert results["oracle"]["message"].startswith("the device reported an error after the gate's launches: "
                                                   "AcceleratorError: CUDA error: invalid configuration argument")
    assert results["determinism"]["verdict"] == "pass"


def test_a_factory_that_meets_a_dead_context_is_not_blamed(monkeypatch):
    dead = []

    def kernel(x):
        dead.append(True)  # the launch faults; nothing synchronizes before the next case's inputs
        return x * 2

    def factory(seed, shape=None):
        if dead:
            raise torch.AcceleratorError(ILLEGAL + TORCH_TAIL)
        return inputs(seed)

    channel = Channel()
    subject = subject_for(kernel, double, factory, seeds=(0, 1))
    assert run_gates(channel, subject, ["oracle", "determinism"], None).line == ILLEGAL
    result = channel.results()["oracle"]
    assert result["message"] == fault_message(ILLEGAL, "inputs factory")
    assert "inputs factory raised" not in result["message"]
    assert "determinism" not in channel.results()


# --- the reference's own fault ----------------------------------------------------------------------

MISALIGNED = "CUDA error: misaligned address"


class _Device:
    """Stands in for a CUDA context: `lose()` makes every later synchronize raise the sticky error."""

    def __init__(self, monkeypatch):
        self.dead = False
        monkeypatch.setattr(kgate.subject, "synchronize", self.synchronize)

    def synchronize(self, device):
        if self.dead:
            raise torch.AcceleratorError(MISALIGNED + TORCH_TAIL)

    def lose(self):
        self.dead = True
        raise torch.AcceleratorError(MISALIGNED + TORCH_TAIL)


def test_a_reference_that_faults_on_a_strided_probe_skips_the_gate_and_blames_no_kernel(monkeypatch):
    """torch's scaled_dot_product_attention as its own candidate on an H100 (CUDA): the layouts gate's
    storage-offset probe made the reference lose the CUDA context; the gate took that for the reference
    rejecting the layout and went on, the next launch reported the fault, and a correct kernel got "the
    kernel faulted on the GPU". The reference's own fault (the device clean before its call) skips the gate."""
    device = _Device(monkeypatch)

    def reference(x):
        if x.storage_offset():
            device.lose()
        return x * 2

    channel = Channel()
    lost = run_gates(channel, subject_for(double, reference, inputs), ["layouts", "determinism"], None)
    assert isinstance(lost, ContextLost) and lost.own and lost.line == MISALIGNED and lost.role == "reference"
    result = channel.results()["layouts"]
    assert result["verdict"] == "skip", result["message"]
    assert result["message"] == reference_fault_message(MISALIGNED)
    assert result["details"]["reference_fault"] is True
    assert "determinism" not in channel.results()  # a fresh worker runs it


def test_a_kernel_that_faults_on_a_strided_probe_is_still_the_kernels_fault(monkeypatch):
    """The control: the same fault in the kernel's launch (the reference ran clean on the probe) is the
    kernel's, an error that names it."""
    device = _Device(monkeypatch)

    def kernel(x):
        if x.storage_offset():
            device.lose()
        return x * 2

    channel = Channel()
    lost = run_gates(channel, subject_for(kernel, double, inputs), ["layouts", "determinism"], None)
    assert isinstance(lost, ContextLost) and not lost.own
    result = channel.results()["layouts"]
    assert result["verdict"] == "error" and result["message"].startswith("the kernel faulted on the GPU")


def test_a_fault_an_earlier_launch_left_pending_is_not_the_references(monkeypatch):
    """A kernel that leaves a fault pending (no synchronize after it) and returns: the reference's call
    is the first to see it, but the device was not clean when that call began, so the fault stays the
    kernel's and the gate's verdict is an error, never the skip a reference's own fault gives."""
    device = _Device(monkeypatch)
    subject = subject_for(double, double, inputs)
    device.dead = True
    with pytest.raises(ContextLost) as caught:
        subject.run_reference(inputs(0))
    assert not caught.value.own and caught.value.role == "reference"

    def kernel(x):
        device.dead = x.storage_offset() != 0 or device.dead  # faults asynchronously on the strided probe
        return x * 2

    real_run_kernel = kgate.subject.Subject.run_kernel
    monkeypatch.setattr(kgate.subject.Subject, "run_kernel",
                        lambda self, args, sync=True: real_run_kernel(self, args, sync=False))
    device.dead = False
    channel = Channel()
    run_gates(channel, subject_for(kernel, double, inputs), ["layouts"], None)
    result = channel.results()["layouts"]
    assert result["verdict"] == "error", result["message"]
    assert result["message"] == fault_message(MISALIGNED, "reference")


def test_a_reference_raising_an_ordinary_error_is_still_a_rejection(monkeypatch):
    """Only a lost context ends the gate: a reference that raises otherwise on a layout rejects it."""
    _Device(monkeypatch)

    def reference(x):
        if x.storage_offset():
            raise ValueError("expects an aligned tensor")
        return x * 2

    channel = Channel()
    assert run_gates(channel, subject_for(double, reference, inputs), ["layouts"], None) is None
    result = channel.results()["layouts"]
    assert result["verdict"] == "pass" and "skipped 2 the reference rejects" in result["message"]


FAULTY_PROBLEM = """
import torch
import torch.nn as nn

import kgate.subject

MESSAGE = "CUDA error: misaligned address"


def _dead(device):
    raise torch.AcceleratorError(MESSAGE)


class Model(nn.Module):
    def forward(self, x):
        if x.storage_offset() % 4:  # as torch's memory-efficient attention: float32 offsets not 16-byte aligned
            kgate.subject.synchronize = _dead
            raise torch.AcceleratorError(MESSAGE)
        return x * 2


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
"""


def test_an_audited_problem_whose_model_faults_on_a_probe_leaves_its_own_model_judged(tmp_path):
    """The audit's side: the candidate that is the problem's own Model is judged (not counted as crashed),
    the gate skips, the gates after it run in a fresh worker, and the record says why."""
    (tmp_path / "problems" / "level1").mkdir(parents=True)
    (tmp_path / "candidates" / "level1").mkdir(parents=True)
    (tmp_path / "problems" / "level1" / "1_Faulty.py").write_text(FAULTY_PROBLEM)
    (tmp_path / "candidates" / "level1" / "1_Faulty.py").write_text("ModelNew = Model  # noqa: F821\n")
    code = kgate_main(["audit", "--format", "kernelbench", "--problems", str(tmp_path / "problems"),
                       "--candidates", str(tmp_path / "candidates"), "--device", "cpu", "--gate",
                       "oracle,layouts,isolation", "--out", str(tmp_path / "run"), "-q"])
    (line,) = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    verdicts = {g["gate"]: g["verdict"] for g in record["gates"]}
    assert verdicts == {"oracle": "pass", "layouts": "skip", "isolation": "pass"}, record
    assert record["error"] is None and record["restarts"] == 1
    assert "lost the CUDA context" in record["notes"]["reference_fault"]
    assert code == 0


# --- the runner: a fresh worker for the remaining gates --------------------------------------------------

@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpufault")
    markers = out / "markers"
    markers.mkdir()
    manifest = load(DATA / "gpufault" / "kgate.yaml")
    with pytest.MonkeyPatch.context() as mp, unsandboxed():  # (the markers are files the kernels write)
        mp.setenv("KGATE_TEST_MARKERS", str(markers))
        results = Runner(manifest, manifest.kernels, RunOptions(out_dir=out, jobs=2, max_restarts=1)).run()
    return {r.name: r for r in results}, out


def verdicts(result):
    return {g.gate: g.verdict for g in result.gates}


def test_a_correct_kernel_passes_every_gate_isolation_included(faults):
    assert verdicts(faults[0]["good"]) == dict.fromkeys(["oracle", "determinism", "input_integrity", "isolation"],
                                                        "pass")
    assert faults[0]["good"].error is None


def test_the_gate_where_the_context_was_lost_gets_error_and_the_rest_run_in_a_fresh_worker(faults):
    result = faults[0]["async-fault"]
    oracle = result.gates[0]
    assert oracle.gate == "oracle" and oracle.verdict == "error"
    assert oracle.message == fault_message(ILLEGAL)
    assert oracle.repro.startswith("kgate run ") and oracle.repro.endswith(
        "gpufault/kgate.yaml -k async-fault --gate oracle --device cpu")
    assert verdicts(result) == {"oracle": "error", "determinism": "pass", "input_integrity": "pass",
                                "isolation": "pass"}
    assert result.error == "the CUDA context was lost in gate oracle (1 fresh worker(s) ran the gates after)"
    log = open(result.log).read()
    assert "--- kgate: a fresh worker for the remaining gates (the CUDA context was lost) ---" in log


def test_a_gate_that_finished_with_its_own_verdict_on_a_dead_context_gets_error(faults):
    """The H200 case: the shapes gate took the fault for a finding and went on; the synchronize after it
    tells the truth, and the gates after it are not blamed on the inputs factory."""
    result = faults[0]["shapes-fault"]
    shapes = next(g for g in result.gates if g.gate == "shapes")
    assert shapes.verdict == "error" and shapes.message == fault_message(ILLEGAL)
    assert shapes.details["replaced"]["verdict"] == "fail"
    assert "--shape" in shapes.repro  # the gate's own reproducer, with its case, is kept
    assert {g: v for g, v in verdicts(result).items() if g != "shapes"} == dict.fromkeys(
        ["oracle", "determinism", "isolation"], "pass")


def test_the_inputs_factory_is_not_blamed_for_a_context_a_launch_destroyed(faults):
    result = faults[0]["factory-first"]
    assert result.gates[0].message == fault_message(ILLEGAL, "inputs factory")
    assert [g.verdict for g in result.gates[1:]] == ["pass"] * 3


def test_restarts_are_capped(faults):
    result = faults[0]["always-faults"]
    assert [g.message for g in result.gates] == [fault_message(ILLEGAL)] * 2 + \
        ["not run: the CUDA context was lost 2 times"] * 2
    assert RunOptions().max_restarts == 3


def test_a_worker_that_crashed_once_is_replaced(faults):
    result = faults[0]["segfault-once"]
    assert result.gates[0].message == "worker killed by SIGSEGV (segmentation fault)"
    assert [g.verdict for g in result.gates[1:]] == ["pass"] * 3


def test_a_reference_fault_skips_its_gate_the_rest_run_in_a_fresh_worker_and_the_kernel_has_no_error(faults):
    result = faults[0]["reference-faults"]
    layouts = next(g for g in result.gates if g.gate == "layouts")
    assert layouts.verdict == "skip" and layouts.message.startswith("the reference itself faulted on the GPU")
    assert {g: v for g, v in verdicts(result).items() if g != "layouts"} == dict.fromkeys(
        ["oracle", "determinism", "isolation"], "pass")
    assert result.error is None
    assert result.notes["reference_fault"].startswith("the reference lost the CUDA context on a probe of: layouts")
    log = open(result.log).read()
    assert "--- kgate: a fresh worker for the remaining gates (the reference lost the CUDA context) ---" in log


def test_results_jsonl_has_one_record_per_gate(faults):
    by_name, out = faults
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    keys = [(line["kernel"], line["gate"]) for line in lines]
    assert len(keys) == len(set(keys)) == sum(len(r.gates) for r in by_name.values())
    assert set(keys) == {(r.name, g.gate) for r in by_name.values() for g in r.gates}


# --- launch errors an extension leaves pending ------------------------------------------------------

class _PendingLaunchError:
    """Stands in for the CUDA runtime's pending error: a kernel 'launches with a bad grid' by setting it;
    kgate's check after the kernel raises it (and clears it, as cudaGetLastError does)."""

    def __init__(self):
        self.pending = False

    def check(self, device):
        if self.pending:
            self.pending = False
            raise torch.AcceleratorError("CUDA error: invalid argument" + TORCH_TAIL)


@pytest.mark.parametrize("then_raises", [False, True])
def test_a_launch_error_left_pending_is_the_kernels(monkeypatch, then_raises):
    """Seen on the H200: an extension's launch failed at a generated shape, the extension did not check,
    and the error surfaced in kgate's next CUDA call ('kgate internal error in gate shapes'). kgate checks
    right after the kernel, on return and on raise, so it is the kernel's failure and nothing is left
    pending for the reference, the factory or the next gate."""
    runtime = _PendingLaunchError()
    monkeypatch.setattr(kgate.subject, "raise_pending_launch_error", runtime.check)

    def kernel(x):
        if x.shape[-1] != 8:  # fine at the declared shape, a bad launch at the others
            runtime.pending = True
            if then_raises:
                raise RuntimeError("cannot reshape tensor of 0 elements")
        return x * 2

    def make_inputs(seed, shape=None):
        assert not runtime.pending, "an error left pending reached the inputs factory"
        return (torch.randn(shape or (4, 8), generator=torch.Generator().manual_seed(seed)),)

    subject = subject_for(kernel, lambda x: x * 2, make_inputs, shapes=[[4, 8]])
    result = registry.get("shapes").check(subject)
    assert result.verdict == "fail", result.message
    expected = "RuntimeError: cannot reshape" if then_raises else "AcceleratorError: CUDA error: invalid argument"
    assert f"kernel raised {expected}" in result.message
    assert not runtime.pending


_BAD_LAUNCH = r"""
#include <torch/extension.h>
__global__ void kgate_noop() {}
torch::Tensor bad_launch(torch::Tensor x) {
    kgate_noop<<<0, 1>>>();  // an empty grid: refused at launch, left pending (no check)
    return x;
}
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device and nvcc")
def test_a_real_pending_launch_error_is_the_kernels(tmp_path, monkeypatch):
    """The same on a GPU, with a real extension whose launch fails and which does not check."""
    from torch.utils.cpp_extension import load_inline

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    ext = load_inline(name="kgate_bad_launch", cpp_sources="torch::Tensor bad_launch(torch::Tensor x);",
                      cuda_sources=_BAD_LAUNCH, functions=["bad_launch"], verbose=False)
    subject = subject_for(lambda x: ext.bad_launch(x), lambda x: x,
                          lambda seed, shape=None, device=None: (torch.ones(4, device=device),), device="cuda")
    with pytest.raises(UserCodeError) as raised:
        subject.run_kernel((torch.ones(4, device="cuda"),))
    # "invalid configuration argument" in older CUDA; "invalid argument" on the H200 (torch 2.11; seen 2026-12-04)
    assert raised.value.role == "kernel" and re.search(r"CUDA error: invalid (configuration )?argument",
                                                        str(raised.value.exc))
    assert context_lost(raised.value) is None  # the context stays usable
    torch.ones(4, device="cuda").add_(1)  # nothing left pending for kgate's own next launch


# --- out of memory in a share: kgate's own caches freed, the gate judged once more ---------------------------

class _NeedsRoom(Gate):
    """A gate whose kernel runs out of device memory while kgate's cached baselines are held (`always`: also
    without them); it counts its judgements."""

    name, summary, tolerance_free = "oracle", "test double", False

    def __init__(self, always=False):
        self.always, self.calls = always, 0

    def check(self, subject):
        self.calls += 1
        crowded = bool(subject._baselines)
        subject.baseline(subject.cases[0])
        if crowded or self.always:
            return self.failed(subject, "kernel raised OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                        "250.00 MiB", case=subject.cases[0])
        return self.passed("fits")


@pytest.mark.parametrize("always", [False, True])
def test_a_gate_that_ran_out_of_memory_beside_kgates_caches_is_judged_once_more_without_them(monkeypatch, always):
    gate = _NeedsRoom(always)
    monkeypatch.setattr(registry, "get", lambda name: gate)
    channel = Channel()
    subject = subject_for(double, double, inputs)
    subject.baseline(subject.cases[0])  # what an earlier gate left cached
    assert run_gates(channel, subject, ["oracle"], None) is None
    result = channel.results()["oracle"]
    assert gate.calls == 2  # once more, never more
    assert result["verdict"] == ("fail" if always else "pass"), result
    first = result["details"]["after_freeing_caches"]
    assert first["verdict"] == "fail" and "out of memory" in first["message"]


def test_a_gate_out_of_memory_with_nothing_cached_is_not_judged_again(monkeypatch):
    class Always(_NeedsRoom):
        def check(self, subject):
            self.calls += 1
            return self.failed(subject, "kernel raised OutOfMemoryError: CUDA out of memory", case=subject.cases[0])

    gate = Always()
    monkeypatch.setattr(registry, "get", lambda name: gate)
    channel = Channel()
    run_gates(channel, subject_for(double, double, inputs), ["oracle"], None)
    assert gate.calls == 1 and "after_freeing_caches" not in channel.results()["oracle"].get("details", {})
