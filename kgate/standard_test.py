"""The field's standard test: KernelBench's own correctness check, replicated (not imported).

KernelBench (`run_and_check_correctness` in its eval module) judges a candidate like this, and so
does this module, step for step:

1. `torch.manual_seed(seed)` (seed 42 by default), then one trial seed per trial drawn as
   `torch.randint(0, 2**32 - 1, (1,))`; 5 trials.
2. Per trial: seed with the trial seed (CPU and current CUDA generator), `get_inputs()`, every floating tensor
   cast to the precision (float32) and moved to the device; the reference model, then the new model
   is called on the same inputs, with a device synchronization after each, all under
   `torch.no_grad()`. (KernelBench casts integer tensors as well, so that a problem with class indices,
   cross-entropy's targets, raises in its own Model there: the one step the replica does otherwise.)
3. An output shape different from the reference's ends the test at once (rejected); an exception from
   the new model ends it at once (rejected, a runtime error); otherwise the trial passes when
   `torch.allclose(output, output_new, atol=tol, rtol=tol)` (so NaN anywhere fails) and the test
   goes on to the next trial.
4. Accepted when every trial passed.

The tolerance was 1e-2 in KernelBench v0/v0.1 (and in the published audit this project starts from);
later versions take it from the precision (1e-4 for float32). Both verdicts come from the same
outputs, so one run records the candidate's fate under each (`accepted_at`).
The models are built the KernelBench way before this runs (`kgate.kernelbench.build_reference`, then
`build_candidate`).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kgate.kernelbench import DEFAULT_SEED, set_seed, to_device

TRIALS = 5
TOLERANCE = 1e-2  # KernelBench v0/v0.1: atol = rtol = 1e-2
TOLERANCES = (1e-2, 1e-4)  # the first decides `verdict`; all are recorded in `accepted_at`

PASS, FAIL, ERROR = "pass", "fail", "error"


@dataclass
class StandardResult:
    verdict: str  # pass (accepted), fail (output mismatch or shape), error (raised or could not load)
    message: str
    trials_passed: int = 0
    trials: int = TRIALS
    tolerance: float = TOLERANCE
    accepted_at: dict[str, bool] = field(default_factory=dict)
    max_difference: list[float] = field(default_factory=list)
    compiled: bool = True
    trace: str | None = None

    @property
    def accepted(self) -> bool:
        return self.verdict == PASS

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["max_difference"] = [d if d == d and abs(d) != float("inf") else str(d) for d in self.max_difference]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StandardResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["max_difference"] = [float(d) for d in known.get("max_difference", [])]
        return cls(**known)


def trial_seeds(seed: int = DEFAULT_SEED, trials: int = TRIALS) -> list[int]:
    """KernelBench's per-trial seeds, drawn from the global generator seeded with `seed`."""
    torch.manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(reference: Any, candidate: Any, get_inputs: Callable[[], Any], device: torch.device | str, *,
        seed: int = DEFAULT_SEED, trials: int = TRIALS, tolerances: tuple[float, ...] = TOLERANCES,
        precision: torch.dtype = torch.float32) -> StandardResult:
    """Judge `candidate` against `reference` exactly as KernelBench's check does (module docstring)."""
    device = torch.device(device)
    primary = tolerances[0]
    passed = {tol: 0 for tol in tolerances}
    diffs: list[float] = []
    mismatch = ""

    def result(verdict: str, message: str) -> StandardResult:
        return StandardResult(verdict, message, passed[primary], trials, primary,
                              {f"{tol:g}": passed[tol] == trials for tol in tolerances}, diffs)

    with torch.no_grad():
        for trial, trial_seed in enumerate(trial_seeds(seed, trials)):
            set_seed(trial_seed)
            inputs = to_device(get_inputs(), device, precision)
            set_seed(trial_seed)
            model = reference.to(device=device, dtype=precision)
            set_seed(trial_seed)
            model_new = candidate.to(device=device, dtype=precision)
            output = model(*inputs)  # the reference raising is the problem's fault: the caller decides
            _sync(device)
            raiser = "ModelNew"
            try:
                output_new = model_new(*inputs)
                _sync(device)
                raiser = "the comparison (torch.allclose)"  # it raises on an output of another dtype
                if output.shape != output_new.shape:
                    return result(FAIL, f"trial {trial}: output shape mismatch: expected {tuple(output.shape)}, "
                                        f"got {tuple(output_new.shape)}")
                for tol in tolerances:
                    if torch.allclose(output, output_new, atol=tol, rtol=tol):
                        passed[tol] += 1
                if not torch.allclose(output, output_new, atol=primary, rtol=primary):
                    diffs.append(float(torch.max(torch.abs(output - output_new)).item()))
                    mismatch = mismatch or f"trial {trial}: output mismatch (max abs difference {diffs[-1]:.6g})"
            except Exception as exc:  # noqa: BLE001 - KernelBench records any exception as a runtime error
                res = result(ERROR, f"trial {trial}: {raiser} raised {type(exc).__name__}: {exc}")
                res.trace = traceback.format_exc()
                return res
    if passed[primary] == trials:
        return result(PASS, f"accepted: {trials}/{trials} trials within atol=rtol={primary:g}")
    return result(FAIL, f"rejected: {passed[primary]}/{trials} trials within atol=rtol={primary:g}; {mismatch}")


def not_loaded(message: str, *, compiled: bool) -> StandardResult:
    """The verdict when the candidate never got to run (import, compile or construction failed)."""
    return StandardResult(ERROR, message, 0, TRIALS, TOLERANCE, {f"{t:g}": False for t in TOLERANCES},
                          compiled=compiled)
