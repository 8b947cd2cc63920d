"""The audit's worker process: one KernelBench pair, one stage, events as JSON lines.

Started by `kgate.audit.evaluate` as `python -m kgate.audit.worker JOB.json` (or forked from a template
that runs `run_job(job)`, kgate.forkserver) under the runner's
time and memory limits (`kgate.runner.supervise`). Three stages:

- `compile`: import the candidate with no GPU visible, so `load_inline` builds its extension on the
  CPU into the candidate's own TORCH_EXTENSIONS_DIR (the evaluation then finds it built). Events:
  `compiled` {ok, seconds, build_failed, message}.
- `evaluate`: load the problem twice and the candidate once (see kgate.kernelbench), build the models,
  run the standard test, then the gates. Events: `loaded` {seconds, free_dims, notes}, `standard`
  {result}, `gate_start`/`result` (as kgate.worker), `tamper` {message}, `poisoned` {message} (a
  sticky CUDA error: this process can run nothing more), `done`.
- `sizes`: for each of the job's problems, the elements its `get_inputs()` makes and the layers with a
  weight (leaf modules holding a parameter of two or more dimensions) its `Model` has, both on the meta
  device (nothing allocated, no GPU visible), so that the scheduler can judge the longest first.
  Events: `sizing` {problem} before each, `size` {problem, elements, layers, parameters} (None: not countable).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kgate.faults import context_lost
from kgate.worker import Channel, _error_result, prepare_device, prepare_process, reporting_start, run_gates

# What a worker template (kgate.forkserver) imports besides its own list, once for all the workers it forks:
# what torch's first operation on the meta device imports (sympy with it: 0.5-0.9 s), which every audit
# worker makes (kgate.kernelbench.free_dims). A worker started on its own imports it when it needs it, inside
# its reported start (a torch that cannot import is then said as such).
TEMPLATE_WARM = ("torch.fx.experimental.symbolic_shapes",)


def _compile(channel: Channel, job: dict[str, Any]) -> None:
    from kgate.kernelbench import exec_candidate

    start = time.perf_counter()
    try:
        exec_candidate(Path(job["candidate"]), Path(job["problem"]) if job.get("problem") else None)
        channel.send("compiled", ok=True, seconds=round(time.perf_counter() - start, 3), build_failed=False,
                     message="")
    except BaseException as exc:  # noqa: BLE001 - user code at import time may raise anything
        text = f"{type(exc).__name__}: {exc}"
        build_failed = "Error building extension" in text or "CalledProcessError" in text
        channel.send("compiled", ok=False, seconds=round(time.perf_counter() - start, 3), build_failed=build_failed,
                     message=text[-4000:])


def _sizes(channel: Channel, job: dict[str, Any]) -> None:
    from kgate import kernelbench as kb

    for problem in job["problems"]:
        channel.send("sizing", problem=problem)
        try:
            elements, layers, parameters = kb.problem_size(Path(problem))
        except Exception:  # noqa: BLE001 - the problem's own fault: its candidates' records will say so
            elements = layers = parameters = None
        channel.send("size", problem=problem, elements=elements, layers=layers, parameters=parameters)


def _evaluate(channel: Channel, job: dict[str, Any]) -> None:

    import contextlib
    from collections.abc import Iterator
    from dataclasses import dataclass

    import torch

    from kgate import gates as registry
    from kgate import kernelbench as kb
    from kgate import standard_test
    from kgate.inputs import Case, InputFactory, dtype_of
    from kgate.oracle import DtypeDispatch
    from kgate.subject import LOCKSTEP_BYTES, FirstCall, Subject, module_buffer_pairs

    names: list[str] = job["gates"]
    device = prepare_device(job["device"], job.get("gpu_memory_fraction"))
    if job.get("turns"):  # --prestart: started while others judge; the candidate waits for a turn

        from kgate.audit import turns

        if device.type == "cuda":
            torch.zeros(1, device=device)  # the CUDA context too, before the wait
        channel.send("waiting")
        turns.take(job["turns"]["fds"])  # its descriptor stays open: held until exit

    def all_error(message: str, trace: str | None = None) -> None:
        for name in names:
            channel.send("result", result=_error_result(name, registry.get(name).tolerance_free, message,
                                                        {"traceback": trace} if trace else None))

    channel.send("loading")
    problem_path, candidate_path = Path(job["problem"]), Path(job["candidate"])
    try:
        reference_module = kb.exec_problem(problem_path, "reference")
        inputs_module = kb.exec_problem(problem_path, "inputs")
        dims = kb.free_dims(inputs_module)
    except kb.ProblemError as exc:
        channel.send("problem_error", message=str(exc))
        return
    before = {"reference": kb.fingerprint(reference_module), "inputs": kb.fingerprint(inputs_module)}
    torch_before = kb.torch_fingerprint()

    def tampered() -> str | None:
        for label, module in (("reference", reference_module), ("inputs", inputs_module)):
            found = kb.tampering(before[label], module)
            if found:
                return found
        return kb.torch_tampering(torch_before)

    run_standard = job.get("standard", True)
    seed = job.get("seed", kb.DEFAULT_SEED)
    dtypes: list[str] = job.get("dtypes") or ["float32"]
    plain = dtypes == ["float32"]  # result ids as the parent expects them: the gate names alone
    if plain and job.get("own_precision"):
        own = own_precision(inputs_module)
        if own is not None:
            dtypes = [own]
            channel.send("note", key="precision", value=(
                f"judged at {own}, the precision of the problem's own inputs (KernelBench's harness casts them to "
                "fp32 unless told; --dtypes float32 judges as it does)"))
    built: dict[str, tuple[Any, list[Any]]] = {}
    # precisions the problem itself cannot run at (its Model fails to build or raises in the standard test
    # there): their gates are skipped, naming why, and the others judged; if none is left, a problem_error
    unjudged: dict[str, str] = {}
    for dtype in dtypes:  # the references are built before the candidate's code runs, as KernelBench does
        try:
            built[dtype] = kb.build_reference(reference_module, device, seed, dtype_of(dtype))
        except kb.ProblemError as exc:
            unjudged[dtype] = str(exc) + (f" (at {dtype})" if len(dtypes) > 1 else "")
    if len(unjudged) == len(dtypes):
        channel.send("problem_error", message=unjudged[dtypes[0]])
        return
    # What torch, kgate and the process's numerics look like before any candidate code runs (the isolation
    # gate compares with it: a patch or a switch the candidate sets at import or construction shows too)
    from kgate.gates.isolation import Snapshot, install_thread_gate

    pristine = Snapshot.take()
    install_thread_gate()  # the candidate's threads, from its first call on, can be held (isolation)
    start = time.perf_counter()
    try:
        candidate_module = kb.exec_candidate(candidate_path, problem_path)
        model_new = getattr(candidate_module, "ModelNew", None)
        if model_new is None:
            raise AttributeError(f"{candidate_path.name} defines no ModelNew")
    except BaseException as exc:  # noqa: BLE001 - import-time user code (load_inline builds here)
        message = f"could not load the candidate: {type(exc).__name__}: {str(exc)[-2000:]}"
        if run_standard:
            channel.send("standard", result=standard_test.not_loaded(message, compiled=False).to_json())
        all_error(message, traceback.format_exc())
        return
    channel.send("loaded", seconds=round(time.perf_counter() - start, 3), free_dims=dims.names,
                 defaults=dims.defaults, notes={"shapes": dims.note} if dims.note else {})
    models: dict[str, tuple[Any, Any]] = {}  # dtype -> (reference, candidate)
    for dtype in built:
        reference, init_inputs = built[dtype]
        try:
            models[dtype] = (reference, kb.build_candidate(model_new, init_inputs, device, seed, dtype_of(dtype)))
        except BaseException as exc:  # noqa: BLE001
            message = f"ModelNew could not be built: {type(exc).__name__}: {exc}"
            if run_standard:
                channel.send("standard", result=standard_test.not_loaded(message, compiled=True).to_json())
            all_error(message, traceback.format_exc())
            if context_lost(message):
                channel.send("poisoned", message=message)
            return
    found = tampered()
    if found:
        channel.send("tamper", message=found)
    # the modules' buffers as built, before any call (the standard test moves running statistics and momentum):
    # what the probes that start from the state as built put back (Subject.buffers_as_built)
    as_built: dict[str, dict[int, torch.Tensor]] = {}
    for dtype, pair in models.items():
        held = [b for m in pair if isinstance(m, torch.nn.Module) for b in m.buffers()]
        if sum(b.numel() * b.element_size() for b in held) <= LOCKSTEP_BYTES:
            as_built[dtype] = {id(b): b.detach().clone() for b in held}
    # the models' first calls (the standard test's first trial, else the first gate's): the determinism gate
    # makes them again
    first_calls: dict[str, dict[str, FirstCall]] = {}
    for dtype, (reference, candidate) in models.items():
        if isinstance(candidate, torch.nn.Module) and isinstance(reference, torch.nn.Module):
            module_buffer_pairs(candidate, reference)  # which buffers stand for which, as built (kgate.subject)
        first_calls[dtype] = {"kernel": FirstCall(), "reference": FirstCall()}
        for role, model in (("kernel", candidate), ("reference", reference)):
            if isinstance(model, torch.nn.Module):
                first_calls[dtype][role].watch(model)
    for dtype in [d for d in dtypes if d in models] if run_standard else []:
        reference, candidate = models[dtype]
        started = time.perf_counter()
        try:
            verdict = standard_test.run(reference, candidate, inputs_module.get_inputs, device, seed=seed,
                                        tolerances=kb.STANDARD_TOLERANCES[dtype], precision=dtype_of(dtype))
        except BaseException as exc:  # noqa: BLE001 - the reference raised: the problem's fault
            code = getattr(inputs_module.get_inputs, "__code__", None)
            part = ("get_inputs()" if any(frame.f_code is code for frame, _ in traceback.walk_tb(exc.__traceback__))
                    else "Model")
            at = f" at {dtype}" if len(dtypes) > 1 else ""
            unjudged[dtype] = f"the problem's {part} raised in the standard test{at}: {type(exc).__name__}: {exc}"
            if len(unjudged) == len(dtypes):
                channel.send("problem_error", message=unjudged[dtype])
                return
            continue
        channel.send("standard", result=verdict.to_json(), seconds=round(time.perf_counter() - started, 3),
                     dtype=None if plain else dtype)
        if context_lost(verdict.message) and verdict.verdict == standard_test.ERROR:
            channel.send("poisoned", message=verdict.message)
            return
        found = tampered()
        if found:
            channel.send("tamper", message=found)

    seeds = job.get("gate_seeds") or [0, 1]
    audit_args = job.get("repro_args") or []
    factory = InputFactory(kb.ProblemInputs(inputs_module, dims).factory())

    class PairSubject(Subject):
        resized: str | None = None  # the label of the weights' size it was built at, where not the problem's
        problem_inputs: Any = None  # the problem's copy that makes its inputs (another at another size of the weights)

        def repro(self, gate: str, case: Case | None = None) -> str:
            dtype = (case or self.cases[0]).dtype
            judged = gate if "[" in gate or plain else f"{gate}[{dtype}]"  # its result id
            return kb.repro_command(audit_args, job["id"], judged)

        def conform(self, original: tuple, probe: tuple) -> tuple:
            return kb.conform(original, probe)  # triangular/diagonal/symmetric inputs stay so

        def structural_zeros(self, args: tuple) -> bool:
            return any(kb.matrix_structure(a) in kb.ZERO_STRUCTURES for a in args)

        def predicted_input_elements(self, case: Case) -> int | None:
            return kb.input_elements(self.problem_inputs, dims, case.shape) if case.shape is not None else None

        def model_sizes(self) -> list[Any]:
            if self.resized:  # (not again from a subject at another size)
                return []
            if not init_dims:
                init_dims.append(kb.init_dims(inputs_module, dims))
            shape, dtype = self.cases[0].shape, self.cases[0].dtype
            return [Resized(size.overrides, size.label, shape, dtype) for size in
                    kb.model_size_variants(inputs_module, dims, init_dims[0], shape)]

    init_dims: list[kb.FreeDims] = []  # the integers that size the weights (found on the first ask)

    @dataclass
    class Resized(kb.ModelSize):
        """Both models built again at another size of the weights (Subject.model_sizes), at the subject's first
        case's shape and dtype."""

        shape: tuple[int, ...] | None = None
        dtype: str = "float32"

        @contextlib.contextmanager
        def open(self) -> Iterator[PairSubject | str]:
            defaults = dict(zip(init_dims[0].names, init_dims[0].defaults, strict=True))
            # the problem executed anew as if written with these sizes (what it derives from them follows), and
            # the candidate's copy of its names set to them while the two are built and judged
            with kb.overridden([candidate_module], self.overrides, defaults):
                built: PairSubject | str
                try:
                    sized_reference = kb.exec_problem(problem_path, "reference", self.overrides)
                    sized_inputs = kb.exec_problem(problem_path, "inputs", self.overrides)
                    reference, init_inputs = kb.build_reference(sized_reference, device, seed, dtype_of(self.dtype))
                    try:
                        candidate = kb.build_candidate(model_new, init_inputs, device, seed, dtype_of(self.dtype))
                        if isinstance(candidate, torch.nn.Module) and isinstance(reference, torch.nn.Module):
                            module_buffer_pairs(candidate, reference)
                        built = subject_at(self.shape, self.dtype, (reference, candidate), sized_inputs)
                        built.resized = self.label
                    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a narrower domain it states
                        built = f"ModelNew raised {type(exc).__name__} when built there"
                except kb.ProblemError as exc:
                    built = f"the problem's Model cannot be built there ({str(exc)[:200]})"
                yield built

    def subject_at(shape: tuple[int, ...] | None, dtype: str = "float32", pair: tuple[Any, Any] | None = None,
                   sized_inputs: Any = None) -> PairSubject:
        """The subject at `shape` and `dtype`: of the models built for it, or of `pair` and a problem copy at other
        sizes of the weights (`Resized`)."""
        entry = kb.PairEntry(job["id"], candidate_path, problem_path, [shape], seeds, [dtype],
                             timeout=float(job.get("timeout") or 300.0), memory=job.get("memory"),
                             device=job["device"])
        reference, candidate = pair or models[dtype]
        made = factory if sized_inputs is None else InputFactory(kb.ProblemInputs(sized_inputs, dims).factory())
        # both models draw what their forward draws from the same seed (kgate.oracle.seeded)
        subject = PairSubject(entry, kb.NoGrad(candidate, seed), DtypeDispatch(reference, seed), made, device,
                              [Case(shape, dtype, s) for s in seeds], repro_manifest=str(problem_path))
        subject.problem_inputs = sized_inputs or inputs_module
        subject.pristine_state = pristine
        if pair is None:
            subject.first_calls = first_calls[dtype]
            subject.buffers_as_built(as_built.get(dtype, {}))
        return subject

    work_elements = int(job.get("work_elements", kb.WORK_ELEMENTS))
    for dtype in dtypes:  # names: this precision's result ids (kgate.kernelbench.gate_ids)
        of_dtype = [n for n in names if len(dtypes) == 1 or kb.dtype_of_id(n) == dtype]
        if not of_dtype:
            continue
        if dtype in unjudged:
            channel.send("note", key=f"unjudged_{dtype}", value=unjudged[dtype])
            for name in of_dtype:
                channel.send("result", result={"gate": name, "verdict": "skip", "tolerance_free":
                                                registry.get(name).tolerance_free, "broken": False, "details": {},
                                                "message": f"not judged at {dtype}: {unjudged[dtype]}"})
            continue
        own = subject_at(tuple(dims.defaults) if dims.names else None, dtype)
        small, note = None, None
        if any(registry.base_name(n) not in kb.FULL_SHAPE_GATES for n in of_dtype):  # some gate would probe there
            small, note = _working_subject(inputs_module, dims, work_elements,
                                           lambda shape, dtype=dtype: subject_at(shape, dtype))
        if note:
            channel.send("note", key="working_shape", value=note)
        groups = [(own, of_dtype)]
        if small is not None:
            at_own = [n for n in of_dtype if registry.base_name(n) in kb.FULL_SHAPE_GATES]
            groups = [(own, at_own), (small, [n for n in of_dtype if n not in at_own])]
        for subject, group in groups:
            lost = run_gates(channel, subject, group, job.get("memory"), job.get("timeout"))
            if lost is not None:  # a sticky CUDA error: run_gates stopped, a fresh worker takes the gates not run
                channel.send("poisoned", message=lost.line, reference=lost.own)
                return
    found = tampered()
    if found:
        channel.send("tamper", message=found)


def own_precision(inputs_module: Any) -> str | None:
    """float16 or bfloat16 where every floating tensor the problem's get_inputs() gives has that dtype (drawn
    on torch's meta device: no values, no memory), else None (float32, or a mix: KernelBench's default)."""
    import torch

    from kgate.compare import flatten
    from kgate.inputs import dtype_name

    try:
        with torch.device("meta"):
            values = inputs_module.get_inputs()
    except Exception:  # noqa: BLE001 - a factory that needs real values: the default precision
        return None
    found = {t.dtype for _, t in flatten(list(values)) if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if len(found) != 1:
        return None
    name = dtype_name(found.pop())
    return name if name in ("float16", "bfloat16") else None


def _working_subject(module: Any, dims: Any, budget: int, subject_at: Any) -> tuple[Any, str | None]:
    """The subject at the working shape (kgate.kernelbench.working_shape) and a note for the report, or
    (None, note or None) when the probing gates keep the problem's own shape. The working shape is used
    only if the reference accepts it and the kernel meets the oracle bound there: a kernel that breaks
    at other sizes fails the shapes gate, not every probing gate at once."""
    from kgate import kernelbench as kb
    from kgate.shrink import judge_probe
    from kgate.subject import UserCodeError

    shape = kb.working_shape(module, dims, budget)
    if shape is None:
        return None, None
    named = ", ".join(f"{n}={v}" for n, v in zip(dims.names, shape, strict=True))
    own = ", ".join(f"{n}={v}" for n, v in zip(dims.names, dims.defaults, strict=True))
    small = subject_at(shape)
    try:
        base = small.baseline(small.cases[0])
        finding, _ = judge_probe(small, base.args, base.reference, base.oracle)
    except UserCodeError as exc:
        return None, (f"the problem's own shape for every gate: at the working shape ({named}) the "
                      f"{exc.role} raised {type(exc.exc).__name__}")
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA error: the gates at the own shape will say
        return None, f"the problem's own shape for every gate: the working shape ({named}) raised {type(exc).__name__}"
    if finding is not None:
        return None, (f"the problem's own shape for every gate: the kernel misses the oracle at the working "
                      f"shape ({named})")
    gates = ", ".join(kb.FULL_SHAPE_GATES)
    return small, (f"{gates} and the standard test at the problem's own shape ({own}); the other gates at "
                   f"{named} (inputs of at most {budget} elements)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_job(json.loads(Path(argv[0]).read_text()))


def run_job(job: dict[str, Any]) -> int:
    """One stage of `job` (the job file's content; also what kgate.forkserver's workers run)."""
    channel = Channel(int(job["event_fd"]))
    with reporting_start(channel):
        prepare_process(job)
        if job.get("pch"):  # before any candidate code: the shared precompiled header stays as the parent built it
            from kgate.audit import pch

            pch.keep_shared()
    if job["stage"] == "compile":
        _compile(channel, job)
    elif job["stage"] == "sizes":
        _sizes(channel, job)
    else:
        _evaluate(channel, job)
    channel.send("done")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip teardown: extensions and CUDA contexts sometimes crash there
