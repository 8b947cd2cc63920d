"""Judging one KernelBench pair from the parent side: the compile stage and the evaluation stage, each
in a worker process under the runner's limits (`kgate.runner.supervise`).

The evaluation of a pair survives its own hostility: a crash (segfault, os._exit) or a sticky CUDA
error (illegal address, which poisons the process's CUDA context) ends that worker, and a fresh one
runs the gates not yet judged (up to `max_restarts` times); the gate it died in keeps the cause as
its `error`. A hang or memory blow-up is killed and not retried. The result is one JSON record.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgate import gates as registry
from kgate.audit.turns import open_turns
from kgate.gates.base import GateResult
from kgate.kernelbench import WORK_ELEMENTS, Pair, gate_ids, repro_command, source_digest
from kgate.runner import _exit_cause, _tail, detached_result, supervise
from kgate.shares import MEMORY_LIMIT, at_memory_limit, out_of_gpu_memory
from kgate.standard_test import StandardResult, not_loaded

COMPILE_MARKERS = ("load_inline", "cpp_extension", "load(")
# The candidate needs what this machine lacks (a CUDA toolkit or GPU): not a verdict on the candidate.
ENVIRONMENT = re.compile(r"CUDA_HOME environment variable is not set|Torch not compiled with CUDA enabled|"
                         r"Found no NVIDIA driver|No CUDA GPUs are available|no CUDA-capable device", re.IGNORECASE)


@dataclass
class AuditOptions:
    gates: list[str]
    out_dir: Path
    timeout: float = 300.0  # per stage (loading + standard test, each gate)
    memory: int = 32 * 2**30  # resident memory of one worker
    compile_timeout: float = 900.0
    compile_memory: int = 16 * 2**30
    seed: int = 42
    gate_seeds: list[int] = field(default_factory=lambda: [0, 1])
    repro_args: list[str] = field(default_factory=list)
    threads: int | None = None  # torch threads per worker (CPU)
    arch_list: str | None = None  # TORCH_CUDA_ARCH_LIST shared by both stages
    max_restarts: int = 2
    standard: bool = True
    work_elements: int = WORK_ELEMENTS  # 0: every gate at the problem's own shape
    pch: bool = False  # workers keep the parent's precompiled torch/extension.h (kgate.audit.pch)
    corpus: list[str] = field(default_factory=list)  # the problems' and candidates' folders: a worker reads them
    dtypes: list[str] = field(default_factory=lambda: ["float32"])  # --dtypes: the precisions judged
    # no --dtypes: each problem at the precision of its own inputs where that is float16/bfloat16 throughout
    # (kgate.audit.worker.own_precision), its results under the plain gate names
    own_precision: bool = False
    cache_dir: Path | None = None  # --cache: where the candidates' builds are kept (default out_dir)

    @property
    def gate_ids(self) -> list[str]:
        """The result ids each record holds (one per gate and precision beyond the default float32)."""
        return gate_ids(self.gates, self.dtypes)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "out_dir": str(self.out_dir),
                "cache_dir": None if self.cache_dir is None else str(self.cache_dir)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditOptions:
        cache = data.get("cache_dir")
        return cls(**{**data, "out_dir": Path(data["out_dir"]), "cache_dir": None if cache is None else Path(cache)})


def needs_compile(pair: Pair) -> bool:
    """Whether the candidate builds a C++/CUDA extension when imported (so the compile stage helps)."""
    try:
        text = pair.candidate.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(marker in text for marker in COMPILE_MARKERS[:2])


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def turn_folder(out_dir: Path, device: str) -> Path:
    """Where one device's turn files live (kgate.audit.turns, --prestart)."""
    return out_dir / "turns" / _safe(device)


def worker_env(pair: Pair, options: AuditOptions, *, gpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    # One extension folder per candidate source: no two candidates' same-named extensions collide, and a
    # candidate compiled once (compile stage, an earlier run) is loaded, not rebuilt.
    # The same for Triton's cache: a candidate that could write into another's cache could leave a forged
    # binary under that one's key. These two are the only folders a sandboxed worker writes (caches()).
    digest = source_digest(pair.candidate)
    cache = options.cache_dir or options.out_dir
    env["TORCH_EXTENSIONS_DIR"] = str((cache / "torch_extensions" / digest).resolve())
    env["TRITON_CACHE_DIR"] = str((cache / "triton_cache" / digest).resolve())
    if options.arch_list and "TORCH_CUDA_ARCH_LIST" not in os.environ:
        env["TORCH_CUDA_ARCH_LIST"] = options.arch_list
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("MAX_JOBS", "2")
    return env


def caches(env: dict[str, str]) -> list[Path]:
    """The folders of a worker's environment (worker_env) that it writes: its candidate's own build caches."""
    return [Path(env[k]) for k in ("TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR")]


def sources(pair: Pair, options: AuditOptions) -> list[Path]:
    """The folders a worker for `pair` reads (all of them read-only): its candidate's, its problem's, and the
    corpus's own folders (a candidate may import a module of the corpus's from a folder above its own)."""
    return [p.parent.resolve() for p in (pair.candidate, pair.problem) if p is not None] + [
        Path(p) for p in options.corpus]


def pin_gpu(device: str, env: dict[str, str]) -> str:
    """The device a worker for `device` is told to use, with `env` (its environment) changed so that it sees
    that one GPU only: CUDA_VISIBLE_DEVICES names it alone (through this process's own list, where one is set)
    and inside the worker it is cuda:0. So a candidate that allocates on 'cuda' or calls .cuda() with no
    index, one that names cuda:0 in its code, or one that reaches for another GPU on purpose, runs on (or
    finds only) the GPU it was given: on several GPUs its verdict cannot depend on which one that was, nor
    can it take a neighbour's memory. 'cpu' and 'cuda' (no index) are left as they are."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index.isdigit():
        return device
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in listed.split(",")] if listed else None
    if ids is not None and int(index) >= len(ids):
        return device  # not a visible device: the worker says so
    env["CUDA_VISIBLE_DEVICES"] = ids[int(index)] if ids is not None else index
    return "cuda:0"


def clear_stale_locks(pair: Pair, options: AuditOptions) -> list[Path]:
    """Remove the build locks left in the candidate's extension folder by a build that was killed (a
    time limit, a stopped audit): torch waits forever for such a lock, so the next build would hang to
    its time limit and be recorded as a failure. Safe because one candidate is built or judged by one
    job at a time. Returns what was removed."""
    folder = Path(worker_env(pair, options, gpu=False)["TORCH_EXTENSIONS_DIR"])
    removed = []
    for lock in folder.glob("*/lock") if folder.is_dir() else []:
        try:
            lock.unlink()
            removed.append(lock)
        except OSError:
            pass
    return removed


def compile_pair(pair: Pair, options: AuditOptions, *, cancel: threading.Event | None = None) -> dict[str, Any]:
    """Import the candidate with no GPU visible so load_inline builds its extension on the CPU."""
    clear_stale_locks(pair, options)
    outcome: dict[str, Any] = {"ok": False, "seconds": 0.0, "build_failed": False, "message": ""}
    job = {"stage": "compile", "id": pair.id, "candidate": str(pair.candidate.resolve()), "device": "cpu",
           "memory": options.compile_memory, "pch": options.pch,
           "problem": str(pair.problem.resolve()) if pair.problem else None}  # the candidate's first globals

    def on_event(event: dict[str, Any]) -> str | None:
        if event.get("event") == "compiled":
            outcome.update({k: event.get(k) for k in ("ok", "seconds", "build_failed", "message")})
        return None

    log = options.out_dir / "logs" / f"{_safe(pair.id)}.compile.log"
    start = time.perf_counter()
    env = worker_env(pair, options, gpu=False)
    exit_ = supervise("kgate.audit.worker", job, log_path=log, cwd=pair.candidate.parent.resolve(),
                      timeout=options.compile_timeout, memory=options.compile_memory, on_event=on_event,
                      env=env, cancel=cancel, readable=sources(pair, options), writable=caches(env))
    outcome["wall_s"] = round(time.perf_counter() - start, 3)
    if exit_.error:
        outcome.update(ok=False, build_failed=True, message=f"compile stage {exit_.error}")
    elif exit_.returncode not in (0, None) and not outcome["seconds"]:
        cause = exit_.fatal or _exit_cause(exit_.returncode, exit_.peak_memory)
        outcome.update(ok=False, message=f"compile stage: {cause}")
    return outcome


# Seconds to import one problem and count its inputs and layers on the meta device (the worker's `sizes`)
SIZE_TIMEOUT_S = 30.0
# What a problem's size costs, for the judging order only (kgate.audit.scheduler.longest_first), measured on
# the H200: the standard test 30.7 s per G input elements (KernelBench draws its inputs on the CPU; fit over
# 309 audit records, bench/standard_test_cost.py); the gates about 0.8 s per weighted layer (the
# accumulation gate emulates each layer's products: 82 s for the 103 of level 3 problem 16, a DenseNet, in
# docs/records/2026-12-04-h200-c9a90fc/audit-throughput.json) and about 30 s per G parameter elements (the
# gates convert, save and change every weight: on one H100, docs/records/2026-12-06-h100-f87acb7/, the two
# problems of 0.67 and 1.07 G parameter elements took 109 and 100 s, 65 and 69 of it in isolation, whose
# changes of the weights were drawn on the host then; a problem that large must not start last)
STANDARD_S_PER_ELEMENT = 30.7e-9
GATES_S_PER_LAYER = 0.8
GATES_S_PER_PARAMETER = 30e-9


@dataclass(frozen=True)
class ProblemSize:
    elements: int | None  # in get_inputs() at the problem's own shape
    layers: int | None  # leaf modules of Model holding a weight (a parameter of >= 2 dimensions)
    parameters: int | None = None  # elements of Model's parameters and buffers

    def seconds(self, gates: bool) -> float | None:
        """A rough cost to order the judging by (None: nothing was counted)."""
        if self.elements is None and self.layers is None and self.parameters is None:
            return None
        standard = STANDARD_S_PER_ELEMENT * (self.elements or 0)
        if not gates:
            return standard
        return standard + GATES_S_PER_LAYER * (self.layers or 0) + GATES_S_PER_PARAMETER * (self.parameters or 0)


def problem_sizes(problems: list[Path], options: AuditOptions) -> dict[Path, ProblemSize]:
    """Each problem's size, counted in a worker of kgate's own with no GPU visible (the problems' code runs
    there, under a time and memory limit, not in this process). A problem that cannot be counted (it
    raised, hung, or took its worker down: the next worker goes on with the problems after it) is left out."""
    sizes: dict[Path, ProblemSize] = {}
    left = [str(p.resolve()) for p in dict.fromkeys(problems)]
    back = {str(p.resolve()): p for p in problems}
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    counted = 0
    while left:
        current: list[str | None] = [None]

        def on_event(event: dict[str, Any], current: list[str | None] = current) -> str | None:
            problem = event.get("problem")
            if problem not in back:
                return None
            if event.get("event") == "sizing":
                current[0] = problem
                return f"counting the inputs of {problem}"
            if event.get("event") == "size":
                numbers = [event.get(k) if isinstance(event.get(k), int) and event[k] >= 0 else None
                           for k in ("elements", "layers", "parameters")]
                sizes[back[problem]] = ProblemSize(*numbers)
                current[0] = None
                return ""
            return None

        supervise("kgate.audit.worker", {"stage": "sizes", "problems": left, "device": "cpu",
                                         "memory": options.memory},
                  log_path=options.out_dir / "logs" / "problem-sizes.log", cwd=Path(left[0]).parent,
                  timeout=SIZE_TIMEOUT_S, memory=options.memory, on_event=on_event, env=env,
                  append_log=counted > 0, readable=sorted({Path(p).parent for p in left}))
        counted += 1
        stuck = current[0]
        done = {p for p in left if back[p] in sizes} | ({stuck} if stuck else set())
        if not done:  # the worker did not start: no order to be had
            break
        left = [p for p in left if p not in done]
    return sizes


def _memory_limited(result: dict[str, Any] | None) -> bool:
    """A standard-test or gate result (JSON) whose message or trace says it ran out of GPU memory or past
    the worker's host memory limit."""
    text = f"{(result or {}).get('message') or ''} {(result or {}).get('trace') or ''}"
    return at_memory_limit(text)


def kept_standard(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The standard test's result of an earlier try of a pair, when it still holds for a try with more
    memory: it ended with a verdict, untouched by a memory limit (what outgrew the share came after it,
    most often the float64 oracle). On the corpus's giants the standard test is nearly all of a
    candidate's time (55-100 s on the H200, its inputs drawn on the CPU), the gates a few seconds."""
    standard = (record or {}).get("standard") or {}
    if standard.get("verdict") not in ("pass", "fail") or _memory_limited(standard):
        return None
    return standard


def outgrew(record: dict[str, Any]) -> str:
    """Where an earlier try ran out of its share (GPU memory, or the host memory limit): the standard test
    and the gates whose messages say so, for the record of the try with more memory."""
    where = (["the standard test"] if _memory_limited(record.get("standard")) else []) + [
        g["gate"] for g in record.get("gates") or [] if g.get("verdict") == "error" and _memory_limited(g)]
    return ", ".join(where) or "(not said)"


def needs_whole_gpu(record: dict[str, Any]) -> bool:
    """Whether a candidate judged while sharing a GPU must be judged again with the whole GPU: it ran out
    of GPU memory, or past its host memory limit (a float64 oracle too large for its share of the GPU
    moves to the CPU), either of which a neighbour's share can cause."""
    return bool(record.get("oom") or record.get("host_memory"))


def pair_digest(pair: Pair) -> str:
    """What a pair's record was judged on: its candidate's and its problem's files (audit --resume judges again
    a candidate whose record says otherwise)."""
    return source_digest(*[p for p in (pair.candidate, pair.problem) if p is not None])


@functools.cache
def kgate_stamp() -> dict[str, str]:
    """Which kgate judged a record: its version and a digest of its own source files (the gates' code,
    not the control catalogue an installed kgate carries in `kgate/catalogue`: a checkout and a wheel of
    one commit give one digest), so that a report joined from several runs (an audit resumed with --resume) can say
    whether every record comes from the same kgate."""
    import kgate

    return {"version": kgate.__version__, "source": package_digest(Path(kgate.__file__).resolve().parent)}


def package_digest(root: Path) -> str:
    """The digest of the Python files under `root`, a kgate package, less its `catalogue` folder."""
    return source_digest(*sorted(p for p in root.rglob("*.py") if p.relative_to(root).parts[0] != "catalogue"))


def evaluate_pair(pair: Pair, options: AuditOptions, device: str, *, gpu_memory_fraction: float | None = None,
                  compiled: dict[str, Any] | None = None, cancel: threading.Event | None = None,
                  turns: dict[str, Any] | None = None, earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """The standard test and the gates for one pair; returns the audit record (never raises for user code).
    `turns` ({"path", "count"}, kgate.audit.turns): the worker waits for a turn on the device before it
    loads the candidate, untimed (--prestart). `earlier`: the record of a try in a smaller share of the
    GPU's memory; its standard test stands when no memory limit touched it (kept_standard), and so does
    a tampering it saw; the gates run again."""
    started = time.perf_counter()
    names = options.gate_ids
    record: dict[str, Any] = {"id": pair.id, "candidate": str(pair.candidate), "problem": str(pair.problem or ""),
                              "problem_name": pair.problem_name, "level": pair.level, "labels": pair.labels,
                              "device": device, "compile": compiled, "standard": None, "gates": [], "error": None,
                              "problem_error": None, "tamper": None, "free_dims": None, "notes": {},
                              "load_s": None, "standard_s": None, "restarts": 0, "oom": False, "complete": True,
                              "repro": repro_command(options.repro_args, pair.id, None), "kgate": dict(kgate_stamp()),
                              "sources": pair_digest(pair),
                              "timeline": {}}
    results: dict[str, GateResult] = {}
    if pair.problem is None:
        record["problem_error"] = pair.problem_error or "no problem"
        return _finish(record, names, results, None, started)
    if compiled and compiled.get("build_failed"):
        message = f"compile failed: {compiled.get('message', '')[-1500:]}"
        record["standard"] = not_loaded(message, compiled=False).to_json()
        record["error"] = message
        return _finish(record, names, results, message, started)

    if earlier is not None:
        record["notes"]["earlier_try"] = f"outgrew a smaller share of the GPU's memory in: {outgrew(earlier)}"
        record["earlier_try_s"] = earlier.get("duration_s")  # a judge's seconds that no verdict came of
        kept = kept_standard(earlier) if options.standard else None
        if kept is not None:
            record.update(standard=kept, standard_s=earlier.get("standard_s"), tamper=earlier.get("tamper"))
            record["notes"]["standard"] = "from the try in a smaller share of the GPU's memory (no limit reached in it)"
    log = options.out_dir / "logs" / f"{_safe(pair.id)}.log"
    # seconds from the start of this evaluation to the first event of each kind from the first worker
    # (loading: the worker is up, kgate imported and the device set up; loaded: the problem, the reference
    # and the candidate are built; standard; gate_start: the working shape is set up; done): where the
    # time of a candidate goes besides the gates' own durations
    timeline: dict[str, float] = record["timeline"]
    remaining = list(names)
    fatal: str | None = None
    attempt = 0
    env = worker_env(pair, options, gpu=device.startswith("cuda"))
    worker_device = pin_gpu(device, env)
    while remaining or (options.standard and record["standard"] is None):
        clear_stale_locks(pair, options)  # a worker killed while building (no compile stage) left one
        state = {"current": None, "poisoned": None, "done": False}
        job = {"stage": "evaluate", "id": pair.id, "problem": str(pair.problem.resolve()),
               "candidate": str(pair.candidate.resolve()), "device": worker_device, "gates": remaining,
               "memory": options.memory, "timeout": options.timeout, "seed": options.seed,
               "gate_seeds": options.gate_seeds, "work_elements": options.work_elements,
               "standard": options.standard and record["standard"] is None, "repro_args": options.repro_args,
               "gpu_memory_fraction": gpu_memory_fraction, "threads": options.threads, "pch": options.pch,
               "turns": turns, "dtypes": options.dtypes,
               "own_precision": options.own_precision}

        def on_event(event: dict[str, Any], state: dict[str, Any] = state, remaining: list[str] = remaining,
                     first: bool = attempt == 0) -> str | None:
            kind = event.get("event")
            if first and isinstance(kind, str) and kind not in timeline:
                timeline[kind] = round(time.perf_counter() - started, 3)
            if kind == "loading":
                return "loading the problem and the candidate"  # the clock restarts after kgate's own imports
            if kind == "loaded":
                record["load_s"] = event.get("seconds")
                record["free_dims"] = dict(zip(event.get("free_dims") or [], event.get("defaults") or [],
                                               strict=False))
                record["notes"].update(event.get("notes") or {})
                return "the standard test"
            if kind == "standard" and isinstance(event.get("result"), dict):
                result = StandardResult.from_json(event["result"]).to_json()
                dtype = event.get("dtype")
                if len(options.dtypes) > 1 and dtype in options.dtypes:  # each precision's own verdict
                    record.setdefault("standards", {})[dtype] = result
                if dtype in (None, options.dtypes[0]):  # `standard`: the first precision's
                    record["standard"] = result
                record["standard_s"] = round((record["standard_s"] or 0) + (event.get("seconds") or 0), 3)
                return ""
            if kind == "gate_start" and event.get("gate") in remaining:
                state["current"] = event["gate"]
                return f"gate {event['gate']}"
            if kind == "result":
                data = event.get("result")
                if isinstance(data, dict) and data.get("gate") in remaining and data["gate"] not in results:
                    try:
                        results[data["gate"]] = GateResult.from_json(data)
                    except TypeError:
                        pass
                state["current"] = None
                return ""
            if kind == "note" and isinstance(event.get("key"), str):
                record["notes"][event["key"]] = str(event.get("value"))
                return None
            if kind == "tamper":
                record["tamper"] = record["tamper"] or str(event.get("message"))
            elif kind == "poisoned":
                state["poisoned"] = str(event.get("message"))
                state["by_reference"] = event.get("reference") is True
            elif kind == "problem_error":
                record["problem_error"] = str(event.get("message"))
            elif kind == "done":
                state["done"] = True
            return None

        turn_fds = open_turns(turns["path"], int(turns["count"])) if turns else []
        job["turns"] = {"fds": turn_fds} if turns else None
        try:
            exit_ = supervise("kgate.audit.worker", job, log_path=log, cwd=pair.candidate.parent.resolve(),
                              timeout=options.timeout, memory=options.memory, on_event=on_event,
                              env=env, cancel=cancel, append_log=attempt > 0, waits=bool(turns),
                              readable=sources(pair, options), writable=caches(env), pass_fds=tuple(turn_fds))
        finally:
            for fd in turn_fds:
                os.close(fd)
        if exit_.detached and "isolation" in remaining:
            results["isolation"] = detached_result(exit_.detached, results.get("isolation"))
        if record["problem_error"]:
            break
        remaining = [n for n in remaining if n not in results]
        cause = exit_.cause(state["done"])
        if state["poisoned"] and state.get("by_reference"):  # the problem's Model faulted on a gate's probe
            lost = f"the problem's Model lost the CUDA context on a gate's probe: {state['poisoned'][:300]}"
            record["notes"]["reference_fault"] = lost  # (that gate skipped): a fresh worker for the rest, if any
            cause = lost if remaining else None
        elif state["poisoned"]:
            cause = f"CUDA context poisoned: {state['poisoned'][:300]}"
        if cause is None:
            break
        if options.standard and record["standard"] is None:
            record["standard"] = not_loaded(f"the worker ended during the standard test: {cause}",
                                            compiled=record["load_s"] is not None).to_json()
            record["standard"]["verdict"] = "error"
        current = state["current"]
        if current in remaining:
            results[current] = GateResult(current, "error", cause, registry.get(current).tolerance_free,
                                          broken=True, details={"log_tail": _tail(log)})
            remaining.remove(current)
        retry = (not exit_.error and attempt < options.max_restarts and bool(remaining)
                 and not (cancel and cancel.is_set()))
        if not retry:
            fatal = cause
            break
        attempt += 1
        record["restarts"] = attempt
        if not state.get("by_reference"):
            record["error"] = record["error"] or cause
    if record["problem_error"]:
        return _finish(record, names, {}, None, started)
    record["error"] = record["error"] or fatal
    record["log"] = str(log)
    return _finish(record, names, results, fatal, started)


def _finish(record: dict[str, Any], names: list[str], results: dict[str, GateResult], cause: str | None,
            started: float) -> dict[str, Any]:
    for name in names:
        if name in results:
            continue
        if record["problem_error"]:
            message = f"not judged: {record['problem_error']}"
        elif cause:
            message = f"not run: {cause} earlier"
        else:
            message = "not run: the worker sent no result"
        results[name] = GateResult(name, "error", message, registry.get(name).tolerance_free, broken=True)
    record["gates"] = [results[n].to_json() for n in names]
    texts = [g.message for g in results.values()] + [str((record.get("standard") or {}).get("message", ""))]
    record["oom"] = any(out_of_gpu_memory(t) for t in texts) and record["device"].startswith("cuda")
    # killed at the worker's host memory limit: on a shared GPU, most often a float64 oracle that did not
    # fit in its share of the GPU and moved to the CPU; the scheduler judges it again with the whole GPU
    record["host_memory"] = any(MEMORY_LIMIT in (t or "") for t in texts + [record.get("error")])
    missing = next((m.group(0) for t in texts if (m := ENVIRONMENT.search(t or ""))), None)
    if missing and not record["problem_error"]:
        record["environment_error"] = f"this machine cannot run the candidate ({missing}); audit it on a CUDA host"
    record["duration_s"] = round(time.perf_counter() - started, 3)
    return record
