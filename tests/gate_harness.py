"""Run one gate in-process on plain Python callables (no worker process): fast gate unit tests.

The runner-level tests (tests/test_runner.py, tests/test_cli.py) cover isolation; here a gate's logic
is tested directly on a Subject built from callables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kgate import gates as registry
from kgate.gates.base import GateResult
from kgate.inputs import Case, InputFactory
from kgate.manifest import Defaults, KernelEntry, LoadedManifest, Manifest
from kgate.subject import Subject


def subject_for(kernel, reference, make_inputs=None, *, shapes=None, dtypes=("float32",), seeds=(0,),
                device="cpu", **options: Any) -> Subject:
    entry = KernelEntry(name="k", kernel="x.py:k", reference="x.py:r", shapes=shapes, dtypes=list(dtypes),
                        seeds=list(seeds), **options)
    model = Manifest(version=1, defaults=Defaults(), kernels=[entry])
    manifest = LoadedManifest(Path("kgate.yaml").resolve(), model, {})
    resolved = manifest.kernels[0]
    cases = [Case(tuple(s) if s is not None else None, d, seed)
             for s in resolved.shapes for d in resolved.dtypes for seed in resolved.seeds]
    factory = InputFactory(make_inputs) if make_inputs is not None else InputFactory(None)
    return Subject(resolved, kernel, reference, factory, torch.device(device), cases, repro_manifest="kgate.yaml")


def normal_inputs(default_shape: tuple[int, ...], count: int = 1, scale: float = 1.0):
    """An inputs factory: `count` tensors of seeded standard normal values times `scale`, drawn in float64 from one
    generator and cast to the case's dtype, of the case's shape or `default_shape`."""
    def make(seed, shape=None, dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        return tuple((torch.randn(shape or default_shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
                     for _ in range(count))
    return make


def check(gate: str, kernel, reference, make_inputs=None, **kwargs: Any) -> GateResult:
    return registry.get(gate).check(subject_for(kernel, reference, make_inputs, **kwargs))


def catalogue(gate: str, name: str):
    """The catalogue's module gates/GATE/NAME.py (its controls, reference and inputs factory), loaded from its file."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "gates" / gate / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"catalogue_{gate}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
