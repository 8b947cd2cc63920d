"""determinism: repeated calls on equal inputs, at other allocation addresses, give bitwise-equal
outputs (unless the manifest declares `nondeterministic: true`). Tolerance-free.

The contract is the reference's: where the kernel's calls differ, the reference is called the same
way (up to REFERENCE_ROUNDS rounds, so an operator that differs only now and then, as torch's CUDA cumsum,
shows it there too), and if its own calls differ too (e.g. a KernelBench model whose cuDNN convolution picks an
algorithm with atomics, which a candidate calling the same convolution inherits), there is no
bitwise behaviour to hold the kernel to and the gate is skipped, naming both differences.

Then the same calls once more, each with torch's random generators at another state (`rng_state`: a
KernelBench pair's models, which draw from generators seeded alike on every call, get other seeds): a
kernel whose result depends on the generators' state (a completion order drawn at random, stochastic
rounding) where the reference's does not fails; where the reference's depends on it too, the kernel's may.

And the kernel's first calls in the process (`Subject.first_calls`, up to FIRST_CALLS: in an audit the
standard test's trials, before any gate) are made again on copies of their inputs: a kernel that autotunes
or warms up on its first calls and computes otherwise there must give the same bits, where the reference's
first calls, made again the same way, do. More than the first one: an autotuner that times one
configuration a call and keeps the fastest computes as its first call did whenever that one wins. Before
they are made again, the kernel is called on the first call's inputs up to SOAK_CALLS times (time-boxed): a
kernel that commits to another computation after a warm-up count of calls of one shape computes otherwise by
then."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten, map_tensors
from kgate.gates.base import Gate, GateResult
from kgate.oracle import rng_state
from kgate.subject import Subject

CALLS = 3
# Where the kernel's calls differ, the reference gets up to this many rounds of CALLS calls to differ too: an
# operator that differs only now and then (torch's CUDA cumsum: its scan combines the blocks' partial sums in
# the order they finish) may show it in the kernel's calls and not in the reference's first round.
REFERENCE_ROUNDS = 10
RNG_SHIFT = 7919  # call k of the second round runs with torch's generators seeded with k * RNG_SHIFT
SOAK_CALLS = 160  # calls of the kernel on its first call's inputs before its first calls are made again
SOAK_SECONDS = 5.0  # ... within this time and SOAK_SHARE of the gate's time limit
SOAK_SHARE = 0.05
_monotonic = time.monotonic  # bound at import, before kernel code runs (it may patch time)


OFFSET_BYTES = (0, 16, 80)  # where each call's contiguous inputs start past an ALIGN_BYTES boundary
ALIGN_BYTES = 512  # CUDA's caching allocator's block alignment; the CPU's allocator gives 64 only


def at_offset(args: Any, offset: int) -> Any:
    """Copies of `args` whose contiguous tensors start `offset` bytes (rounded down to whole elements) past an
    ALIGN_BYTES boundary of a fresh buffer of their dtype and device; other leaves cloned (`clone_tree`). So the
    first call's inputs are aligned as widely as any allocator aligns, and the others' are not, on every
    device (a CPU allocation is aligned at 64 bytes, sometimes at 128: a path chosen by address could
    otherwise be taken by every call)."""

    def place(t: torch.Tensor) -> torch.Tensor:
        size = t.element_size()
        if not t.is_contiguous() or t.numel() == 0 or ALIGN_BYTES % size:
            return clone_tree(t)
        buffer = torch.empty(t.numel() + (ALIGN_BYTES + offset) // size, dtype=t.dtype, device=t.device)
        start = ((-buffer.data_ptr()) % ALIGN_BYTES) // size + offset // size
        return buffer[start:start + t.numel()].view(t.shape).copy_(t.detach())

    return map_tensors(args, place)


def first_difference(run: Callable[[Any], Any], args: Any, device: torch.device, *,
                     other_rng: bool = False) -> tuple[int, str, Any] | None:
    """(call number, output path, mismatch) of the first of CALLS calls of `run` on copies of `args`
    whose outputs are not bitwise equal to the first call's; None when all are. `other_rng`: each call with
    torch's generators at another state (`rng_state`)."""
    first = None
    keep = []
    for call in range(CALLS):
        # Shift the caching allocator so each call sees its inputs at other addresses.
        keep.append(torch.empty(4096 * (call + 1) + 64 * call, dtype=torch.uint8, device=device))
        # Earlier calls' inputs stay alive, so no allocator can hand their addresses out again; the later calls'
        # start OFFSET_BYTES past an aligned boundary (an allocator aligns every block: a kernel whose path depends
        # on its operands' alignment, as a vectorised or split path chosen by address, shows only so).
        copy = at_offset(args, OFFSET_BYTES[call % len(OFFSET_BYTES)])
        keep.append(copy)
        if other_rng:
            with rng_state((call + 1) * RNG_SHIFT):
                out = run(copy)
        else:
            out = run(copy)
        leaves = [(p, t.detach().clone()) for p, t in flatten(out) if isinstance(t, torch.Tensor)]
        if first is None:
            first = leaves
            continue
        for (path, a), (_, b) in zip(first, leaves):
            mismatch = bitwise_mismatch(a, b)
            if mismatch:
                return call + 1, path, mismatch
    return None


class Determinism(Gate):
    name = "determinism"
    summary = "repeated calls on equal inputs (other addresses) give bitwise-equal outputs"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        if subject.nondeterministic:
            return self.skipped("declared nondeterministic in the manifest")
        cases = subject.first_seed_cases()
        rng_free = 0  # cases where the reference's result does not depend on the generators either
        for case in cases:
            base = subject.baseline(case)
            for other_rng in (False, True):
                found = first_difference(subject.run_kernel, base.args, subject.device, other_rng=other_rng)
                if found is None:
                    rng_free += other_rng
                    continue
                call, path, mismatch = found
                told = (f"call {call} differs from call 1 in {path}"
                        + (" (each call with torch's random generators at another state)" if other_rng else "")
                        + f": {mismatch.describe()}")
                own, calls = None, 0
                for _ in range(REFERENCE_ROUNDS):  # until the reference differs too, or its rounds are spent
                    own = first_difference(subject.run_reference, base.args, subject.device, other_rng=other_rng)
                    calls += CALLS
                    if own is not None or subject.out_of_time():
                        break
                if own is not None:
                    if other_rng:  # the reference draws from the generators: so may the kernel
                        continue
                    r_call, r_path, r_mismatch = own
                    return self.skipped(f"the kernel's {told}; but the reference called the same way differs too "
                                        f"(call {r_call} in {r_path}: {r_mismatch.describe()}): it sets no bitwise "
                                        f"contract on these inputs ({case.label()})")
                return self.failed(subject, told + f"; the reference called the same way is bitwise equal "
                                   f"({calls} calls, {calls // CALLS} round(s) of {CALLS})",
                                   case=case, expected=repr(mismatch.expected), got=repr(mismatch.got),
                                   where=f"{path}{list(mismatch.index)}",
                                   details={"differing": mismatch.count, "other_rng_state": other_rng})
        first = self.first_call(subject)
        if isinstance(first, GateResult):
            return first
        return self.passed(f"{CALLS} calls bitwise equal in {len(cases)} case(s), and again with torch's random "
                           f"generators at {CALLS} other states"
                           + ("" if rng_free == len(cases) else " (where the reference's result depends on them "
                              "too, the kernel's may)") + first)

    def first_call(self, subject: Subject) -> GateResult | str:
        """The kernel's first call made again (see the module's docstring): a failure, or what the pass
        message says of it."""
        kernel, reference = subject.first_calls["kernel"], subject.first_calls["reference"]
        if not (kernel.kept and reference.kept):
            return "; the first call not kept (too large, or not made on plain tensors)"
        soaked = self.soak(subject, kernel.calls[0][0])
        for number, (args, out) in enumerate(kernel.calls, 1):
            again = [t for _, t in flatten(subject.run_kernel(clone_tree(args)))]
            for (path, was), now in zip(out, again):
                mismatch = bitwise_mismatch(was, now) if isinstance(now, torch.Tensor) else None
                if mismatch is None:
                    continue
                differs, rounds = self._reference_differs(subject, reference)
                if differs:
                    return "; a first call differs from a later one, as one of the reference's first calls does"
                nth = "first call" if number == 1 else f"call number {number}"
                return self.failed(subject, f"the kernel's {nth} in the process differs from the same call made "
                                   f"later (after {soaked} more calls on its inputs and this gate's others), in "
                                   f"{path}: {mismatch.describe()}; the reference's first "
                                   f"{len(reference.calls)} call(s), made again {rounds} time(s), are bitwise "
                                   f"equal (warm-up or "
                                   f"autotuning that computes otherwise on the first calls)", case=None,
                                   expected=repr(mismatch.got), got=repr(mismatch.expected),
                                   where=f"{path}{list(mismatch.index)}",
                                   details={"differing": mismatch.count, "first_call": number, "soaked": soaked})
        return (f"; the first {len(kernel.calls)} call(s) in the process made again after {soaked} more calls: "
                "bitwise equal")

    @staticmethod
    def soak(subject: Subject, args: tuple) -> int:
        """Up to SOAK_CALLS calls of the kernel on copies of `args` (its first call's inputs), within SOAK_SECONDS
        and SOAK_SHARE of the gate's time limit: a kernel that switches to another computation after many calls
        of one shape (a variant tuned, or committed to, after a warm-up count) computes otherwise by the time
        its first calls are made again. Returns the calls made."""
        budget = min(SOAK_SECONDS, subject.entry.limits.timeout * SOAK_SHARE)
        start, calls = _monotonic(), 0
        while calls < SOAK_CALLS and _monotonic() - start < budget and not subject.out_of_time():
            subject.run_kernel(clone_tree(args))
            calls += 1
        return calls

    @staticmethod
    def _reference_differs(subject: Subject, reference: Any) -> tuple[bool, int]:
        """(whether one of the reference's kept first calls, made again up to REFERENCE_ROUNDS times, differs
        bitwise; how many times they were made again: fewer once the search budget is spent)."""
        rounds = 0
        while rounds < REFERENCE_ROUNDS:
            rounds += 1
            for args, out in reference.calls:
                own = [t for _, t in flatten(subject.run_reference(clone_tree(args)))]
                if any(isinstance(b, torch.Tensor) and bitwise_mismatch(a, b) for (_, a), b in zip(out, own)):
                    return True, rounds
            if subject.out_of_time():
                break
        return False, rounds


GATE = Determinism
