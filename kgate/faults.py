"""GPU faults that destroy a process's CUDA context.

CUDA reports a kernel's illegal memory access (and a few other faults) asynchronously, at some later
call, and from then on every CUDA call of that process fails with the same error: the context is
lost. Whatever touches the device first (the next launch, a synchronize, the inputs factory, the
reference) gets the error, so the one who raised it is not necessarily the one who caused it.

`context_lost` recognises such an error by its message (torch raises `torch.AcceleratorError` for every
CUDA error, launch-configuration errors that leave the context usable included, so the type alone does
not decide). The worker (kgate.worker.run_gates) turns it into the verdict `error` of the gate during
which it surfaced and stops; the runner starts a fresh worker for the remaining gates. Torch-free, so
a worker can import it before its memory limit applies to torch.
"""

from __future__ import annotations

# Sticky CUDA errors (runtime, driver and Triton spellings), matched case-insensitively. Not
# "device-side assert" alone: every torch CUDA error ends with "... to enable device-side assertions".
STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "misaligned address", "illegal instruction",
    "unspecified launch failure", "device-side assert triggered", "CUDA error: an illegal",
    "hardware stack error", "invalid program counter", "context is destroyed", "CUDA error: unknown error",
    "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorMisalignedAddress", "cudaErrorAssert",
    "cudaErrorIllegalInstruction", "cudaErrorHardwareStackError", "cudaErrorInvalidPc",
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
)
_LOWERED = tuple(s.lower() for s in STICKY_CUDA_ERRORS)


def context_lost(error: BaseException | str | None) -> str | None:
    """The line of the CUDA message saying the context is lost, or None when `error` (a message, or an
    exception searched with its causes and, for kgate's UserCodeError, the user's exception) is not
    such an error. Of a chain, the innermost match: the CUDA message itself, not a wrapper's."""
    found: str | None = None
    seen: set[int] = set()
    pending: list[BaseException | str | None] = [error]
    while pending:
        item = pending.pop(0)
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        text = item if isinstance(item, str) else str(item)
        line = next((ln.strip() for ln in text.splitlines() if any(s in ln.lower() for s in _LOWERED)), None)
        if line is not None:
            found = line[:500]
        if isinstance(item, BaseException):
            pending.extend([getattr(item, "exc", None), item.__cause__, item.__context__])
    return found


def fault_message(line: str, role: str = "kernel") -> str:
    """The verdict's message for a context lost during a gate; `role` is whose call saw it first."""
    seen = "" if role in ("kernel", "") else f" by an earlier launch; first reported by the {role}"
    return (f"the kernel faulted on the GPU (CUDA context lost{seen}): {line}; to locate it, run the reproducer "
            "under compute-sanitizer (the bounds gate does when it is installed)")


class ContextLost(BaseException):
    """The CUDA context was lost during a call to the reference (or its float64 oracle): nothing more can run
    in this process. Raised by kgate.subject instead of the UserCodeError a reference's exception becomes, so
    that no gate reads it as the reference rejecting the inputs and goes on to the next probe (whose first
    launch would then report the fault, blamed on the kernel). A BaseException, so no gate's broad handler
    keeps it either; kgate.worker.run_gates ends the gate with it.

    `own`: the device was clean when the call began (a synchronize just before it succeeded), so the
    reference's own launches faulted on the inputs the gate gave it, e.g. torch's memory-efficient attention
    on a float32 tensor whose storage offset is not a multiple of 16 bytes ("misaligned address"). Those
    inputs are outside what the reference can compute, as inputs it raises on are: the gate skips from there
    on. Otherwise an earlier launch faulted and the reference's call only reported it."""

    def __init__(self, line: str, role: str, own: bool, exc: BaseException | None = None) -> None:
        super().__init__(line)
        self.line, self.role, self.own, self.exc = line, role, own, exc


def reference_fault_message(line: str, role: str = "reference") -> str:
    """A skip's message where the reference's own launches lost the CUDA context on a gate's probe."""
    return (f"the {role} itself faulted on the GPU on one of this gate's probes, the device clean before its "
            f"call (CUDA context lost: {line}): inputs it cannot compute, like inputs it raises on, are outside "
            "the kernel's contract; the gate stopped there (no earlier probe had failed), and a fresh worker ran "
            "the gates after it")
