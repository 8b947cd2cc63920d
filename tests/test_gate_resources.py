"""resources: compiled kernels' registers, local memory (spills) and shared memory against a budget. The
figures need a GPU; here they come from recorded cuobjdump output and from compiled-kernel objects that
carry Triton's attribute names, placed in a real `triton.jit` function's cache."""

from __future__ import annotations

import types

import pytest
import torch

from kgate.gates import resources
from kgate.gates.resources import Budget, KernelResources
from tests.gate_harness import subject_for

# `cuobjdump -res-usage` of a two-function sm_52 binary, as NVIDIA's forum shows it (a fully linked `-rdc`
# build: `_Z1kPfS_` calls `_Z1ff`), then a second architecture section as a fat binary holds it.
CUOBJDUMP = """
Fatbin elf code:
================
arch = sm_52
code version = [1,7]
producer = <unknown>
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _Z1kPfS_:
  REG:17 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:336 CONSTANT[2]:60 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z1ff:
  REG:14 STACK:0 SHARED:0 LOCAL:0 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _Z5tiledPfS_:
  REG:168 STACK:32 SHARED:49152 LOCAL:32 CONSTANT[0]:912 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_cuobjdump_resource_usage_is_read_per_function_and_architecture():
    kernels = resources.parse_cuobjdump(CUOBJDUMP, "ext.so")
    assert [(k.name, k.arch, k.registers, k.local_bytes, k.shared_bytes) for k in kernels] == [
        ("_Z1kPfS_", "sm_52", 17, 0, 0), ("_Z1ff", "sm_52", 14, 0, 0), ("_Z5tiledPfS_", "sm_90", 168, 32, 49152)]
    assert resources.parse_cuobjdump("no resource table here\n") == []


def _compiled(name, regs, spills, shared):
    """A compiled kernel as Triton 3 keeps it: n_regs, n_spills (32-bit words), metadata.shared (bytes)."""
    metadata = types.SimpleNamespace(name=name, shared=shared, target=types.SimpleNamespace(arch=90))
    return types.SimpleNamespace(name=name, n_regs=regs, n_spills=spills, metadata=metadata)


def test_triton_figures_and_where_the_compiled_kernels_are_found():
    triton = pytest.importorskip("triton")

    @triton.jit
    def scale(x_ptr, n):
        pass

    tuned = triton.autotune(configs=[triton.Config({})], key=["n"])(triton.jit(scale.fn))
    scale.device_caches = {0: ({"k1": _compiled("scale_0d1d", 40, 0, 0)}, {}, None, None, None)}
    tuned.fn.device_caches = {0: ({"k2": _compiled("tuned_0d1d", 255, 12, 98304)}, {}, None, None, None)}
    found = [resources.from_triton(k) for k in resources.triton_kernels([{"scale": scale, "tuned": tuned, "n": 3}])]
    assert [(k.name, k.registers, k.local_bytes, k.shared_bytes, k.arch) for k in found] == [
        ("scale_0d1d", 40, 0, 0, "sm_90"), ("tuned_0d1d", 255, 48, 98304, "sm_90")]


def test_the_budget_names_what_is_over_and_refuses_what_it_does_not_know():
    budget = Budget.from_mapping({"max_registers": 128, "spills": 0})
    heavy = KernelResources("heavy", "triton", 168, 32, 49152)
    light = KernelResources("light", "triton", 32, 0, 0)
    assert budget.over(light) == [] and budget.over(KernelResources("n", "x", None, None, None)) == []
    assert budget.over(heavy) == ["168 registers > 128", "32 bytes of local memory (spills) > 0"]
    assert [k.name for k, _ in resources.judge([heavy, light], budget)] == ["heavy"]
    with pytest.raises(ValueError, match="unknown key"):
        Budget.from_mapping({"max_regs": 1})
    with pytest.raises(ValueError, match="count >= 0"):
        Budget.from_mapping({"spills": -1})


def _kernel(x):
    return x * 2


def _reference(x):
    return x * 2


def _inputs(seed, shape=None):
    return (torch.randn(shape or (8,)),)


def _subject_with(compiled, budget):
    triton = pytest.importorskip("triton")

    @triton.jit
    def double(x_ptr):
        pass

    double.device_caches = {0: ({"k": compiled}, {}, None, None, None)} if compiled is not None else {}
    # the kernel's module globals hold the jitted function, as a Triton kernel's file does
    kernel = types.FunctionType(_kernel.__code__, {"double": double, "__name__": "resource_controls"})
    subject = subject_for(kernel, _reference, _inputs)
    subject.resource_budget = budget
    return subject


def test_a_kernel_over_its_budget_fails_and_one_within_passes_with_its_figures():
    gate = resources.ResourcesGate()
    over = gate.check(_subject_with(_compiled("double_kernel", 200, 4, 0), Budget(max_registers=128, spills=0)))
    assert over.verdict == "fail" and over.tolerance_free, over
    assert "double_kernel has 200 registers > 128, 16 bytes of local memory (spills) > 0" in over.message
    assert over.where == "double_kernel" and over.details["kernels"][0]["registers"] == 200
    within = gate.check(_subject_with(_compiled("double_kernel", 64, 0, 1024), Budget(max_registers=128, spills=0)))
    assert within.verdict == "pass", within
    assert "within max_registers 128, spills 0: double_kernel (sm_90): 64 registers, 0 B local, 1024 B shared" \
        in within.message
    unbudgeted = gate.check(_subject_with(_compiled("double_kernel", 200, 4, 0), Budget()))
    assert unbudgeted.verdict == "pass" and "no budget declared" in unbudgeted.message


def test_nothing_compiled_is_a_skip_that_says_why(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    result = resources.ResourcesGate().check(_subject_with(None, Budget(max_registers=1)))
    assert result.verdict == "skip" and "interpreter" in result.message, result
