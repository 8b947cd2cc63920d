"""bounds: the kernel reads and writes only the tensors it is given and the ones it allocates.
Tolerance-free.

Every tensor argument is copied into the middle of a larger buffer (same shape and strides) whose
other bytes, the guard bands, hold a known byte; every tensor the kernel allocates through the
dispatcher during the call gets the same treatment (`AllocationHook` of the initialization gate). The
kernel runs twice, with guard bytes 0xFF (NaN) and 0xA5. It fails when
- a guard band changed (a write before, after or between the strided elements of a tensor), or
- its outputs differ between the two runs (it read guard bytes: an out-of-bounds read), unless the
  manifest declares it `nondeterministic` or three more runs of each guard byte show the difference
  is chance (a run that differs from its own byte's first, or matches the other's: `follows_filling`).
Writes are caught only where they land in a guard band (4 KiB on each side), and allocations that
bypass the dispatcher are not guarded.

On a GPU, when `compute-sanitizer` is on PATH (or in $CUDA_HOME/bin), the kernel is also run once,
within a 240 s budget, under each tool of
`KGATE_SANITIZER_TOOLS` (default memcheck,racecheck,synccheck; initcheck is opt-in, the
initialization gate already judges unwritten outputs) in a subprocess that loads this kernel the way
the worker does; any error a tool reports fails the gate, but one: racecheck and synccheck judge the code
of a kernel (a shared-memory hazard, a barrier misused, inside it), not what its caller passes, so where
every hazard of such a report lies at a code site (kernel and offset) that a baseline's report under the
same tool names too, the report is the platform's: it is noted and does not fail the gate. The baselines,
each run only where the one before leaves a site unmatched: the reference on the same case (cuBLAS's `nvjet_*`
kernel behind a matmul both call), then the ATen operators the kernel's own call ran, recorded at the
dispatcher in one more call of the kernel outside the sanitizer (the judged runs stay unwatched: a dispatch
mode can change what torch.compile runs) and replayed on fresh tensors of the same shapes, strides and
dtypes in a process that never loads the candidate (`kgate/replay.py`; Liger's chunked matmuls reach another cuBLAS kernel than the
reference's whole product). Neither runs the candidate's code, and a kernel of the candidate's named after
a library's races at other offsets, so neither sets its report aside. memcheck's reports always
count, since a bad argument can make any kernel read or write out of bounds. `KGATE_SANITIZER=0` turns it
off (`kgate selftest` turns it off unless given --sanitizer).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten
from kgate.gates.base import Gate, GateResult
from kgate.gates.initialization import NAN_BYTE, SENTINEL_BYTE, AllocationHook, Guarded, follows_filling
from kgate.gates.layouts import EVERY_OTHER, describe_layout, fresh_copy, relayout
from kgate.inputs import Case
from kgate.subject import Subject, UserCodeError, synchronize

GUARD_BYTES = 4096
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
SANITIZER_BUDGET_S = 240.0  # for all tools together, so the gate stays inside the runner's time limit
_ERRORS_RE = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error", re.IGNORECASE)
# racecheck's summary: "RACECHECK SUMMARY: 5 hazards displayed (16 errors, 0 warnings)"
_HAZARDS_RE = re.compile(r"SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?", re.IGNORECASE)
# where a report line names the code: "... access at nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT+0xa50"
_AT_RE = re.compile(r"\bat\s+(?:void\s+)?(.+?\+0x[0-9a-fA-F]+)")
# tools whose reports judge a kernel's own code, not what it was given
CODE_TOOLS = ("racecheck", "synccheck")
PRINT_LIMIT = 100  # reports printed per tool: all of them must be seen to set a report aside


def hazard_sites(text: str) -> set[str] | None:
    """Where the hazards of a racecheck/synccheck report `text` lie, each a kernel and an offset in its code
    (`nvjet_sm90_tst_256x64_64x5_2x1_v_bz_TNT+0xa50`), or None when it printed fewer hazards than it counted
    (the ones not printed could lie anywhere)."""
    summary = _HAZARDS_RE.search(text)
    if summary and int(summary.group(1)) < int(summary.group(2)):
        return None
    return {m.group(1).strip() for line in text.splitlines() if line.startswith("=========")
            for m in _AT_RE.finditer(line)}


def platform_hazards(tool: str, text: str, baselines: list[str | None]) -> list[str] | None:
    """The kernels of the candidate's racecheck/synccheck report `text` when every hazard site in it (kernel and
    code offset) is one that a baseline's report under the same tool names too (`baselines`: the reference's
    run, the replay of the torch operators the candidate called; None for one not run; a baseline that
    printed fewer hazards than it counted adds nothing): the report is the platform's. Else None (it counts
    against the candidate). Sites, not names alone: a kernel of the candidate's that took a library kernel's
    name would race at other offsets."""
    if tool not in CODE_TOOLS:
        return None
    sites = hazard_sites(text)
    platform: set[str] = set()
    for baseline in baselines:
        platform |= (hazard_sites(baseline) if baseline is not None else None) or set()
    if not sites or not sites <= platform:
        return None
    return sorted({site.rsplit("+0x", 1)[0] for site in sites})


def guard_args(args: tuple, byte: int, inplace: set[int]) -> tuple[tuple, list[tuple[int, Guarded]]]:
    """Copies of `args` whose tensors sit inside guarded buffers; returns (args, [(index, guard)])."""
    out: list[Any] = []
    guards: list[tuple[int, Guarded]] = []
    for i, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor) or arg.layout != torch.strided or arg.numel() == 0:
            out.append(clone_tree(arg))
            continue
        try:
            label = f"argument {i}" + (" (declared in-place)" if i in inplace else "")
            guarded = Guarded(arg, GUARD_BYTES, byte, label)
            guarded.view.copy_(arg)
        except RuntimeError:  # overlapping strides (expanded inputs) cannot be copied into: left unguarded
            out.append(clone_tree(arg))
            continue
        out.append(guarded.view)
        guards.append((i, guarded))
    return tuple(out), guards


def guard_writes(guards: list[tuple[int, Guarded]], hook: AllocationHook) -> tuple[list[tuple[str, str]], str]:
    """The changed guard bands after a guarded call, (label, what changed) each, and the message's "(and N
    more)" tail."""
    problems = [(g.label, msg) for g in [g for _, g in guards] + hook.guarded if (msg := g.check())]
    return problems, f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""


class Bounds(Gate):
    name = "bounds"
    summary = "no read or write outside the given and allocated tensors (guard bands; compute-sanitizer on GPU)"
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        cases = subject.first_seed_cases()
        notes: list[str] = []
        for case in cases:
            base = subject.baseline(case)
            runs = []
            for byte in (NAN_BYTE, SENTINEL_BYTE):
                out, args, guards, hook = self.run_guarded(subject, base.args, byte)
                problems, more = guard_writes(guards, hook)
                if problems:
                    return self.failed(subject, f"out-of-bounds write: {problems[0][1]}{more}", case=case,
                                       expected="guard bands untouched", got="guard bytes changed",
                                       where=problems[0][0], details={"writes": [m for _, m in problems],
                                                                      "guard_byte": f"0x{byte:02X}"})
                runs.append(self.leaves(subject, out, args))
            found = self.strided_writes(subject, case, base.args, notes)
            if found is not None:
                return found
            if subject.nondeterministic:
                notes.append("nondeterministic: reads not judged")
                continue
            for (path, a), (_, b) in zip(*runs):
                mismatch = bitwise_mismatch(a, b)
                if mismatch is None:
                    continue
                if not follows_filling(functools.partial(self.guarded_leaves, subject, base.args), *runs):
                    notes.append("the kernel is not deterministic (judged by the determinism gate), so reads "
                                 "were not judged")
                    break
                return self.failed(
                    subject, f"out-of-bounds read: {path} depends on the bytes around the tensors "
                    f"(guard 0x{NAN_BYTE:02X} vs 0x{SENTINEL_BYTE:02X}): {mismatch.describe()}",
                    case=case, expected=repr(mismatch.expected), got=repr(mismatch.got),
                    where=f"{path}{list(mismatch.index)}", details={"differing": mismatch.count})
        sanitizer = self.sanitize(subject, cases[0]) if cases else None
        if sanitizer is not None and sanitizer.get("errors"):
            tool = sanitizer["errors"][0]
            return self.failed(subject, f"compute-sanitizer {tool['tool']} reported {tool['count']} error(s): "
                               f"{tool['first']}", case=cases[0], expected="0 errors",
                               got=f"{tool['count']} error(s)", where=tool["tool"], details={"sanitizer": sanitizer})
        if sanitizer is not None:
            notes.append(sanitizer["note"])
        extra = f"; {'; '.join(dict.fromkeys(notes))}" if notes else ""
        return self.passed(f"guard bands of inputs and kernel allocations untouched and outputs independent "
                           f"of them in {len(cases)} case(s){extra}",
                           details={"sanitizer": sanitizer} if sanitizer else {})

    def strided_writes(self, subject: Subject, case: Case, base_args: tuple, notes: list[str]) -> GateResult | None:
        """The write check once more with every tensor argument at every other element (a stride-2 view, as
        the layouts gate makes it), where the reference accepts that layout: a kernel that computes its
        stores from its inputs' strides but applies them to memory of other strides (a dense output it
        allocated, FlagGems' scatter) writes past that memory only for such inputs. Reads are not judged
        here (the layouts gate compares the values)."""
        strided = tuple(relayout(a, EVERY_OTHER) if isinstance(a, torch.Tensor) and a.dim() >= 1 else None
                        for a in base_args)
        if all(s is None for s in strided):
            return None
        args = tuple(a if s is None else s for a, s in zip(base_args, strided))
        try:
            subject.run_reference(tuple(clone_tree(a) if s is None else fresh_copy(s) for a, s in zip(base_args, strided)))
        except UserCodeError as exc:
            if not exc.role.startswith("reference"):
                raise
            notes.append("strided inputs not tried (the reference rejects them)")
            return None
        try:
            _, _, guards, hook = self.run_guarded(subject, args, NAN_BYTE)
        except UserCodeError as exc:
            if exc.role != "kernel":
                raise
            notes.append(f"strided inputs: the kernel raised {type(exc.exc).__name__} (the layouts gate judges it)")
            return None
        problems, more = guard_writes(guards, hook)
        if not problems:
            return None
        layout = ", ".join(f"argument {i} {describe_layout(s)}" for i, s in enumerate(strided) if s is not None)
        return self.failed(subject, f"out-of-bounds write with every tensor argument at every other element "
                           f"({layout}): {problems[0][1]}{more}; with contiguous arguments the guard bands stay "
                           "untouched", case=case, expected="guard bands untouched", got="guard bytes changed",
                           where=problems[0][0], details={"writes": [m for _, m in problems],
                                                          "guard_byte": f"0x{NAN_BYTE:02X}", "layout": EVERY_OTHER})

    def run_guarded(self, subject: Subject, base_args: tuple, byte: int) -> tuple[Any, tuple, list, AllocationHook]:
        args, guards = guard_args(base_args, byte, subject.inplace)
        hook = AllocationHook(guard_bytes=GUARD_BYTES, guard_byte=byte)
        with hook:
            out = subject.run_kernel(args)
        synchronize(subject.device)
        return out, args, guards, hook

    def guarded_leaves(self, subject: Subject, base_args: tuple, byte: int) -> list[tuple[str, torch.Tensor]]:
        out, args, _, _ = self.run_guarded(subject, base_args, byte)
        return self.leaves(subject, out, args)

    def leaves(self, subject: Subject, out: Any, args: tuple) -> list[tuple[str, torch.Tensor]]:
        leaves = [(p, t.detach().clone()) for p, t in flatten(out) if isinstance(t, torch.Tensor)]
        return leaves + [(f"args[{i}]", args[i].detach().clone()) for i in sorted(subject.inplace)
                         if i < len(args) and isinstance(args[i], torch.Tensor)]

    # -- compute-sanitizer ---------------------------------------------------------------------------

    def sanitize(self, subject: Subject, case: Case) -> dict[str, Any] | None:
        """Run the kernel once per tool under compute-sanitizer; None when not applicable."""
        if subject.device.type != "cuda":
            return {"note": "compute-sanitizer: skipped (not a CUDA run)", "errors": [], "ran": []}
        if os.environ.get("KGATE_SANITIZER", "1") == "0":
            return {"note": "compute-sanitizer: skipped (KGATE_SANITIZER=0)", "errors": [], "ran": []}
        exe = shutil.which("compute-sanitizer") or _cuda_home_sanitizer()
        if exe is None:
            return {"note": "compute-sanitizer: skipped (not installed: put it on PATH to run it)",
                    "errors": [], "ran": []}
        manifest = getattr(getattr(subject.entry, "manifest", None), "path", None)
        if manifest is None or not Path(manifest).exists():
            return {"note": "compute-sanitizer: skipped (no manifest file to reload the kernel from)",
                    "errors": [], "ran": []}
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="kgate-ops-", delete=False) as f:
            ops = f.name  # the torch operators the kernel's call ran (kgate/replay.py), written by its run
        try:
            return self._sanitize_tools(subject, case, exe, manifest, ops)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(ops)

    def _sanitize_tools(self, subject: Subject, case: Case, exe: str, manifest: Any, ops: str) -> dict[str, Any]:
        tools = [t.strip() for t in os.environ.get("KGATE_SANITIZER_TOOLS", ",".join(SANITIZER_TOOLS)).split(",")
                 if t.strip()]
        job = {"manifest": str(Path(manifest).resolve()), "kernel": subject.name, "device": str(subject.device),
               "case": case.to_json(), "ops": ops}
        errors, ran, notes = [], [], []
        deadline = time.monotonic() + SANITIZER_BUDGET_S
        from kgate.sandbox import kgate_command

        def run(tool: str | None, call: str) -> tuple[str, int] | None:
            """Output and exit code of one tool over one call of the kernel (or the reference, the recording call,
            the replay; no tool: outside the sanitizer); None on time out."""
            with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="kgate-sanitize-", delete=False) as f:
                json.dump({**job, "call": call}, f)
            try:
                left = deadline - time.monotonic()
                sanitizer = [exe, "--tool", tool, "--error-exitcode", "86", "--print-limit", str(PRINT_LIMIT)] \
                    if tool else []
                cmd = [*sanitizer, *kgate_command("kgate.gates.bounds", f.name)]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(left, 1),
                                      cwd=str(Path(job["manifest"]).parent), stdin=subprocess.DEVNULL)
                return proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired:
                return None
            finally:
                os.unlink(f.name)

        @functools.cache
        def recorded() -> bool:
            """Whether the recording call ran: the kernel's call once more, outside the sanitizer, its torch
            operators recorded (once, the first time a replay is asked). The judged runs stay unwatched: a
            dispatch mode can change what torch.compile runs."""
            made = run(None, "record")
            return made is not None and made[1] == 0

        for tool in tools:
            left = deadline - time.monotonic()
            if left < 5:
                notes.append(f"{tool} not run (the {SANITIZER_BUDGET_S:g} s sanitizer budget is spent)")
                continue
            got = run(tool, "kernel")
            if got is None:
                notes.append(f"{tool} timed out after {left:.0f} s (not judged)")
                continue
            ran.append(tool)
            text, returncode = got
            match = _ERRORS_RE.search(text)
            hazards = _HAZARDS_RE.search(text)
            count = (int(match.group(1)) if match else int(hazards.group(2)) if hazards
                     else (1 if returncode == 86 else 0))
            if returncode not in (0, 86) and not (match or hazards):
                notes.append(f"{tool} could not run the kernel (exit {returncode}): {text.strip()[-300:]}")
                continue
            seen: dict[str, str | None] = {}  # each baseline's report (its tail, for the error's details)
            if count and tool in CODE_TOOLS:
                # the baselines, each asked only where the ones before leave a hazard site of the kernel's unmatched
                baselines: list[str | None] = []
                platform: list[str] | None = None
                for call, whose in (("reference", "the reference runs into as well"),
                                    ("replay", "torch's operators reach as well, called as the kernel called them")):
                    if deadline - time.monotonic() < 5:
                        break
                    if call == "replay" and not recorded():
                        break
                    baseline = run(tool, call)
                    baselines.append(baseline[0] if baseline else None)
                    seen[call] = baseline[0][-1500:] if baseline else None
                    platform = platform_hazards(tool, text, baselines)
                    if platform:
                        notes.append(f"{tool} reported {count} hazard(s), every one inside a kernel {whose} "
                                     f"({', '.join(platform[:2])}): the platform's, not the kernel's")
                        break
                if platform:
                    continue
            if count:
                first = next((ln.strip() for ln in text.splitlines() if ln.startswith("=========") and
                              ("Invalid" in ln or "Race" in ln or "Error" in ln or "error" in ln)), text[-300:])
                errors.append({"tool": tool, "count": count, "first": first.strip("= ").strip(),
                               "output": text[-4000:], **({"baselines": seen} if seen else {})})
        reported = {e["tool"] for e in errors}
        clean = [t for t in ran if t not in reported]
        note = (f"compute-sanitizer: {', '.join(clean) or 'no tool'} clean"
                + (f"; {', '.join(sorted(reported))} reported errors" if reported else "")
                + (f"; {'; '.join(notes)}" if notes else ""))
        return {"note": note, "errors": errors, "ran": ran, "problems": notes}


def _cuda_home_sanitizer() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    path = Path(home) / "bin" / "compute-sanitizer"
    return str(path) if path.exists() else None


def _sanitize_main(job_path: str) -> int:
    """Entry point of the subprocess compute-sanitizer watches: load the kernel as the worker does and
    call it once on the recorded case."""
    from kgate.inputs import InputFactory
    from kgate.loading import resolve
    from kgate.manifest import Ref, load

    job = json.loads(Path(job_path).read_text())
    if job.get("call") == "replay":  # torch's operators only: the candidate's code is never loaded here
        from kgate.replay import replay

        replay(job["ops"])
        return 0
    manifest = load(job["manifest"], check_files=False)
    kernel = manifest.by_name(job["kernel"])
    resolve(kernel.reference, "reference", manifest.base)
    source = resolve(kernel.inputs, "inputs", manifest.base) if isinstance(kernel.inputs, Ref) else kernel.inputs
    kernel_fn = resolve(kernel.reference if job.get("call") == "reference" else kernel.kernel, "kernel",
                        manifest.base)
    c = job["case"]
    case = Case(tuple(c["shape"]) if c["shape"] is not None else None, c["dtype"], c["seed"])
    device = torch.device(job["device"])
    args = InputFactory(source)(case, device)
    if job.get("call") == "record":  # outside the sanitizer: the torch operators the kernel's call runs
        from kgate.replay import record

        record(kernel_fn, args, job["ops"])
    else:
        kernel_fn(*args)
    synchronize(device)
    return 0


GATE = Bounds

if __name__ == "__main__":
    sys.exit(_sanitize_main(sys.argv[1]))
