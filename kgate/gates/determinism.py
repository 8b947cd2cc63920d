"""determinism: repeated calls on equal inputs, at other allocation addresses, give bitwise-equal
outputs (unless the manifest declares `nondeterministic: true`). Tolerance-free."""

from __future__ import annotations

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten
from kgate.gates.base import Gate, GateResult
from kgate.subject import Subject

CALLS = 3


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
            first = None
            keep = []
            for call in range(CALLS):
                # Shift the caching allocator so each call sees its inputs at other addresses.
                keep.append(torch.empty(4096 * (call + 1) + 64 * call, dtype=torch.uint8, device=subject.device))
                # Earlier calls' inputs stay alive, so no allocator can hand their addresses out again.
                args = clone_tree(base.args)
                keep.append(args)
                out = subject.run_kernel(args)
                leaves = [(p, t.detach().clone()) for p, t in flatten(out) if isinstance(t, torch.Tensor)]
                if first is None:
                    first = leaves
                    continue
                for (path, a), (_, b) in zip(first, leaves):
                    mismatch = bitwise_mismatch(a, b)
                    if mismatch:
                        return self.failed(
                            subject, f"call {call + 1} differs from call 1 in {path}: {mismatch.describe()}",
                            case=case, expected=repr(mismatch.expected), got=repr(mismatch.got),
                            where=f"{path}{list(mismatch.index)}", details={"differing": mismatch.count})
        return self.passed(f"{CALLS} calls bitwise equal in {len(cases)} case(s)")


GATE = Determinism
