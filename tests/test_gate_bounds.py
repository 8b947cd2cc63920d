"""bounds: reads and writes outside a tensor are caught through guard bands; the sanitizer path is
tested with stand-in executables (the real compute-sanitizer needs a GPU)."""

from __future__ import annotations

import json
import os
import stat
import textwrap
import time

import pytest
import torch

from kgate.gates import bounds as bounds_module
from kgate.gates.bounds import Bounds, guard_args
from kgate.gates.initialization import NAN_BYTE, SENTINEL_BYTE
from kgate.inputs import Case
from tests.gate_harness import check, subject_for


def rows(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (5, 33), generator=gen, dtype=torch.float64).to(dtype),)


def whole_storage(t):
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def test_reading_past_the_tensor_fails():
    result = check("bounds", lambda x: whole_storage(x).sum(), lambda x: x.sum(), rows)
    assert result.verdict == "fail" and result.tolerance_free
    assert result.message.startswith("out-of-bounds read")


def test_writing_past_an_inplace_argument_fails():
    def halve_storage(x):
        whole_storage(x).mul_(0.5)
        return x

    result = check("bounds", halve_storage, lambda x: x.mul_(0.5), rows, inplace=[0])
    assert result.verdict == "fail" and result.message.startswith("out-of-bounds write")
    assert result.where == "argument 0 (declared in-place)"


def test_writing_past_an_allocated_output_fails():
    def overrun(x):
        out = torch.empty(x.numel(), dtype=x.dtype)
        whole_storage(out)[: out.numel() + 3].fill_(0.0)  # a store without a tail mask
        out.copy_(x.reshape(-1))
        return out.reshape(x.shape)

    result = check("bounds", overrun, lambda x: x.clone(), rows)
    assert result.verdict == "fail" and "allocated with torch.empty" in result.where


@pytest.mark.parametrize("inplace", [False, True])
def test_kernels_that_stay_inside_pass(inplace):
    if inplace:
        result = check("bounds", lambda x: x.mul_(0.5), lambda x: x.mul_(0.5), rows, inplace=[0])
    else:
        result = check("bounds", lambda x: torch.softmax(x, -1), lambda x: torch.softmax(x, -1), rows)
    assert result.verdict == "pass", result.message
    assert "compute-sanitizer: skipped (not a CUDA run)" in result.message


def _at_input_strides(x):
    """Stores into a new dense output at the input's strides (FlagGems' scatter into a non-dense input)."""
    out = torch.empty(x.shape, dtype=x.dtype)
    whole_storage(out).as_strided(x.shape, x.stride(), out.storage_offset()).copy_(x * 0.5)
    return out


def _at_own_strides(x):
    out = torch.empty(x.shape, dtype=x.dtype)
    out.copy_(x * 0.5)
    return out


def test_a_write_past_an_output_that_only_strided_inputs_cause_fails():
    result = check("bounds", _at_input_strides, lambda x: x * 0.5, rows)
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert result.message.startswith("out-of-bounds write with every tensor argument at every other element "
                                     "(argument 0 strides (66, 2), offset 0)"), result.message
    assert "allocated with torch.empty" in result.where


def test_an_output_written_at_its_own_strides_passes_with_strided_inputs():
    result = check("bounds", _at_own_strides, lambda x: x * 0.5, rows)
    assert result.verdict == "pass", result.message


def test_strided_inputs_the_reference_rejects_are_not_tried():
    def contiguous_only(x):
        if not x.is_contiguous():
            raise ValueError("expects a contiguous tensor")
        return x * 0.5

    result = check("bounds", _at_input_strides, contiguous_only, rows)
    assert result.verdict == "pass" and "strided inputs not tried (the reference rejects them)" in result.message


def test_strided_arguments_keep_their_strides_inside_the_guard():
    x = torch.randn(4, 6)[:, ::2]
    (guarded,), [(index, g)] = guard_args((x,), NAN_BYTE, set())
    assert index == 0 and guarded.stride() == x.stride() and torch.equal(guarded, x)
    assert guarded.storage_offset() == g.guard


def test_nondeterministic_kernel_is_not_called_an_out_of_bounds_reader():
    def jitter(x):
        return x.sum() + 1e-3 * torch.rand(())

    result = check("bounds", jitter, lambda x: x.sum(), rows)
    assert result.verdict == "pass" and "not deterministic" in result.message


# --- compute-sanitizer ---------------------------------------------------------------------------------


class _CudaSubject:
    """Enough of a Subject for Bounds.sanitize, pretending to be on a GPU."""

    def __init__(self, manifest):
        self.device = torch.device("cuda")
        self.name = "k"
        self.entry = type("E", (), {"manifest": type("M", (), {"path": manifest})()})()


def _fake_sanitizer(folder, output, code):
    exe = folder / "compute-sanitizer"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {code}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@pytest.fixture
def manifest(tmp_path):
    path = tmp_path / "kgate.yaml"
    path.write_text("version: 1\nkernels: []\n")
    return path


def test_sanitizer_not_installed_is_skipped_with_reason(monkeypatch, tmp_path, manifest):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv("KGATE_SANITIZER", raising=False)
    info = Bounds().sanitize(_CudaSubject(manifest), Case(None, "float32", 0))
    assert info["errors"] == [] and "not installed" in info["note"]


def test_sanitizer_can_be_turned_off(monkeypatch, manifest):
    monkeypatch.setenv("KGATE_SANITIZER", "0")
    info = Bounds().sanitize(_CudaSubject(manifest), Case(None, "float32", 0))
    assert "KGATE_SANITIZER=0" in info["note"]


def test_sanitizer_errors_fail_and_clean_runs_pass(monkeypatch, tmp_path, manifest):
    monkeypatch.delenv("KGATE_SANITIZER", raising=False)
    monkeypatch.setenv("KGATE_SANITIZER_TOOLS", "memcheck")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    _fake_sanitizer(bin_dir, textwrap.dedent("""\
        ========= Invalid __global__ write of size 4 bytes
        =========     at _halve+0x1d0
        ========= ERROR SUMMARY: 1 error"""), 86)
    info = Bounds().sanitize(_CudaSubject(manifest), Case(None, "float32", 0))
    assert info["ran"] == ["memcheck"] and info["errors"][0]["count"] == 1
    assert "memcheck reported errors" in info["note"] and "memcheck clean" not in info["note"]
    assert "Invalid __global__ write" in info["errors"][0]["first"]
    _fake_sanitizer(bin_dir, "========= ERROR SUMMARY: 0 errors", 0)
    info = Bounds().sanitize(_CudaSubject(manifest), Case(None, "float32", 0))
    assert info["errors"] == [] and "memcheck clean" in info["note"]


# racecheck on one H100 (the field run of Liger's fused linear cross-entropy, which calls torch.matmul): every
# hazard inside cuBLAS's own Hopper kernel
_RACE_IN_CUBLAS = "\n".join(["========= COMPUTE-SANITIZER"] + [
    "========= Error: Race reported between Read access at nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT+0xa50\n"
    "=========     and Write access at nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT+0x45c0 [504 hazards]\n"
    "========= "] * 5 + ["========= RACECHECK SUMMARY: 5 hazards displayed (5 errors, 0 warnings)"])
_NO_RACE = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"


def _sanitize_both(monkeypatch, tmp_path, manifest, kernel_output, reference_output, tool="racecheck",
                   replay_output=_NO_RACE, record_exit=0):
    """Bounds.sanitize with a stand-in compute-sanitizer that prints `kernel_output` over the kernel's call,
    `reference_output` over the reference's and `replay_output` over the replay of the torch operators the kernel
    called (the job file, its last argument, says which); the recording call, outside the sanitizer, exits
    `record_exit`."""
    import kgate.sandbox

    monkeypatch.setattr(kgate.sandbox, "kgate_command",
                        lambda module, *args, **_: ["sh", "-c", f"exit {record_exit}", *args])
    monkeypatch.delenv("KGATE_SANITIZER", raising=False)
    monkeypatch.setenv("KGATE_SANITIZER_TOOLS", tool)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    exe = bin_dir / "compute-sanitizer"
    exe.write_text("#!/bin/sh\nfor last; do :; done\n"
                   "if grep -q '\"call\": \"reference\"' \"$last\"; then\n"
                   f"cat <<'EOF'\n{reference_output}\nEOF\n"
                   "elif grep -q '\"call\": \"replay\"' \"$last\"; then\n"
                   f"cat <<'EOF'\n{replay_output}\nEOF\n"
                   f"else\ncat <<'EOF'\n{kernel_output}\nEOF\nfi\nexit 86\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return Bounds().sanitize(_CudaSubject(manifest), Case(None, "float32", 0))


def test_a_race_report_in_a_kernel_the_reference_runs_into_too_is_the_platforms_and_noted(
        monkeypatch, tmp_path, manifest):
    info = _sanitize_both(monkeypatch, tmp_path, manifest, _RACE_IN_CUBLAS, _RACE_IN_CUBLAS)
    assert info["errors"] == [], info
    assert "5 hazard(s)" in info["note"] and "nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT" in info["note"]
    assert "the platform's" in info["note"]


def test_a_race_report_in_a_kernel_torchs_own_operators_reach_too_is_the_platforms(monkeypatch, tmp_path, manifest):
    """Liger's fused linear cross-entropy multiplies chunks of the logits with torch.matmul: cuBLAS picks another
    kernel for the chunks than for the reference's whole product, so the reference's report is clean; the
    replay of the torch operators the kernel called reaches the same kernel and sites."""
    info = _sanitize_both(monkeypatch, tmp_path, manifest, _RACE_IN_CUBLAS, _NO_RACE, replay_output=_RACE_IN_CUBLAS)
    assert info["errors"] == [], info
    assert "torch's operators reach as well" in info["note"] and "the platform's" in info["note"]
    other = _RACE_IN_CUBLAS.replace("+0xa50", "+0x1f0")  # a racy kernel of its own under the library's name
    info = _sanitize_both(monkeypatch, tmp_path, manifest, other, _NO_RACE, replay_output=_RACE_IN_CUBLAS)
    assert [e["tool"] for e in info["errors"]] == ["racecheck"], info
    assert set(info["errors"][0]["baselines"]) == {"reference", "replay"}  # kept for whoever reads the failure
    assert "0 hazards" in info["errors"][0]["baselines"]["reference"]
    # a recording call that fails gives no replay: the report counts
    info = _sanitize_both(monkeypatch, tmp_path, manifest, _RACE_IN_CUBLAS, _NO_RACE, replay_output=_RACE_IN_CUBLAS,
                          record_exit=1)
    assert [e["tool"] for e in info["errors"]] == ["racecheck"], info
    assert set(info["errors"][0]["baselines"]) == {"reference"}


@pytest.mark.parametrize("case", ["reference clean", "same name other code", "own kernel", "one of them its own",
                                  "not all displayed", "memcheck"])
def test_a_report_the_reference_does_not_share_or_not_wholly_seen_still_fails(monkeypatch, tmp_path, manifest,
                                                                                case):
    """A library's kernel name is no excuse by itself ("reference clean": a racy kernel named after cuBLAS's, as
    an author who read kgate's source might try); nor is a report of which some hazards were not printed."""
    output, reference, tool = _RACE_IN_CUBLAS, _RACE_IN_CUBLAS, "racecheck"
    if case == "reference clean":
        reference = _NO_RACE
    elif case == "same name other code":  # a racy kernel of its own under the name of the library's that races
        output = output.replace("+0xa50", "+0x1f0")
    elif case == "own kernel":
        output = output.replace("nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT", "_rms_norm_forward_kernel")
    elif case == "one of them its own":
        output = output.replace("Write access at nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT",
                                "Write access at _chunked_softmax", 1)
    elif case == "not all displayed":  # hazards past the print limit could lie anywhere
        output = output.replace("(5 errors", "(16 errors")
    else:  # a bad argument can make a library's kernel access memory out of bounds
        output = reference = textwrap.dedent("""\
            ========= Invalid __global__ read of size 16 bytes
            =========     at nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT+0xa50
            ========= ERROR SUMMARY: 1 error""")
        tool = "memcheck"
    info = _sanitize_both(monkeypatch, tmp_path, manifest, output, reference, tool)
    assert [e["tool"] for e in info["errors"]] == [tool], info
    assert info["errors"][0]["count"] == (16 if case == "not all displayed" else 1 if tool == "memcheck" else 5)


def test_sanitizer_subprocess_entry_point_runs_the_kernel(tmp_path, capsys):
    (tmp_path / "k.py").write_text(textwrap.dedent("""\
        import torch
        def make(seed, dtype=torch.float32):
            return (torch.ones(3, dtype=dtype),)
        def ref(x):
            print("reference ran on", x.device)
            return x * 2
        def kern(x):
            print("kernel ran on", x.device)
            return x * 2
        """))
    (tmp_path / "kgate.yaml").write_text("version: 1\nkernels:\n  - {name: k, kernel: k.py:kern, "
                                         "reference: k.py:ref, inputs: k.py:make}\n")
    job = tmp_path / "job.json"
    job.write_text('{"manifest": "%s", "kernel": "k", "device": "cpu", "case": {"shape": null, '
                   '"dtype": "float32", "seed": 0}}' % (tmp_path / "kgate.yaml"))
    assert bounds_module._sanitize_main(str(job)) == 0
    assert capsys.readouterr().out == "kernel ran on cpu\n"
    job.write_text(job.read_text()[:-1] + ', "call": "reference"}')  # the baseline run calls the reference alone
    assert bounds_module._sanitize_main(str(job)) == 0
    assert capsys.readouterr().out == "reference ran on cpu\n"
    # the recording call runs the kernel once more and writes the torch operators it ran on CUDA tensors
    job.write_text(job.read_text()[:-1] + ', "call": "record", "ops": "%s"}' % (tmp_path / "recorded.json"))
    assert bounds_module._sanitize_main(str(job)) == 0
    assert capsys.readouterr().out == "kernel ran on cpu\n"
    assert json.loads((tmp_path / "recorded.json").read_text())["ops"] == []  # none on CUDA here
    # the replay runs torch's operators from the record alone: the manifest's code is never loaded
    (tmp_path / "ops.json").write_text('{"ops": [{"op": "aten.mul.Tensor", "args": [{"tensor": [3], "stride": [1], '
                                       '"offset": 0, "dtype": "float32", "device": "cpu"}, 2.0], "kwargs": {}}]}')
    (tmp_path / "k.py").write_text("raise SystemExit('the candidate was imported')\n")
    job.write_text(job.read_text()[:-1] + ', "call": "replay", "ops": "%s"}' % (tmp_path / "ops.json"))
    assert bounds_module._sanitize_main(str(job)) == 0
    assert capsys.readouterr().out == ""


def test_gate_on_cpu_never_calls_the_sanitizer(monkeypatch):
    called = []
    monkeypatch.setattr(bounds_module.subprocess, "run", lambda *a, **k: called.append(a))
    subject = subject_for(lambda x: x + 1, lambda x: x + 1, rows)
    assert Bounds().check(subject).verdict == "pass" and not called


def test_tensors_the_kernel_resizes_or_repoints_are_not_misjudged():
    def grow(x):
        out = torch.empty(2, dtype=x.dtype)
        out.resize_(x.numel())  # grows into what was the guard band: no longer judged
        out.copy_(x.reshape(-1))
        staging = torch.empty(0, dtype=x.dtype).set_(out.untyped_storage(), out.storage_offset(), out.shape)
        return staging.reshape(x.shape) * 2

    result = check("bounds", grow, lambda x: x * 2, rows)
    assert result.verdict == "pass", result.message


@pytest.mark.slow
def test_triton_store_without_mask_is_caught_in_the_interpreter(tmp_path):
    """The catalogue's CUDA control, run on the CPU in Triton's interpreter with only the bounds gate
    (where the overrun lands in a guard band; unguarded, it would write into malloc's heap)."""
    from kgate.manifest import load
    from kgate.runner import Runner, RunOptions
    from tests.conftest import ROOT

    manifest = load(ROOT / "gates" / "kgate.yaml")
    kernels = [manifest.by_name("bounds-cuda-violating-unmasked-store"),
               manifest.by_name("bounds-cuda-correct-masked-store")]
    results = Runner(manifest, kernels, RunOptions(gates=["bounds"], device="cpu", out_dir=tmp_path)).run()
    bad, good = (r.gates[0] for r in results)
    assert bad.verdict == "fail" and "past its last element" in bad.message
    assert "torch.empty_like" in bad.where
    assert good.verdict == "pass", good.message


def test_a_kernel_with_few_distinct_results_is_not_called_an_out_of_bounds_reader(tmp_path):
    """The demo's softmax_atomic_order sums in an order drawn per call; at 1 x 128 it has few distinct
    results, and with the generator where the distributions gate left it, the one extra run the gates made
    matched the first by chance: bounds (and initialization) called it an out-of-bounds reader."""
    from kgate.cli import main
    from kgate.report import Report

    demo = str(bounds_module.Path(__file__).resolve().parents[1] / "examples" / "kgate.yaml")
    main(["run", demo, "-q", "-k", "softmax-atomic-order", "--device", "cpu", "--json", str(tmp_path / "r.json"),
          "--out", str(tmp_path / "o"), "--gate", "distributions,bounds,initialization"])
    [kernel] = Report.read(tmp_path / "r.json").kernels
    verdicts = {g.gate: (g.verdict, g.message) for g in kernel.gates}
    assert verdicts["bounds"][0] == "pass" and "not deterministic" in verdicts["bounds"][1], verdicts
    assert verdicts["initialization"][0] == "pass", verdicts


@pytest.mark.parametrize("script, follows", [
    ({NAN_BYTE: ["a"] * 3, SENTINEL_BYTE: ["b"] * 3}, True),          # each filling its own result: read
    ({NAN_BYTE: ["a", "a"], SENTINEL_BYTE: ["a"]}, False),            # a filling gives the other's result
    ({NAN_BYTE: ["a"], SENTINEL_BYTE: ["c"]}, False),                 # one filling, two results
    ({NAN_BYTE: ["a", "a", "a"], SENTINEL_BYTE: ["b", "b", "d"]}, False),  # late, still chance
])
def test_outputs_follow_the_filling_only_when_every_run_of_each_filling_agrees(script, follows):
    from kgate.gates.initialization import follows_filling

    value = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    calls = {NAN_BYTE: iter(script[NAN_BYTE]), SENTINEL_BYTE: iter(script[SENTINEL_BYTE])}

    def run(byte):
        return [("out", torch.tensor([value[next(calls[byte])]]))]

    assert follows_filling(run, [("out", torch.tensor([1.0]))], [("out", torch.tensor([2.0]))]) is follows



def test_a_report_left_without_baseline_time_counts(monkeypatch, tmp_path, manifest):
    """The sanitizer budget spent by the kernel's own run: no baseline is run, and the report counts."""
    monkeypatch.setattr(bounds_module, "SANITIZER_BUDGET_S", 5.3)
    real_run = bounds_module.subprocess.run

    def slow(*args, **kwargs):  # the tool's run takes half a second, leaving under 5 s of the budget
        time.sleep(0.5)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(bounds_module.subprocess, "run", slow)
    info = _sanitize_both(monkeypatch, tmp_path, manifest, _RACE_IN_CUBLAS, _RACE_IN_CUBLAS)
    assert [e["tool"] for e in info["errors"]] == ["racecheck"], info
