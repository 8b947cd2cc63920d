"""One GPU's memory shared out among the workers that judge on it at once (`kgate run -j`, `kgate audit --jobs`).

Side by side on one GPU, each worker may take only its share of the GPU's memory
(`torch.cuda.set_per_process_memory_fraction`, set by kgate.worker.prepare_device before any user code),
so one kernel's appetite cannot take the memory another's verdict needs. A result that ran out of memory
inside a share is no verdict: the work is judged again with more memory (the audit: kgate.audit.scheduler;
`kgate run`: kgate.runner, alone on the device once the shared work is done). Running out of memory with
the whole device is a result like any other. Torch-free.
"""

from __future__ import annotations

import re

# Running out of GPU memory, as torch (the caching allocator, a CUDA call outside it), cuBLAS, the CUDA driver,
# compute-sanitizer (the allocation its tool failed) and Triton (`Triton Error [CUDA]: out of memory`) say it.
GPU_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|"
                     r"CUDA_ERROR_OUT_OF_MEMORY|CUDA error: out of memory|Triton Error \[CUDA\]: out of memory",
                     re.IGNORECASE)


# How kgate.runner words a worker killed at kgate's own host memory limit (`limits.memory`, --memory).
MEMORY_LIMIT = "exceeded the memory limit of"


def out_of_gpu_memory(text: str | None) -> bool:
    """Whether `text` (a message, a traceback, a log's tail) says the GPU ran out of memory."""
    return bool(text) and GPU_OOM.search(text) is not None


def result_out_of_gpu_memory(verdict: str | None, message: str | None, details: dict | None) -> bool:
    """Whether a gate's result, a verdict other than pass, says the GPU ran out of memory: its message, its
    traceback or its worker's log tail (`details`)."""
    details = details or {}
    return verdict != "pass" and any(isinstance(text, str) and out_of_gpu_memory(text)
                                     for text in (message, details.get("traceback"), details.get("log_tail")))


def at_memory_limit(text: str | None) -> bool:
    """Whether `text` says the GPU ran out of memory or the worker passed kgate's host memory limit: on a
    shared GPU, most often a share too small (a float64 oracle that did not fit moves to the host)."""
    return out_of_gpu_memory(text) or (bool(text) and MEMORY_LIMIT in text)


def memory_share(width: int, slots: int) -> float:
    """The share of a GPU's memory for a worker holding `width` of its `slots` judging slots (0.95 of it
    shared out: the rest for the CUDA contexts, which the caching allocator does not count)."""
    return round(0.95 * width / slots, 4)
