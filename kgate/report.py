"""The report: every other output (console table, JUnit, GitHub) is derived from this structure,
which is also what `--json` writes and `kgate calibrate` / `kgate repro` read back."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kgate import __version__
from kgate.gates.base import ERROR, FAIL, PASS, SKIP, GateResult

REPORT_SCHEMA = 1


# Tolerance-based gates whose failure an unwritten output element can cause: what the element holds is
# whatever the memory held, a small number as often as not.
VALUE_GATES = ("oracle", "shapes", "layouts", "distributions", "accumulation")
SEE_INITIALIZATION = "initialization"


def attribute_unwritten(gates: list[GateResult]) -> None:
    """The rule for a kernel whose outputs hold memory it never wrote: the finding is initialization's
    (tolerance-free; its reproducer shows the same two values every time), and each tolerance-based failure
    of the same phase says so, with `details["see"] = "initialization"`: at the shape where initialization
    failed, the error is what that memory held, not the kernel's arithmetic (its reproducer gives another
    value at every call); at another shape, it may be. Verdicts are kept: the kernel did fail those
    gates. Applied once (a result read back from a report is not marked twice)."""
    def phase(gate_id: str) -> tuple[str, str]:
        name, bracket, rest = gate_id.partition("[")
        return name, bracket + rest

    unwritten = {phase(g.gate)[1]: g for g in gates if phase(g.gate)[0] == "initialization" and g.verdict == FAIL}
    for g in gates:
        name, suffix = phase(g.gate)
        init = unwritten.get(suffix)
        if (init is None or name not in VALUE_GATES or g.verdict != FAIL or g.tolerance_free
                or (g.details or {}).get("see") == SEE_INITIALIZATION):
            continue
        shape = (init.case or {}).get("shape")
        where = f"{init.where} at shape {shape}" if shape is not None else str(init.where)
        same = shape is not None and (g.case or {}).get("shape") == shape
        g.details = {**(g.details or {}), "see": SEE_INITIALIZATION}
        g.message += (f"; at this shape the kernel leaves output element(s) unwritten ({init.gate} fails, "
                      f"tolerance-free, first at {where}): this error is what that memory held, not arithmetic"
                      if same else
                      f"; the kernel leaves output element(s) unwritten ({init.gate} fails, tolerance-free, first "
                      f"at {where}): this error may be what that memory held")


@dataclass
class KernelResult:
    name: str
    kernel: str
    reference: str
    device: str
    gates: list[GateResult]
    source_file: str | None = None
    source_line: int | None = None
    manifest_line: int | None = None
    error: str | None = None
    log: str | None = None
    duration_s: float = 0.0
    files: list[str] = field(default_factory=list)
    # what a reader of the verdicts should know of how they were reached (`judged_alone`: gates that outgrew
    # their share of the GPU's memory, judged again alone)
    notes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        attribute_unwritten(self.gates)

    @property
    def verdict(self) -> str:
        verdicts = {g.verdict for g in self.gates}
        if ERROR in verdicts:
            return ERROR
        if FAIL in verdicts:
            return FAIL
        return PASS

    @property
    def violated(self) -> list[GateResult]:
        return [g for g in self.gates if g.verdict in (FAIL, ERROR)]

    @property
    def broken(self) -> bool:
        return any(g.broken for g in self.violated)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gates"] = [g.to_json() for g in self.gates]
        data["verdict"] = self.verdict
        data["broken"] = self.broken
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["gates"] = [GateResult.from_json(g) for g in data.get("gates", [])]
        return cls(**known)


def environment() -> dict[str, Any]:
    from kgate import sandbox

    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "sandbox": sandbox.choose().describe()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001 - the report must be written even if torch is broken
        pass
    return info


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Report:
    manifest: str
    kernels: list[KernelResult]
    started: str = field(default_factory=now)
    finished: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    kgate_version: str = __version__
    schema: int = REPORT_SCHEMA

    @property
    def exit_code(self) -> int:
        return 0 if all(k.verdict == PASS for k in self.kernels) else 1

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, ERROR: 0}
        for k in self.kernels:
            out[k.verdict] += 1
        return out

    def gate_counts(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for k in self.kernels:
            for g in k.gates:
                row = table.setdefault(g.gate, {PASS: 0, FAIL: 0, ERROR: 0, SKIP: 0})
                row[g.verdict] += 1
        return table

    def violated_gates(self) -> list[str]:
        names: list[str] = []
        for k in self.kernels:
            for g in k.violated:
                if g.gate not in names:
                    names.append(g.gate)
        return names

    def judged_alone(self) -> list[KernelResult]:
        """The kernels with gates that outgrew their share of the GPU's memory and were judged again alone."""
        return [k for k in self.kernels if "judged_alone" in k.notes]

    def to_json(self) -> dict[str, Any]:
        counts = self.counts()
        return {
            "schema": self.schema, "kgate_version": self.kgate_version, "manifest": self.manifest,
            "started": self.started, "finished": self.finished, "environment": self.environment,
            "summary": {"kernels": len(self.kernels), "passed": counts[PASS], "failed": counts[FAIL],
                        "errors": counts[ERROR], "broken": sum(k.broken for k in self.kernels),
                        "violated_gates": self.violated_gates(), "exit_code": self.exit_code,
                        "judged_alone": len(self.judged_alone())},
            "kernels": [k.to_json() for k in self.kernels],
        }

    def write(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        return cls(manifest=data.get("manifest", ""), kernels=[KernelResult.from_json(k) for k in data["kernels"]],
                   started=data.get("started", ""), finished=data.get("finished"),
                   environment=data.get("environment", {}), kgate_version=data.get("kgate_version", "?"),
                   schema=data.get("schema", REPORT_SCHEMA))

    @classmethod
    def read(cls, path: str | Path) -> Report:
        from kgate.errors import UsageError

        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"{path}: report not found (write one with `kgate run --json {path}`)") from None
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: not a kgate JSON report: {exc}") from None
        if not isinstance(data, dict) or "kernels" not in data:
            raise UsageError(f"{path}: not a kgate JSON report (no 'kernels')")
        return cls.from_json(data)
