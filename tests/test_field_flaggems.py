"""FlagGems 5.0.2 in the field manifests (examples/field/flaggems, docs/field/flaggems.md).

FlagGems needs a GPU to import (its device detection knows no CPU vendor), so the CPU run judges
nothing of it: every gate of every kernel of cpu.yaml ends in `error` with FlagGems' own message, as
the doc's CPU table says; the run is pinned here so that the day FlagGems runs on the CPU this test
says the doc is stale. The GPU manifest is checked without a GPU: it loads as `kgate run` loads it,
every kernel, reference and factory it names imports, the factories make inputs in the op's domain at
the declared shapes, the references accept them, and every FlagGems function a wrapper calls exists in
the installed FlagGems with the arguments the wrapper passes (read from its source: importing it needs
a GPU).
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from kgate import manifest
from kgate.loading import resolve
from kgate.names import GATE_NAMES, phase_ids

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "field" / "flaggems"
GPU = FOLDER / "kgate.yaml"
CPU = FOLDER / "cpu.yaml"
NO_DEVICE = "No device were detected on your machine"

# The CPU run, as docs/field/flaggems.md's CPU table says: FlagGems cannot import without a GPU, so every
# gate that calls the kernel is `error` naming FlagGems' message (finding "FlagGems needs a GPU to
# import"); the exceptions, gates that skip before calling the kernel, are listed here.
CPU_SKIPPED = {
    # a pointwise op: the reference has no reduction whose accumulator kgate could emulate
    ("gems-exp", "accumulation"),
}


def _gems_source() -> Path:
    """The installed FlagGems package folder, found without importing it (its import needs a GPU)."""
    spec = importlib.util.find_spec("flag_gems")
    assert spec is not None and spec.submodule_search_locations, (
        "flag_gems is not installed: `pip install --no-deps -r examples/field/flaggems/requirements.txt`")
    return Path(list(spec.submodule_search_locations)[0])


@pytest.mark.timeout(120)
def test_flaggems_manifests_load_and_every_name_imports():
    loaded = {path: manifest.load(path) for path in (GPU, CPU)}
    for path, m in loaded.items():
        assert m.kernels, f"{path}: no kernels"
        for k in m.kernels:
            for role in ("kernel", "reference", "inputs"):
                fn = resolve(getattr(k, role), role, m.base)
                assert callable(fn), f"{path.name}: {k.name}.{role} = {getattr(k, role).text} is not callable"
    gpu = {k.name: k for k in loaded[GPU].kernels}
    assert len(gpu) >= 30, f"kgate.yaml lists {len(gpu)} FlagGems ops, the field manifest needs at least 30"
    for k in loaded[CPU].kernels:  # the CPU subset judges the GPU manifest's kernels, not twins
        assert k.name in gpu, f"cpu.yaml's {k.name} is not in kgate.yaml"
        for key in ("kernel", "reference", "inputs", "backward"):
            assert getattr(k.entry, key) == getattr(gpu[k.name].entry, key), (
                f"cpu.yaml's {k.name}.{key} = {getattr(k.entry, key)!r}, "
                f"kgate.yaml's = {getattr(gpu[k.name].entry, key)!r}")
    for name, k in gpu.items():  # the GPU manifest: the GPU, never the CPU fallback
        assert k.device == "cuda", f"kgate.yaml's {name} is judged on {k.device!r}, expected cuda"


@pytest.mark.timeout(120)
def test_flaggems_factories_make_inputs_the_references_accept():
    """Every factory of kgate.yaml at its smallest declared shape, float64 on the CPU: the reference runs,
    its output is finite (the factories draw inside each op's domain: positive bases and arguments,
    in-range indices, distinct scatter columns), and a training op's reference has finite gradients."""
    loaded = manifest.load(GPU)
    for k in loaded.kernels:
        factory = resolve(k.inputs, "inputs", loaded.base)
        reference = resolve(k.reference, "reference", loaded.base)
        shape = min(k.shapes, key=lambda s: torch.Size(s).numel())
        args = factory(0, shape=shape, dtype=torch.float64, device=torch.device("cpu"))
        assert isinstance(args, tuple) and args, f"{k.name}: make_inputs(0, shape={shape}) returned {args!r}"
        if k.entry.backward:
            args = tuple(a.detach().requires_grad_() if a.is_floating_point() else a for a in args)
        out = reference(*args)
        outs = out if isinstance(out, tuple) else (out,)
        for i, o in enumerate(outs):
            assert torch.isfinite(o.double()).all(), (
                f"{k.name}: reference output {i} is not finite at shape {shape} (inputs from "
                f"{k.inputs.text} with seed 0): the factory left the op's domain")
        if k.entry.backward:
            grads = torch.autograd.grad(sum(o.sum() for o in outs), [a for a in args if a.requires_grad])
            assert all(torch.isfinite(g).all() for g in grads), f"{k.name}: non-finite reference gradient"


def _signature(fn: ast.FunctionDef) -> tuple[list[str], int, set[str], set[str], bool, bool]:
    """Positional names, how many of them are required, keyword-only names, required keyword-only names,
    *args, **kwargs."""
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    required = len(positional) - len(a.defaults)
    kwonly = {p.arg for p in a.kwonlyargs}
    kw_required = {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None}
    return positional, required, kwonly, kw_required, a.vararg is not None, a.kwarg is not None


def _exported_definitions(init: Path) -> dict[str, ast.FunctionDef]:
    """name -> definition of what an ops/__init__.py imports `from <module> import name`."""
    found: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(ast.parse(init.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        module = init.parent / (node.module.rsplit(".", 1)[-1] + ".py") if node.level else (
            init.parents[1] / Path(*node.module.split(".")[1:]).with_suffix(".py"))
        if not module.exists():
            continue
        defs = {n.name: n for n in ast.parse(module.read_text()).body if isinstance(n, ast.FunctionDef)}
        for alias in node.names:
            if alias.name in defs:
                found[alias.asname or alias.name] = defs[alias.name]
    return found


def test_flaggems_wrappers_call_functions_flaggems_has_with_arguments_they_take():
    """Each `_gems("name")(...)` call of kernels.py against FlagGems' definition of `name` in flag_gems.ops
    and in the NVIDIA architecture overrides that replace it on Ampere/Hopper (flag_gems/runtime/backend/
    _nvidia/*/ops): the name exists, and the positional and keyword arguments bind to its parameters."""
    gems = _gems_source()
    ops = _exported_definitions(gems / "ops" / "__init__.py")
    assert {"softmax", "mm", "layer_norm_backward"} <= set(ops), f"flag_gems.ops exports not found in {gems}"
    overrides = [(init.parts[-3], _exported_definitions(init))
                 for init in sorted((gems / "runtime" / "backend" / "_nvidia").glob("*/ops/__init__.py"))]
    calls = []
    for node in ast.walk(ast.parse((FOLDER / "kernels.py").read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and isinstance(node.func.func, ast.Name)
                and node.func.func.id == "_gems"):
            calls.append((node.func.args[0].value, len(node.args), {kw.arg for kw in node.keywords}, node.lineno))
    assert len(calls) >= 30, f"found {len(calls)} _gems(...) calls in kernels.py"
    for name, n_pos, keywords, line in calls:
        assert name in ops, f"kernels.py:{line} calls flag_gems.{name}, which flag_gems.ops does not export ({gems})"
        for where, fn in [("flag_gems.ops", ops[name])] + [(f"_nvidia/{arch}", d[name]) for arch, d in overrides
                                                            if name in d]:
            positional, required, kwonly, kw_required, varargs, varkw = _signature(fn)
            given = positional[:n_pos]
            assert n_pos <= len(positional) or varargs, (
                f"kernels.py:{line}: {name} gets {n_pos} positional arguments, {where} takes {len(positional)}")
            unknown = keywords - set(positional[n_pos:]) - kwonly
            assert not unknown or varkw, f"kernels.py:{line}: {name} gets keywords {unknown} {where} does not take"
            missing = [p for p in positional[:required] if p not in given and p not in keywords]
            missing += sorted(kw_required - keywords)
            assert not missing, f"kernels.py:{line}: {name} ({where}) needs {missing}, which the wrapper does not pass"


@pytest.mark.timeout(300)
def test_flaggems_cpu_run_matches_the_doc(tmp_path, monkeypatch):
    """`kgate run cpu.yaml --device cpu`: every gate of every kernel is `error` with FlagGems' message."""
    from kgate.cli import main as kgate_main

    report = tmp_path / "report.json"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.chdir(tmp_path)
    code = kgate_main(["run", str(CPU), "--device", "cpu", "--json", str(report), "--out", str(tmp_path / "out")])
    assert report.exists(), f"kgate run wrote no report (exit {code}); its output is above"
    kernels = {k["name"]: k for k in json.loads(report.read_text())["kernels"]}
    entries = {k.name: k.entry for k in manifest.load(CPU).kernels}
    assert set(kernels) == set(entries), f"kernels judged {sorted(kernels)}, cpu.yaml lists {sorted(entries)}"
    for name, entry in entries.items():
        got = {g["gate"]: g for g in kernels[name]["gates"]}
        expected_ids = phase_ids(GATE_NAMES, entry.backward)
        assert list(got) == expected_ids, f"{name}: gates judged {list(got)}, expected {expected_ids}"
        for gate, result in got.items():
            reproduce = f"reproduce: TRITON_INTERPRET=1 kgate run {CPU.relative_to(ROOT)} -k {name} --gate {gate} --device cpu"
            if (name, gate) in CPU_SKIPPED:
                assert result["verdict"] == "skip", (
                    f"{name} / {gate}: expected skip, got {result['verdict']}: {result['message'][:300]}\n  {reproduce}")
                continue
            assert result["verdict"] == "error" and NO_DEVICE in result["message"], (
                f"{name} / {gate}: expected `error` with FlagGems' {NO_DEVICE!r} (docs/field/flaggems.md, CPU run), "
                f"got {result['verdict']}: {result['message'][:300]}\n  {reproduce}")
    assert code == 1, f"kgate run exited {code}, expected 1 (kernel errors)"
