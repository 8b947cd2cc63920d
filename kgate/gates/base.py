"""The gate interface: one property of a correct kernel, judged with evidence.

A gate subclasses `Gate`, sets `name`, `summary` and `tolerance_free`, and implements
`check(subject) -> GateResult`. It reports through `self.passed`, `self.failed` and `self.skipped`
so every finding has the same shape: what was expected, what came, where, at which case, and a
one-line reproducer. An exception from user code (`UserCodeError`) raised out of `check` becomes the
verdict `error` in the worker; a gate that treats a crash as a failure catches it itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # annotations only: the reports read GateResult without importing torch
    from kgate.inputs import Case
    from kgate.subject import Subject

PASS, FAIL, ERROR, SKIP = "pass", "fail", "error", "skip"


@dataclass
class GateResult:
    gate: str
    verdict: str
    message: str
    tolerance_free: bool
    expected: str | None = None
    got: str | None = None
    where: str | None = None
    case: dict[str, Any] | None = None
    repro: str | None = None
    # Numbers behind a tolerance-based verdict, one per judged (case, output), for `kgate calibrate`.
    evidence: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    broken: bool = False
    # the calls of user code the gate made, by role, with their seconds (`kgate.subject.CallClock`)
    calls: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _json_safe(asdict(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GateResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


class Gate:
    name: ClassVar[str]
    summary: ClassVar[str]
    tolerance_free: ClassVar[bool]

    def check(self, subject: Subject) -> GateResult:
        raise NotImplementedError

    # -- uniform results -----------------------------------------------------------------------------

    def passed(self, message: str, **extra: Any) -> GateResult:
        return GateResult(self.name, PASS, message, self.tolerance_free, **extra)

    def skipped(self, reason: str) -> GateResult:
        return GateResult(self.name, SKIP, reason, self.tolerance_free)

    def failed(self, subject: Subject, message: str, *, case: Case | None, expected: str | None = None,
               got: str | None = None, where: str | None = None, broken: bool | None = None,
               **extra: Any) -> GateResult:
        return GateResult(
            self.name, FAIL, message, self.tolerance_free, expected=expected, got=got, where=where,
            case=case.to_json() if case else None, repro=subject.repro(self.name, case),
            broken=self.tolerance_free if broken is None else broken, **extra)
