"""determinism: repeated calls on equal inputs, at other allocation addresses, give bitwise-equal
outputs (unless the manifest declares `nondeterministic: true`). Tolerance-free.

The contract is the reference's: where the kernel's calls differ, the reference is called the same
way, and if its own calls differ too (e.g. a KernelBench model whose cuDNN convolution picks an
algorithm with atomics, which a candidate calling the same convolution inherits), there is no
bitwise behaviour to hold the kernel to and the gate is skipped, naming both differences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten
from kgate.gates.base import Gate, GateResult
from kgate.subject import Subject

CALLS = 3


def first_difference(run: Callable[[Any], Any], args: Any, device: torch.device) -> tuple[int, str, Any] | None:
    """(call number, output path, mismatch) of the first of CALLS calls of `run` on copies of `args`
    whose outputs are not bitwise equal to the first call's; None when all are."""
    first = None
    keep = []
    for call in range(CALLS):
        # Shift the caching allocator so each call sees its inputs at other addresses.
        keep.append(torch.empty(4096 * (call + 1) + 64 * call, dtype=torch.uint8, device=device))
        # Earlier calls' inputs stay alive, so no allocator can hand their addresses out again.
        copy = clone_tree(args)
        keep.append(copy)
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
        for case in cases:
            base = subject.baseline(case)
            found = first_difference(subject.run_kernel, base.args, subject.device)
            if found is None:
                continue
            call, path, mismatch = found
            told = f"call {call} differs from call 1 in {path}: {mismatch.describe()}"
            own = first_difference(subject.run_reference, base.args, subject.device)
            if own is not None:
                r_call, r_path, r_mismatch = own
                return self.skipped(f"the kernel's {told}; but the reference called the same way differs too "
                                    f"(call {r_call} in {r_path}: {r_mismatch.describe()}): it sets no bitwise "
                                    f"contract on these inputs ({case.label()})")
            return self.failed(subject, told + "; the reference called the same way is bitwise equal", case=case,
                               expected=repr(mismatch.expected), got=repr(mismatch.got),
                               where=f"{path}{list(mismatch.index)}", details={"differing": mismatch.count})
        return self.passed(f"{CALLS} calls bitwise equal in {len(cases)} case(s)")


GATE = Determinism
