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
from kgate.faults import context_lost, fault_message
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
    assert run_gates(channel, subject_for(double, double, inputs), ["oracle", "determinism"], None) == ILLEGAL
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
    assert run_gates(channel, subject, ["oracle", "determinism"], None) == ILLEGAL
    result = channel.results()["oracle"]
    assert result["message"] == fault_message(ILLEGAL, "inputs factory")
    assert "inputs factory raised" not in result["message"]
    assert "determinism" not in channel.results()


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
