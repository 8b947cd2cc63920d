"""Simulated GPU faults, on the CPU (tests/test_gpu_faults.py).

A real illegal memory access destroys the worker's CUDA context: from then on every CUDA call of that
process raises. Here a kernel "destroys" it by replacing kgate.subject.synchronize (what kgate calls
after each launch and after each gate) with one that raises the CUDA message, as any untrusted code
in the worker could. A fault marked `once` happens only while the file $KGATE_TEST_MARKERS/NAME does
not exist (it is created then): a fresh worker runs clean.
"""

import ctypes
import os

import torch

import kgate.subject

FAULT = ("CUDA error: an illegal memory access was encountered\n"
         "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
         "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
         "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
DEAD = "KGATE_TEST_CONTEXT_DEAD"  # set in the faulted worker: its inputs factory fails as on a GPU
_calls = 0


def _first_time(name):
    path = os.path.join(os.environ["KGATE_TEST_MARKERS"], name)
    if os.path.exists(path):
        return False
    open(path, "w").close()
    return True


def _lose_context(patch_synchronize=True):
    def dead(device):
        raise torch.AcceleratorError(FAULT)

    if patch_synchronize:
        kgate.subject.synchronize = dead
    os.environ[DEAD] = "1"


def make_inputs(seed, shape=None):
    if os.environ.get(DEAD):
        raise torch.AcceleratorError(FAULT)
    return (torch.randn(shape or (4, 8), generator=torch.Generator().manual_seed(seed)),)


def reference(x):
    return x * 2


def good(x):
    return x + x


def async_fault(x):
    """The second launch faults, reported at the next synchronize (once)."""
    global _calls
    _calls += 1
    if _calls == 2 and _first_time("async_fault"):
        _lose_context()
    return x + x


def factory_first(x):
    """The first launch faults; nothing synchronizes before the next case's inputs factory (once)."""
    if _first_time("factory_first"):
        _lose_context(patch_synchronize=False)
    return x + x


def faults_on_other_shapes(x):
    """Faults on the first shape other than the declared one; its exception is the shapes gate's finding,
    which then goes on with its own verdict on a dead context (once)."""
    if tuple(x.shape) != (4, 8) and _first_time("faults_on_other_shapes"):
        _lose_context()
        raise torch.AcceleratorError(FAULT)
    return x + x


def always_faults(x):
    _lose_context()
    return x + x


def segfault_once(x):
    if _first_time("segfault_once"):
        ctypes.string_at(0)
    return x + x


def reference_faults_on_strided(x):
    """A reference whose own launch faults on inputs it cannot run on (as torch's memory-efficient attention
    does on a float32 storage offset that is not a multiple of 16 bytes): every strided input, here."""
    if not x.is_contiguous() or x.storage_offset():
        _lose_context()
        raise torch.AcceleratorError(FAULT.replace("an illegal memory access was encountered", "misaligned address"))
    return x * 2
