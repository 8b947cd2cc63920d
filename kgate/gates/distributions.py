"""distributions: correct (within the oracle bound, finite where the oracle is) on value distributions
that random normal inputs never produce.

Each distribution in turn replaces every floating-point input at once: zeros; a constant;
all-negative values; huge magnitudes (peak min(1e6, max/16) of the dtype); tiny magnitudes (peak
sqrt of the smallest normal); subnormals (every magnitude below the smallest normal); heavy tails
(Cauchy, lognormal with sigma 2, clipped to the huge magnitude). Before them, the factory's inputs at
fresh seeds that the manifest does not list (the factory's own inputs are judged first: a kernel that
fails there is not failing because of a distribution). Integer inputs are left alone. Judged like the
oracle gate (bound calibrated from the reference's own error on the same inputs); a kernel that
raises where the reference accepts the inputs fails.

A reference declares its domain by raising on inputs outside it. Where it rejects a distribution on
all inputs at once, the distribution is applied to one floating-point argument at a time (the others
keep the factory's values, `kgate.subject.within_domain`), and each such probe the reference accepts
is judged; the probes it rejects are skipped and listed in the pass message. Ordinary kernels pay
nothing for this: the all-at-once probe comes first.

On the two degenerate distributions (zeros, a constant) the exact output is often exactly zero and the
reference exact by structure (Welford's mean of equal values), so the bound would be 0 and an ulp of
rounding in the kernel, amplified by a normalization's 1/sqrt(eps), a failure. There the bound's floor
(ulps x eps x magnitude) takes the larger of the output's magnitude here and at the factory's inputs
(`FLOOR_FROM_FACTORY`): an error below a few ulps of the output's usual size is not a finding; a
non-finite output, or a wrong one, still is.

A failure is shrunk to the fewest values drawn from the failing distribution (the others keep the
factory's values; within the one argument, for a per-argument probe) that still fail, and reported
with their positions and, for a per-argument probe, the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kgate.compare import clone_tree, flatten, index_of
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case
from kgate.shrink import SHRINK_SECONDS, Finding, judge_probe, shrink_subset
from kgate.subject import Subject, rejected_note, unless_rejected, within_domain

FRESH_SEEDS = (104729, 1299709)
FLOOR_FROM_FACTORY = ("zeros", "constant")
SHRINK_MAX_ELEMENTS = 1 << 18


def huge(dtype: torch.dtype) -> float:
    return min(1e6, torch.finfo(dtype).max / 16)


def tiny(dtype: torch.dtype) -> float:
    return math.sqrt(torch.finfo(dtype).tiny)


def _peak(t: torch.Tensor, to: float) -> torch.Tensor:
    peak = t.abs().max()
    return t / peak * to if peak > 0 else torch.full_like(t, to)


def _uniform(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(t.shape, generator=gen, dtype=torch.float64, device=t.device)


def _normal(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=gen, dtype=torch.float64, device=t.device)


def _clip(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return values.clamp(-huge(dtype), huge(dtype))


# name -> (description, values in float64 from the original tensor (float64) and a generator)
DISTRIBUTIONS: dict[str, tuple[str, Callable[[torch.Tensor, torch.Generator, torch.dtype], torch.Tensor]]] = {
    "zeros": ("all zeros", lambda t, g, d: torch.zeros_like(t)),
    "constant": ("every value 1.5", lambda t, g, d: torch.full_like(t, 1.5)),
    "all-negative": ("-(|x| + 0.5)", lambda t, g, d: -(t.abs() + 0.5)),
    "huge": ("magnitudes up to min(1e6, max/16)", lambda t, g, d: _peak(t, huge(d))),
    "tiny": ("magnitudes up to sqrt(smallest normal)", lambda t, g, d: _peak(t, tiny(d))),
    "subnormal": ("every magnitude below the smallest normal",
                  lambda t, g, d: _peak(t, torch.finfo(d).tiny / 2)),
    "cauchy": ("Cauchy (heavy tails), clipped to the huge magnitude",
               lambda t, g, d: _clip(torch.tan(math.pi * (_uniform(t, g) - 0.5)), d)),
    "lognormal": ("lognormal, sigma 2 (heavy right tail)",
                  lambda t, g, d: _clip(torch.exp(2 * _normal(t, g)), d)),
}


def transform(args: tuple, name: str, seed: int) -> tuple:
    """Copies of `args` with every non-empty floating-point tensor drawn from distribution `name`.

    Drawn on each tensor's own device with a generator of that device seeded with `seed`: the same
    values for the same seed on the same kind of device (a reproducer names the device), and no
    host-side float64 copies of inputs that can hold 10^9 elements."""
    generators: dict[torch.device, torch.Generator] = {}
    make = DISTRIBUTIONS[name][1]
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 0:
            if a.device not in generators:
                generators[a.device] = torch.Generator(device=a.device).manual_seed(seed)
            values = make(a.detach().double(), generators[a.device], a.dtype)
            a = values.to(dtype=a.dtype)
        elif isinstance(a, torch.Tensor):
            a = a.clone()
        out.append(a)
    return tuple(out)


def _magnitudes(oracle) -> dict[str, float]:
    """Per floating output leaf, the largest finite magnitude of the float64 oracle."""
    out = {}
    for path, t in flatten(oracle):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            out[path] = float(t.abs().nan_to_num_(nan=0.0, posinf=0.0).max())
    return out


class Distributions(Gate):
    name = "distributions"
    summary = "oracle bound holds on zeros, constants, negatives, huge/tiny/subnormal values, heavy tails, fresh seeds"
    tolerance_free = False

    def check(self, subject: Subject) -> GateResult:
        evidence: list[dict] = []
        probes, rejected = 0, []
        cases = subject.first_seed_cases()
        declared = {c.seed for c in subject.cases}
        for case in cases:
            # The factory's own inputs first: a kernel that fails there fails whatever the distribution
            # (and a reproducer run with a fresh seed finds it); then the distributions and fresh seeds.
            for seed in (case.seed,) + tuple(s for s in FRESH_SEEDS if s not in declared):
                fresh = Case(case.shape, case.dtype, seed)
                base = subject.baseline(fresh)
                finding, leaves = judge_probe(subject, base.args, base.reference, base.oracle)
                evidence.extend({"case": fresh.to_json(), **leaf.to_json()} for leaf in leaves)
                probes += 1
                if finding is not None:
                    label = "the factory's inputs" if seed == case.seed else "fresh seed"
                    return self._report(subject, fresh, f"{label} (seed {seed})", finding, evidence, "")
        per_argument: set[str] = set()
        for case in cases:
            base = subject.baseline(case)
            floats = [i for i, a in enumerate(base.args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                      and a.numel() > 0]
            if not floats:
                continue

            usual = _magnitudes(base.oracle)

            for name in DISTRIBUTIONS:
                scales = usual if name in FLOOR_FROM_FACTORY else None

                def judge(probe: tuple, argument: int | None, case: Case = case,
                          scales: dict[str, float] | None = scales) -> Finding | bool | None:
                    return self._judge(subject, probe, case, evidence, scales)

                probe = transform(base.args, name, case.seed)
                for argument, inputs, outcome in within_domain(base.args, probe, floats, judge, subject.conform):
                    label = name if argument is None else f"{name} on argument {argument}"
                    if argument is not None:
                        per_argument.add(name)
                    if outcome is None:
                        rejected.append(f"{label} ({case.label()})")
                        continue
                    probes += 1
                    if outcome is not False:
                        return self._fail(subject, case, name, base.args, inputs, outcome, evidence, argument,
                                          scales)
        if probes == 0:
            return self.skipped("no floating-point inputs to draw from other distributions, and no cases")
        message = f"oracle bound held on {probes} probe(s): {len(DISTRIBUTIONS)} distributions and " \
                  f"{len(FRESH_SEEDS)} fresh seeds x {len(cases)} case(s)"
        if per_argument:
            message += (f"; one argument at a time where the reference rejects all at once: "
                        f"{', '.join(n for n in DISTRIBUTIONS if n in per_argument)}")
        return self.passed(message + rejected_note(rejected), evidence=evidence)

    @staticmethod
    def _judge(subject: Subject, probe: tuple, case: Case, evidence: list | None,
               scales: dict[str, float] | None = None) -> Finding | bool | None:
        """A Finding if the kernel fails on `probe`, False if it passes, None if the reference rejects it
        (`scales`: the output magnitudes each leaf's floor is at least taken of)."""
        outputs = unless_rejected(lambda: (subject.run_reference(clone_tree(probe)), subject.oracle(probe)))
        if outputs is None:
            return None
        reference, oracle = outputs
        finding, leaves = judge_probe(subject, probe, reference, oracle, scales)
        if evidence is not None:
            evidence.extend({"case": case.to_json(), **leaf.to_json()} for leaf in leaves)
        return finding if finding is not None else False

    def _fail(self, subject: Subject, case: Case, name: str, original: tuple, probe: tuple, finding: Finding,
              evidence: list, argument: int | None = None, scales: dict[str, float] | None = None) -> GateResult:
        """Shrink to the fewest values drawn from the distribution, the rest as the factory made them (within
        `argument` when only that one was drawn from it)."""
        positions = [(i, j) for i, a in enumerate(probe) if isinstance(a, torch.Tensor) and a.is_floating_point()
                     and a.numel() > 0 and argument in (None, i) for j in range(a.numel())]
        found = {len(positions): (finding, positions)}

        def mixed(chosen: list[tuple[int, int]]) -> tuple:
            args = list(clone_tree(original))
            for i in {i for i, _ in chosen}:
                flat = torch.tensor([j for k, j in chosen if k == i], device=args[i].device)
                view = args[i].reshape(-1)
                view[flat] = probe[i].reshape(-1)[flat]
                args[i] = view.reshape(args[i].shape)
            return subject.conform(original, tuple(args))

        def fails(chosen: list[tuple[int, int]]) -> bool:
            result = self._judge(subject, mixed(chosen), case, None, scales)
            if isinstance(result, Finding) and result.kind == finding.kind:
                found[len(chosen)] = (result, chosen)
                return True
            return False

        note = ""
        if len(positions) <= SHRINK_MAX_ELEMENTS:
            shrunk = shrink_subset(positions, fails, seconds=min(SHRINK_SECONDS, subject.entry.limits.timeout / 4))
            final, chosen = found[len(shrunk.value)]
            if len(chosen) < len(positions):
                shown = ", ".join(f"argument {i} at {list(index_of(j, tuple(probe[i].shape)))} = "
                                  f"{float(probe[i].reshape(-1)[j]):.6g}" for i, j in chosen[:5])
                more = f" and {len(chosen) - 5} more" if len(chosen) > 5 else ""
                note = (f"; shrunk to {len(chosen)} of {len(positions)} values from it, the rest as the factory "
                        f"made them: {shown}{more} ({shrunk.note()})")
            elif shrunk.complete:
                note = f"; all {len(positions)} values needed (no smaller set of them fails; {shrunk.note()})"
            finding = final
        label = f"distribution {name!r} ({DISTRIBUTIONS[name][0]})"
        if argument is not None:
            label += (f" on argument {argument} alone, the others as the factory made them (the reference rejects "
                      f"it on all arguments at once)")
        return self._report(subject, case, label, finding, evidence, note, argument)

    def _report(self, subject: Subject, case: Case, label: str, finding: Finding, evidence: list,
                note: str, argument: int | None = None) -> GateResult:
        details = {**finding.details, "kind": finding.kind, "distribution": label}
        if argument is not None:
            details["argument"] = argument
        result = self.failed(subject, f"{label}: {finding.message}{note}", case=case, expected=finding.expected,
                             got=finding.got, where=finding.where, broken=finding.broken, evidence=evidence,
                             details=details)
        result.tolerance_free = finding.tolerance_free
        return result


GATE = Distributions
