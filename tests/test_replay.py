"""kgate/replay.py: the torch operators a call ran, recorded with their tensors' metadata and run again."""

from __future__ import annotations

import json

import pytest
import torch

from kgate import replay


def _chunked_matmul(x, w):
    """Logits in chunks through torch (as Liger's fused linear cross-entropy), then a plain Python step."""
    chunks = [c @ w.t() for c in x.split(2)]
    return torch.cat(chunks).float().sum(-1), len(chunks)


def test_a_call_is_recorded_with_each_operators_tensor_metadata(tmp_path):
    x, w = torch.randn(6, 4), torch.randn(5, 4)
    out, n = replay.record(_chunked_matmul, (x, w), tmp_path / "ops.json", device_type="cpu")
    assert n == 3 and torch.allclose(out, (x @ w.t()).sum(-1))
    data = json.loads((tmp_path / "ops.json").read_text())
    ops = [entry["op"] for entry in data["ops"]]
    assert "aten.mm.default" in ops and "aten.cat.default" in ops
    mms = [entry for entry in data["ops"] if entry["op"] == "aten.mm.default"]  # a chunk each, at its offset
    assert [mm["args"][0]["offset"] for mm in mms] == [0, 8, 16]
    assert all(mm["args"][1] == {"tensor": [4, 5], "stride": [1, 4], "offset": 0, "dtype": "float32",
                                 "device": "cpu"} for mm in mms)  # the transposed weight, as cuBLAS was given it
    assert "float32_matmul_precision" in data["settings"]


def test_only_the_device_asked_for_is_recorded(tmp_path):
    replay.record(_chunked_matmul, (torch.randn(6, 4), torch.randn(5, 4)), tmp_path / "ops.json")
    assert json.loads((tmp_path / "ops.json").read_text())["ops"] == []  # no CUDA tensor in the call


def test_the_record_is_written_when_the_call_raises(tmp_path):
    def fails(x):
        torch.mm(x, x)
        raise RuntimeError("the kernel's own error")

    with pytest.raises(RuntimeError, match="own error"):
        replay.record(fails, (torch.randn(3, 3),), tmp_path / "ops.json", device_type="cpu")
    assert [e["op"] for e in json.loads((tmp_path / "ops.json").read_text())["ops"]] == ["aten.mm.default"]


def test_a_replay_runs_the_recorded_operators_on_fresh_tensors_of_the_same_layout(tmp_path, monkeypatch):
    replay.record(_chunked_matmul, (torch.randn(6, 4), torch.randn(5, 4)), tmp_path / "ops.json", device_type="cpu")
    seen = []
    real_mm = torch.ops.aten.mm.default

    class Spy:
        def __call__(self, a, b):
            seen.append((tuple(a.shape), a.stride(), tuple(b.shape), b.stride()))
            return real_mm(a, b)

    monkeypatch.setattr(replay, "operator", lambda name, real=replay.operator: Spy() if name == "aten.mm.default"
                        else real(name))
    assert replay.replay(tmp_path / "ops.json") >= 2
    assert seen == [((2, 4), (4, 1), (4, 5), (1, 4))] * 3


def test_a_repeated_operator_call_is_recorded_once(tmp_path):
    x = torch.randn(3, 3)
    replay.record(lambda a: [a @ a for _ in range(5)], (x,), tmp_path / "ops.json", device_type="cpu")
    assert [e["op"] for e in json.loads((tmp_path / "ops.json").read_text())["ops"]] == ["aten.mm.default"]


def test_a_forged_record_runs_nothing_but_atens_operators(tmp_path):
    """The record comes from the process that ran the candidate: a name outside torch.ops.aten is passed over,
    as is an argument the record format does not hold; an unreadable record replays nothing."""
    tensor = {"tensor": [2], "stride": [1], "offset": 0, "dtype": "float32", "device": "cpu"}
    (tmp_path / "ops.json").write_text(json.dumps({"ops": [
        {"op": "builtins.eval.default", "args": ["1"], "kwargs": {}},
        {"op": "os.system", "args": ["true"], "kwargs": {}},
        {"op": "aten.add.Tensor", "args": [tensor, {"pickle": "x"}], "kwargs": {}},
        {"op": "aten.add.Tensor", "args": [tensor, tensor], "kwargs": {}}]}))
    assert replay.replay(tmp_path / "ops.json") == 1
    with pytest.raises(ValueError, match="not an ATen operator"):
        replay.operator("builtins.eval.default")
    (tmp_path / "bad.json").write_text("not json")
    assert replay.replay(tmp_path / "bad.json") == 0
    assert replay.replay(tmp_path / "missing.json") == 0


def test_expanded_and_offset_views_and_integer_indices_replay():
    base = replay.decode({"tensor": [3, 4], "stride": [0, 1], "offset": 2, "dtype": "float16", "device": "cpu"})
    assert base.shape == (3, 4) and base.stride() == (0, 1) and base.storage_offset() == 2
    index = replay.decode({"tensor": [5], "stride": [1], "offset": 0, "dtype": "int64", "device": "cpu"})
    assert index.dtype == torch.int64 and int(index.abs().sum()) == 0  # a valid index into any non-empty dim
    empty = replay.decode({"tensor": [0, 3], "stride": [3, 1], "offset": 0, "dtype": "float32", "device": "cpu"})
    assert empty.shape == (0, 3)
    assert replay.decode([{"float": "inf"}, {"dtype": "bfloat16"}, {"enum": "contiguous_format"}]) == \
        [float("inf"), torch.bfloat16, torch.contiguous_format]


def test_the_matmul_settings_the_isolation_gate_reads_are_recorded_and_set_again():
    from kgate.replay import MATMUL_SETTINGS, _apply, settings

    matmul = torch.backends.cuda.matmul
    before = settings()
    present = [name for name in MATMUL_SETTINGS if name in before]
    assert "allow_tf32" in present and "allow_fp16_reduced_precision_reduction" in present
    flipped = dict(before, allow_fp16_reduced_precision_reduction=not before["allow_fp16_reduced_precision_reduction"])
    try:
        _apply(flipped)
        assert matmul.allow_fp16_reduced_precision_reduction is flipped["allow_fp16_reduced_precision_reduction"]
        assert settings()["allow_fp16_reduced_precision_reduction"] is flipped["allow_fp16_reduced_precision_reduction"]
    finally:
        _apply(before)
    assert settings() == before
