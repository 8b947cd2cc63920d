"""resources: what each compiled GPU kernel of a kernel costs the device, against a declared budget.

Registers per thread, local memory per thread (where register spills go) and shared memory per block
decide how many blocks a GPU keeps resident and whether a kernel spills to slow memory; a change that
doubles a kernel's registers passes every numeric gate. This gate reads them for every compiled kernel
the kernel's code holds, reports them per kernel, and fails the ones over the budget the manifest
declares (`resources: {max_registers: 128, spills: 0, max_shared: 49152}`). Opt-in: not part of `all`;
a kernel gets it by declaring a budget, or by naming it (`gates:`, `--gate resources`). Read from

- Triton: the compiled kernels in the caches of each `triton.jit` function the kernel's module holds
  (autotuned and heuristics wrappers too): `n_regs`, `n_spills` (32-bit words of local memory per
  thread, as Triton's CUDA driver reports them) and `metadata.shared` (bytes);
- CUDA extensions (`load_inline`, `cpp_extension.load`, an imported `.so`): the `Resource usage` table
  of `cuobjdump --dump-resource-usage` on the library (REG, LOCAL, SHARED per function and
  architecture).

Numbers exist only where kernels were compiled for a GPU: with `TRITON_INTERPRET=1` (kgate on the CPU)
and without `cuobjdump`, the gate is skipped, saying why. Tolerance-free: a budget is a count.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from kgate.gates.base import Gate, GateResult
from kgate.subject import Subject

BUDGET_KEYS = {
    "max_registers": "registers per thread",
    "spills": "bytes of local memory per thread (register spills)",
    "max_shared": "bytes of shared memory per block",
}
CUOBJDUMP_TIMEOUT_S = 60.0


@dataclass
class KernelResources:
    """One compiled kernel's resources (None: not reported by its source)."""

    name: str
    source: str  # "triton" or the library cuobjdump read
    registers: int | None
    local_bytes: int | None  # per thread: where spilled registers (and local arrays) live
    shared_bytes: int | None  # per block (static shared memory for CUDA, all of it for Triton)
    arch: str | None = None

    def describe(self) -> str:
        parts = [f"{v} {label}" for v, label in ((self.registers, "registers"), (self.local_bytes, "B local"),
                                                  (self.shared_bytes, "B shared")) if v is not None]
        where = f" ({self.arch})" if self.arch else ""
        return f"{self.name}{where}: {', '.join(parts) or 'no figures'}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- reading them ------------------------------------------------------------------------------------

def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def from_triton(compiled: Any) -> KernelResources:
    """A Triton `CompiledKernel`'s figures (its handles are loaded first: Triton reads registers and spills
    from the driver when it loads the binary)."""
    init = getattr(compiled, "_init_handles", None)
    if callable(init):
        try:
            init()
        except Exception:  # noqa: BLE001 - e.g. out of shared memory: the figures below still say why
            pass
    metadata = getattr(compiled, "metadata", None)
    name = getattr(compiled, "name", None) or getattr(metadata, "name", None) or "triton kernel"
    spills = _int(getattr(compiled, "n_spills", None))
    target = getattr(metadata, "target", None)
    arch = getattr(target, "arch", None)
    return KernelResources(str(name), "triton", _int(getattr(compiled, "n_regs", None)),
                           None if spills is None else 4 * spills, _int(getattr(metadata, "shared", None)),
                           f"sm_{arch}" if isinstance(arch, int) else None)


_ARCH = re.compile(r"^\s*arch\s*=\s*(\S+)", re.MULTILINE)
_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):?\s*$")
_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_cuobjdump(text: str, source: str = "cuobjdump") -> list[KernelResources]:
    """The kernels of `cuobjdump --dump-resource-usage` output: one per function and architecture section
    (a fat binary holds one `Resource usage` table per `arch = sm_XX`)."""
    out: list[KernelResources] = []
    arch: str | None = None
    function: str | None = None
    for line in text.splitlines():
        found = _ARCH.match(line)
        if found:
            arch, function = found.group(1), None
            continue
        found = _FUNCTION.match(line)
        if found:
            function = found.group(1)
            continue
        if function is not None:
            fields = dict(_FIELD.findall(line))
            if "REG" in fields:
                out.append(KernelResources(function, source, int(fields["REG"]), _int(fields.get("LOCAL")),
                                           _int(fields.get("SHARED")), arch))
                function = None
    return out


def cuobjdump(library: str) -> str | None:
    """`cuobjdump --dump-resource-usage LIBRARY`, or None without the tool (or when it fails)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        candidate = os.path.join(home, "bin", "cuobjdump") if home else None
        tool = candidate if candidate and os.access(candidate, os.X_OK) else None
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "--dump-resource-usage", library], capture_output=True, text=True,
                              timeout=CUOBJDUMP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# -- finding them ------------------------------------------------------------------------------------

def _jit_functions(value: Any, seen: set[int]) -> Iterator[Any]:
    """The `triton.jit` functions behind `value` (through autotune/heuristics wrappers' `.fn`)."""
    for _ in range(8):
        if value is None or id(value) in seen:
            return
        seen.add(id(value))
        if hasattr(value, "device_caches") or (hasattr(value, "cache") and hasattr(value, "run")
                                                 and hasattr(value, "signature")):
            yield value
            return
        value = getattr(value, "fn", None) if type(value).__module__.startswith("triton") else None


def triton_kernels(namespaces: Iterable[dict[str, Any]]) -> list[Any]:
    """Every compiled kernel in the caches of the `triton.jit` functions the namespaces hold."""
    seen: set[int] = set()
    compiled: list[Any] = []
    for namespace in namespaces:
        for value in list(namespace.values()):
            for fn in _jit_functions(value, seen):
                caches = getattr(fn, "device_caches", None)
                if caches is not None:  # Triton 3: device -> (kernel cache, ..., target, backend, binder)
                    tables = [entry[0] if isinstance(entry, tuple) else entry for entry in caches.values()]
                else:  # Triton 2: device -> {key: kernel}
                    tables = list(getattr(fn, "cache", {}).values())
                for table in tables:
                    if isinstance(table, dict):
                        compiled.extend(k for k in table.values() if hasattr(k, "metadata"))
    return compiled


def extension_libraries(namespaces: Iterable[dict[str, Any]]) -> list[str]:
    """The shared libraries of the extension modules the namespaces hold (`load_inline` returns one)."""
    found: dict[str, None] = {}
    for namespace in namespaces:
        for value in list(namespace.values()):
            module = value if isinstance(value, types.ModuleType) else sys.modules.get(
                getattr(value, "__module__", "") or "")
            path = getattr(module, "__file__", None) if module is not None else None
            if isinstance(path, str) and path.endswith(".so"):
                found[path] = None
    return list(found)


def namespaces_of(fn: Any) -> list[dict[str, Any]]:
    """Where a kernel's compiled kernels are kept: its module's globals, an `nn.Module`'s attributes and
    its forward's globals (what `kgate.kernelbench.NoGrad` and the like wrap is looked through)."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    todo = [fn]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        for inner in ("model", "fn", "__wrapped__", "forward"):
            todo.append(getattr(obj, inner, None) if not isinstance(obj, types.ModuleType) else None)
        if isinstance(getattr(obj, "__dict__", None), dict):
            out.append(vars(obj))
        globals_ = getattr(obj, "__globals__", None) or getattr(getattr(obj, "__func__", None), "__globals__", None)
        if isinstance(globals_, dict):
            out.append(globals_)
        module = sys.modules.get(getattr(type(obj), "__module__", "") or "")
        if module is not None and not module.__name__.startswith(("torch", "kgate", "builtins")):
            out.append(vars(module))
    return out


def collect(fn: Any) -> tuple[list[KernelResources], list[str]]:
    """The figures of every compiled kernel reachable from `fn` (see module docstring), and notes on what
    could not be read."""
    spaces = namespaces_of(fn)
    found = [from_triton(k) for k in triton_kernels(spaces)]
    notes = []
    for library in extension_libraries(spaces):
        text = cuobjdump(library)
        if text is None:
            notes.append(f"{os.path.basename(library)}: cuobjdump not found or failed")
            continue
        found.extend(parse_cuobjdump(text, os.path.basename(library)))
    return found, notes


# -- the budget --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    max_registers: int | None = None
    spills: int | None = None
    max_shared: int | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> Budget:
        """From a manifest's `resources:` mapping; raises ValueError naming a wrong key or value."""
        data = dict(data or {})
        unknown = sorted(set(data) - set(BUDGET_KEYS))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; known: {', '.join(BUDGET_KEYS)}")
        for key, value in data.items():
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{key}: expected a count >= 0 ({BUDGET_KEYS[key]}), got {value!r}")
        return cls(**data)

    def declared(self) -> bool:
        return any(v is not None for v in asdict(self).values())

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in asdict(self).items() if v is not None) or "none"

    def over(self, kernel: KernelResources) -> list[str]:
        """What of `kernel` is over the budget, one phrase each (a figure the kernel lacks is not judged)."""
        checks = ((kernel.registers, self.max_registers, "registers"), (kernel.local_bytes, self.spills,
                  "bytes of local memory (spills)"), (kernel.shared_bytes, self.max_shared, "bytes of shared memory"))
        return [f"{have} {what} > {limit}" for have, limit, what in checks
                if have is not None and limit is not None and have > limit]


def judge(kernels: list[KernelResources], budget: Budget) -> list[tuple[KernelResources, list[str]]]:
    """The kernels over `budget`, each with what is over."""
    return [(k, over) for k in kernels if (over := budget.over(k))]


def budget_of(subject: Subject) -> Budget:
    """The budget a kernel declares: a `Budget` set on the subject as `resource_budget`, else its manifest's
    `resources:` (the entry's, else the defaults'); none where neither is (an audit's pair)."""
    given = getattr(subject, "resource_budget", None)
    if isinstance(given, Budget):
        return given
    declared = getattr(subject.entry, "resources", None)
    if declared is None:
        return Budget()
    return Budget.from_mapping(declared.model_dump() if hasattr(declared, "model_dump") else dict(declared))


class ResourcesGate(Gate):
    name = "resources"
    summary = "registers, local memory (spills) and shared memory of each compiled kernel within the declared budget"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        budget = budget_of(subject)
        case = subject.cases[0]
        base = subject.baseline(case)
        subject.run_kernel(base.args)  # compiled (and, for Triton, loaded) by now
        kernels, notes = collect(subject.raw_kernel_fn)
        details: dict[str, Any] = {"kernels": [k.to_json() for k in kernels], "budget": asdict(budget),
                                   "notes": notes}
        if not kernels:
            why = ("Triton runs in its interpreter (TRITON_INTERPRET=1)" if os.environ.get("TRITON_INTERPRET") == "1"
                   else "no compiled Triton kernel or CUDA extension was found")
            return self.skipped(f"no compiled GPU kernel to read resources from: {why}"
                                + (f"; {'; '.join(notes)}" if notes else ""))
        over = judge(kernels, budget)
        listed = "; ".join(k.describe() for k in kernels[:6]) + (f"; and {len(kernels) - 6} more" if len(kernels) > 6
                                                                  else "")
        if over:
            first, what = over[0]
            return self.failed(subject, f"{len(over)} of {len(kernels)} compiled kernel(s) over the declared "
                                        f"budget: {first.name} has {', '.join(what)}", case=case,
                               expected=f"every compiled kernel within {budget.describe()}",
                               got="; ".join(f"{k.name}: {', '.join(w)}" for k, w in over[:6]),
                               where=first.name, details=details)
        verdict = f"within {budget.describe()}" if budget.declared() else "no budget declared (resources:)"
        return self.passed(f"{len(kernels)} compiled kernel(s), {verdict}: {listed}", details=details)


GATE = ResourcesGate
