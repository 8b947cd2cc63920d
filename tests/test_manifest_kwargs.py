"""`kwargs:` (keyword arguments bound to the kernel and the reference on every call) and declarative
integer and bool inputs: what the libraries' kernels take besides floating-point tensors (a cross-entropy's
ignore_index and integer targets, a norm's offset, a boolean mask)."""

from __future__ import annotations

import copy
import functools
import json

import pytest
import torch

from kgate.cli import main
from kgate.errors import ManifestError
from kgate.inputs import Case, InputFactory
from kgate.loading import LoadError, bind
from kgate.manifest import load
from kgate.oracle import converted_copy

# A cross-entropy written out (log_softmax, gather, masks) against torch's own, with the arguments Liger's
# and FlagGems' take: ignore_index, label_smoothing and reduction, given only through `kwargs:`.
CE_PY = """
import torch
import torch.nn.functional as F


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    logp = F.log_softmax(logits, dim=-1)
    keep = target != ignore_index
    picked = logp.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    nll = torch.where(keep, -picked, 0.0)
    smooth = torch.where(keep, -logp.sum(-1), 0.0)
    loss = (1 - label_smoothing) * nll + smooth * (label_smoothing / logits.shape[-1])
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / keep.sum()
    return loss


def ignores_ignore_index(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return cross_entropy(logits, target, -100, label_smoothing, reduction)


def ignores_label_smoothing(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return cross_entropy(logits, target, ignore_index, 0.0, reduction)
"""

CE_ENTRY = """\
  - name: {name}
    kernel: ce.py:{kernel}
    reference: torch.nn.functional:cross_entropy
    inputs: [{{shape: [16, 5]}}, {{shape: [16], dtype: int64, low: 0, high: 5}}]
    kwargs: {{ignore_index: 2, label_smoothing: 0.1, reduction: sum}}
"""

# A Gemma-style RMSNorm (weight applied as offset + weight) with its offset and eps as keyword arguments:
# kernel and reference are nn.Modules with the same parameter, so the oracle runs a float64 copy of the
# reference and the backward pass compares the weight's gradient too.
NORM_PY = """
import torch


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x, eps=1e-6, offset=0.0):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + self.weight)


class NormKernel(Norm):
    def forward(self, x, *, eps=1e-6, offset=0.0):
        scale = (x * x).sum(-1, keepdim=True) / x.shape[-1]
        return x / torch.sqrt(scale + eps) * (self.weight + offset)


class NoOffset(Norm):
    def forward(self, x, eps=1e-6, offset=0.0):
        return super().forward(x, eps=eps)


reference = Norm()
kernel = NormKernel()
no_offset = NoOffset()
"""

NORM_ENTRY = """\
  - name: {name}
    kernel: norm.py:{kernel}
    reference: norm.py:reference
    inputs: [{{shape: [4, 8]}}]
    kwargs: {{eps: 1.0e-5, offset: 1.0}}
    backward: true
    gates: [oracle]
"""

# Integer and boolean declarative inputs: an index_add and a masked fill.
INT_PY = """
import torch


def index_add(x, index, source):
    out = x.clone()
    for i in range(index.numel()):
        out[index[i]] += source[i]
    return out


def index_store(x, index, source):
    out = x.clone()
    out[index] += source  # duplicate indices: only one of their sources lands
    return out


def index_add_ref(x, index, source):
    assert index.dtype == torch.int64, index.dtype  # the dtype the manifest declares, at every swept dtype
    return x.index_add(0, index, source)


def masked(x, mask):
    return torch.where(mask, x, 0.0)


def masked_by_product(x, mask):
    return x * mask  # NaN * False is NaN where the reference gives 0


def masked_ref(x, mask):
    assert mask.dtype == torch.bool, mask.dtype
    return x.masked_fill(~mask, 0.0)
"""

INT_ENTRIES = """\
  - name: index-add
    kernel: ints.py:index_add
    reference: ints.py:index_add_ref
    inputs: [{shape: [6, 4]}, {shape: [5], dtype: int64, low: 0, high: 6}, {shape: [5, 4]}]
    dtypes: [float32, float64]
    gates: [contract, oracle, special_values, distributions, input_integrity]
  - name: index-store
    kernel: ints.py:index_store
    reference: ints.py:index_add_ref
    inputs: [{shape: [6, 4]}, {shape: [5], dtype: int64, low: 0, high: 6}, {shape: [5, 4]}]
    dtypes: [float32, float64]
    gates: [distributions]
  - name: masked
    kernel: ints.py:masked
    reference: ints.py:masked_ref
    inputs: [{}, {dtype: bool}]
    shapes: [[3, 5], [33]]
    gates: [contract, oracle, special_values, shapes, layouts, distributions, input_integrity]
  - name: masked-by-product
    kernel: ints.py:masked_by_product
    reference: ints.py:masked_ref
    inputs: [{}, {dtype: bool}]
    shapes: [[3, 5], [33]]
    gates: [special_values]
"""


def run(path, *extra: str) -> tuple[int, dict]:
    out = path.parent / "out"
    code = main(["run", str(path), "--out", str(out), "--device", "cpu", "-q", *extra])
    return code, json.loads((out / "report.json").read_text())


def verdicts(report: dict) -> dict[str, dict[str, str]]:
    return {k["name"]: {g["gate"]: g["verdict"] for g in k["gates"]} for k in report["kernels"]}


def test_kwargs_reach_kernel_reference_and_oracle_in_every_gate(write_manifest, capsys):
    """A correct cross-entropy passes every gate with torch's own as the reference, both called with
    ignore_index=2, label_smoothing=0.1, reduction='sum'; kernels that drop one of them fail."""
    text = "version: 1\nkernels:\n" + CE_ENTRY.format(name="ce", kernel="cross_entropy")
    for name, kernel in (("ce-no-ignore", "ignores_ignore_index"), ("ce-no-smoothing", "ignores_label_smoothing")):
        text += CE_ENTRY.format(name=name, kernel=kernel) + "    gates: [oracle]\n"
    path = write_manifest(text, {"ce.py": CE_PY})
    code, report = run(path)
    found = verdicts(report)
    assert code == 1, capsys.readouterr().out
    assert set(found["ce"].values()) <= {"pass", "skip"} and found["ce"]["oracle"] == "pass", found["ce"]
    for name in ("ce-no-ignore", "ce-no-smoothing"):
        assert found[name] == {"oracle": "fail"}, (name, found[name])
    distributions = next(g for g in report["kernels"][0]["gates"] if g["gate"] == "distributions")
    assert "integer- or boolean-input probe" in distributions["message"], distributions["message"]  # the int64 targets

    # the replay runs a fresh worker from the manifest: the kwargs come with it
    capsys.readouterr()
    assert main(["repro", str(path.parent / "out" / "report.json"), "ce-no-ignore/oracle",
                 "--out", str(path.parent / "repro")]) == 1
    assert "still fails" in capsys.readouterr().out


def test_kwargs_bound_to_modules_reach_the_float64_copy_and_the_backward_pass(write_manifest):
    text = "version: 1\nkernels:\n" + NORM_ENTRY.format(name="norm", kernel="kernel") \
        + NORM_ENTRY.format(name="norm-no-offset", kernel="no_offset")
    code, report = run(write_manifest(text, {"norm.py": NORM_PY}))
    found = verdicts(report)
    assert found["norm"] == {"oracle": "pass", "oracle[backward]": "pass"}, report["kernels"][0]
    assert found["norm-no-offset"] == {"oracle": "fail", "oracle[backward]": "fail"}, found
    assert code == 1


def test_integer_and_bool_inputs_are_made_in_their_dtype_and_probed_as_integers(write_manifest):
    code, report = run(write_manifest("version: 1\nkernels:\n" + INT_ENTRIES, {"ints.py": INT_PY}))
    found = verdicts(report)
    assert set(found["index-add"].values()) == {"pass"}, report["kernels"][0]
    assert set(found["masked"].values()) == {"pass"}, report["kernels"][2]
    assert found["index-store"] == {"distributions": "fail"}, found  # a scatter that stores where it must add
    assert found["masked-by-product"] == {"special_values": "fail"}, found
    assert code == 1


def test_declarative_integer_arguments_follow_the_swept_shape_not_the_swept_dtype(write_manifest):
    inputs = "[{}, {dtype: int32, low: -3, high: 4}, {shape: [2], dtype: bool}, {dtype: uint8}]"
    path = write_manifest(f"version: 1\nkernels:\n  - {{name: a, kernel: k.py:f, reference: k.py:f, inputs: {inputs}}}\n")
    specs = load(path, check_files=False).kernels[0].inputs
    x, idx, flags, small = InputFactory(specs)(Case((3, 5), "float16", 0), torch.device("cpu"))
    assert (x.dtype, idx.dtype, flags.dtype, small.dtype) == (torch.float16, torch.int32, torch.bool, torch.uint8)
    assert idx.shape == (3, 5) and flags.shape == (2,) and small.shape == (3, 5)
    assert int(idx.min()) >= -3 and int(idx.max()) <= 3, idx
    assert int(small.max()) < 10, small  # make_tensor's default range


# -- the manifest's checks -------------------------------------------------------------------------

KERN_PY = """
def kern(x, scale=1.0, *, bias=0.0):
    return x * scale + bias

def ref(x, scale=1.0, bias=0.0, **rest):
    return x * scale + bias

def only_positional(x, scale, /):
    return x * scale
"""

BASE = """\
version: 1
kernels:
  - name: scaled
    kernel: k.py:kern
    reference: k.py:ref
    inputs: [{shape: [4]}]
"""


@pytest.mark.parametrize("extra, key, message, hint", [
    ("    kwargs: {ignore-index: 1}\n", "kernels[0].kwargs.ignore-index",
     "keyword argument name 'ignore-index' is not a Python identifier", "ignore_index"),
    ("    kwargs: {lambda: 1}\n", "kernels[0].kwargs.lambda", "keyword argument name 'lambda' is a Python keyword",
     None),
    ("    kwargs: {x: 1.0}\n", "kernels[0].kwargs.x",
     "keyword argument 'x' is also argument 0 of the kernel k.py:kern(x, scale, bias), which the declarative input 0 "
     "fills by position", "drop 'x' from kwargs or input 0 from inputs"),
    ("    kwargs: {scael: 2.0}\n", "kernels[0].kwargs.scael", "the kernel k.py:kern(x, scale, bias) takes no keyword "
     "argument 'scael'", "did you mean 'scale'?"),
    ("    kwargs: {scale: {a: 1}}\n", "kernels[0].kwargs.scale", "expected ", None),
    ("    kwargs: {scale: 1e-5}\n", "kernels[0].kwargs.scale", "keyword argument 'scale': '1e-5' is read as text",
     "write 1.0e-5"),
    ("    kwargs: {scale: [1, -inf]}\n", "kernels[0].kwargs.scale", "keyword argument 'scale': '-inf' is read as text",
     "write -.inf"),
    ("    inputs: [{shape: [4], dtype: int64, low: 0.5}]\n", "kernels[0].inputs[0]",
     "low 0.5 of an argument of dtype int64 is not a whole number", "write low: 0"),
    ("    inputs: [{shape: [4], dtype: bool, high: 1}]\n", "kernels[0].inputs[0]", "a bool argument takes no high",
     None),
    ("    inputs: [{shape: [4], dtype: uint8, low: -1}]\n", "kernels[0].inputs[0]",
     "low -1 is outside what uint8 holds (0 to 255)", None),
    ("    inputs: [{shape: [4], dtype: int8, low: 10}]\n", "kernels[0].inputs[0]",
     "empty range: low 10 >= high 10", "give both"),
    ("    inputs: [{shape: [4], dtype: uint16}]\n", "kernels[0].inputs[0].dtype",
     "integer dtype 'uint16': declarative arguments are made in", "int8, int16, int32, int64, uint8, bool"),
])
def test_bad_kwargs_and_integer_inputs_are_manifest_problems(write_manifest, extra, key, message, hint):
    text = BASE.replace("    inputs: [{shape: [4]}]\n", "") + ("" if "inputs:" in extra else "    inputs: [{shape: [4]}]\n")
    path = write_manifest(text + extra, {"k.py": KERN_PY})
    with pytest.raises(ManifestError) as info:
        load(path)
    p, *more = info.value.problems
    assert all(other.key == key for other in more), info.value.problems  # the reference's, for the same name
    assert p.key == key and p.message.startswith(message), p.format()
    assert p.line == (7 if "kwargs" in extra else 6), p.format()
    assert hint is None or hint in (p.hint or ""), p.format()


def test_kwargs_in_defaults_say_where_they_go_and_exit_2(write_manifest, tmp_path, capsys):
    text = BASE.replace("kernels:", "defaults:\n  kwargs: {scale: 2.0}\nkernels:")
    path = write_manifest(text, {"k.py": KERN_PY})
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "kgate.yaml:3:3: error [defaults.kwargs]: unknown key 'kwargs'" in err, err
    assert "set per kernel" in err and "kwargs: *ce" in err, err


def test_positional_only_parameters_cannot_be_given_by_keyword(write_manifest):
    path = write_manifest(BASE.replace("k.py:kern", "k.py:only_positional") + "    kwargs: {scale: 2.0}\n",
                          {"k.py": KERN_PY})
    with pytest.raises(ManifestError) as info:
        load(path)
    (p,) = info.value.problems
    assert p.key == "kernels[0].kwargs.scale" and "takes 'scale' by position only" in p.message, p.format()


def test_a_def_rebound_later_is_left_to_the_worker(write_manifest):
    """`kern = some_wrapper(kern)` (even inside an `if`) may change the signature: the manifest cannot read it."""
    for rebind in ("kern = wrap(kern)\n", "if True:\n    kern = wrap(kern)\n", "from elsewhere import kern\n"):
        text = BASE.replace("k.py:ref", "k.py:kern") + "    kwargs: {scael: 2.0}\n"
        assert load(write_manifest(text, {"k.py": KERN_PY + rebind})).kernels[0].kwargs == {"scael": 2.0}


def test_good_kwargs_resolve_with_their_python_types(write_manifest):
    extra = "    kwargs: {scale: 2, bias: .inf, mode: sum, flag: true, none: null, sizes: [1, 2.5, .nan]}\n"
    text = BASE.replace("k.py:kern", "k.py:ref") + extra
    kernel = load(write_manifest(text, {"k.py": KERN_PY})).kernels[0]
    kwargs = kernel.kwargs
    assert [type(kwargs[k]) for k in ("scale", "bias", "mode", "flag")] == [int, float, str, bool]
    assert kwargs["none"] is None and kwargs["bias"] == float("inf") and kwargs["sizes"][2] != kwargs["sizes"][2]
    assert kernel.kernel.kwargs == kernel.reference.kwargs == kwargs


# -- binding -----------------------------------------------------------------------------------------

def _scaled(x, scale=1.0):
    return x * scale


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, x, scale=1.0):
        return x * self.weight * scale


def test_bind_keeps_what_finds_a_callable_through_it():
    bound = bind(_scaled, {"scale": 3.0}, "the kernel k.py:_scaled")
    assert float(bound(torch.ones(1))) == 3.0
    assert bound.__module__ == __name__ and bound.__wrapped__ is _scaled and bound.__name__ == "_scaled"

    module = _Scaled()
    assert bind(module, {"scale": 2.0}, "the reference") is module  # still the module: parameters, dtype copies
    assert module(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    double = converted_copy(module, device=torch.device("cpu"), dtype=torch.float64)  # the oracle's copy
    assert double(torch.ones(3, dtype=torch.float64)).tolist() == [2.0, 2.0, 2.0]
    assert copy.deepcopy(module)(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]


def test_bind_refuses_a_name_the_signature_does_not_take():
    """What the manifest cannot read (a decorated function, a module's forward) is checked on import."""
    with pytest.raises(LoadError, match=r"the kernel k.py:k takes no keyword argument 'scael'.*takes scale, x by keyword"):
        bind(functools.wraps(_scaled)(lambda *a, **k: _scaled(*a, **k)), {"scael": 1}, "the kernel k.py:k")
    with pytest.raises(LoadError, match="takes no keyword argument 'eps'"):
        bind(_Scaled(), {"eps": 1e-6}, "the reference")
    assert bind(print, {"sep": ""}, "the kernel")  # no signature to read: its own call says


def test_the_sanitizers_subprocess_calls_the_kernel_with_the_kwargs(write_manifest, capsys):
    """kgate.gates.bounds runs the kernel once more in a process of its own (under compute-sanitizer): it
    imports the kernel as the worker does, so the kwargs come with it."""
    from kgate.gates import bounds as bounds_module

    kernel = "def kern(x, *, scale):\n    print('kernel ran with scale', scale)\n    return x * scale\n"
    path = write_manifest(BASE.replace("k.py:ref", "k.py:kern") + "    kwargs: {scale: 3}\n", {"k.py": kernel})
    job = path.parent / "job.json"
    job.write_text(json.dumps({"manifest": str(path), "kernel": "scaled", "device": "cpu",
                               "case": {"shape": None, "dtype": "float32", "seed": 0}}))
    assert bounds_module._sanitize_main(str(job)) == 0
    assert "kernel ran with scale 3" in capsys.readouterr().out
