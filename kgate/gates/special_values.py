"""special_values: where the oracle gives NaN/+Inf/-Inf the kernel gives the same, and it is finite
where the oracle is finite. Probes: one NaN, +Inf or -Inf injected into each floating-point input,
and all inputs scaled to overflow-prone magnitudes. Tolerance-free: only the class of each element
(NaN, +Inf, -Inf, finite) is compared, against the oracle rounded to the output's dtype. A kernel
whose sums are legitimately re-associated (chunked scans, split reductions: inf - inf order decides
between NaN and Inf) may declare `special_values_match: nonfinite`, and then only finite vs
non-finite must match."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from kgate.compare import clone_tree, flatten, index_of, structure
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case
from kgate.subject import Subject

_NAMES = {0: "finite", 1: "NaN", 2: "+Inf", 3: "-Inf"}
_NONFINITE_NAMES = {0: "finite", 1: "non-finite"}


def classify(t: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf (complex: by the worse of the two parts)."""
    if t.is_complex():
        t = torch.view_as_real(t)
        return torch.maximum(classify(t[..., 0]), classify(t[..., 1]))
    cls = torch.zeros(t.shape, dtype=torch.uint8, device=t.device)
    if not t.is_floating_point():
        return cls
    cls[torch.isnan(t)] = 1
    cls[t == math.inf] = 2
    cls[t == -math.inf] = 3
    return cls


def overflow_scale(dtype: torch.dtype) -> float:
    """A magnitude at which careless exp/square/sum overflow but sound formulations do not."""
    return min(1e4, math.sqrt(torch.finfo(dtype).max) / 4)


class SpecialValues(Gate):
    name = "special_values"
    summary = "NaN/+Inf/-Inf exactly where the float64 oracle has them, finite elsewhere"
    tolerance_free = True

    def probes(self, args: tuple, seed: int) -> Iterator[tuple[str, tuple]]:
        gen = torch.Generator().manual_seed(seed)
        floats = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                  and a.numel() > 0]
        for i in floats:
            pos = int(torch.randint(args[i].numel(), (1,), generator=gen))
            index = index_of(pos, tuple(args[i].shape))
            for value, label in ((math.nan, "NaN"), (math.inf, "+Inf"), (-math.inf, "-Inf")):
                probe = clone_tree(args)
                probe[i][index] = value
                yield f"{label} injected into argument {i} at {list(index)}", probe
        if floats:
            probe = clone_tree(args)
            for i in floats:
                t = probe[i]
                peak = t.abs().max()
                if peak > 0:
                    probe[i].copy_(t / peak * overflow_scale(t.dtype))
            yield "inputs scaled to overflow-prone magnitudes", probe

    def check(self, subject: Subject) -> GateResult:
        tried = 0
        for case in subject.first_seed_cases():
            base = subject.baseline(case)
            for label, probe in self.probes(base.args, case.seed):
                tried += 1
                result = self.judge(subject, case, label, probe)
                if result is not None:
                    return result
        if tried == 0:
            return self.skipped("no floating-point inputs to inject special values into")
        return self.passed(f"NaN/Inf pattern matched the oracle in {tried} probe(s)")

    def judge(self, subject: Subject, case: Case, label: str, probe: tuple) -> GateResult | None:
        oracle = subject.oracle(probe)
        out = subject.run_kernel(clone_tree(probe))
        if structure(out) != structure(oracle):
            return self.failed(subject, f"output structure differs from the reference's ({label})", case=case,
                               expected=structure(oracle), got=structure(out))
        oracles = dict(flatten(oracle))
        for path, got in flatten(out):
            want = oracles[path]
            if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
                continue
            if not (got.is_floating_point() or got.is_complex()) or got.shape != want.shape:
                continue
            expected = classify(want.to(got.dtype).cpu())
            actual = classify(got.detach().cpu())
            if subject.entry.entry.special_values_match == "nonfinite":
                # Declared: only finite vs non-finite must match (NaN and +-Inf count as one class).
                expected, actual = expected.clamp(max=1), actual.clamp(max=1)
            diff = expected != actual
            if diff.any():
                flat = int(diff.reshape(-1).nonzero()[0, 0])
                index = list(index_of(flat, tuple(got.shape)))
                names = _NONFINITE_NAMES if subject.entry.entry.special_values_match == "nonfinite" else _NAMES
                e, a = names[int(expected.reshape(-1)[flat])], names[int(actual.reshape(-1)[flat])]
                value = float(got.detach().reshape(-1)[flat].double().cpu())
                return self.failed(
                    subject, f"{path}{index}: the oracle gives {e}, the kernel gives {value!r} "
                    f"({int(diff.sum())} of {diff.numel()} elements differ in class) after {label}",
                    case=case, expected=e, got=f"{a} ({value!r})", where=f"{path}{index}", details={"probe": label})
        return None


GATE = SpecialValues
