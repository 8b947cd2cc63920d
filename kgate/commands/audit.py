"""`kgate audit`: judge a corpus of KernelBench-format candidates with the gates and the standard test."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kgate import names as registry
from kgate.audit.results import ResultsFile, parse_shard, shard
from kgate.commands import COUNT, SECONDS, add_sandbox_option, number, writable
from kgate.errors import UsageError
from kgate.kernelbench import AUDIT_DTYPES, WORK_ELEMENTS, discover, gate_ids
from kgate.manifest import parse_memory
from kgate.reports.github import plain
from kgate.selection import matcher

# The --cache default from the environment: builds shared by every audit that names the same folder.
CACHE_ENV = "KGATE_AUDIT_CACHE"

if TYPE_CHECKING:  # the audit's machinery imports torch: main() imports it, `kgate --help` does not
    from kgate.audit.evaluate import AuditOptions
    from kgate.audit.scheduler import Plan

EXIT_INCOMPLETE = 3

DESCRIPTION = """Judge every candidate of a KernelBench-format corpus with kgate's gates and, beside them,
KernelBench's own correctness check (5 seeded trials at the problem's shape, allclose atol=rtol=1e-2),
then report how the two disagree.

A problem file defines Model, get_inputs() and get_init_inputs(); a candidate defines ModelNew. Candidate
X.py or X__anything.py pairs with problem X.py (the longest X a problem is named; same subfolder first, then anywhere under --problems);
--index FILE (JSON or CSV with candidate,problem columns; other columns are kept as labels, e.g.
harness_correct) pairs them explicitly.

Every candidate runs in its own worker process with time and memory limits: a compile failure, crash,
segfault, hang, out-of-memory or os._exit is that candidate's `error` and the audit goes on. Candidates that
build extensions (load_inline) are compiled first on the CPU cores, in parallel, into a cache under --out.
With several workers on one GPU (--jobs), each may use only its share of the GPU's memory; a candidate that
runs out of it is judged again with more (a neighbour's appetite never becomes a verdict): with 4 or more
workers a GPU, at once in half its memory while the others go on; past that, alone, with the whole GPU,
once no shared work is left. Each finished candidate is appended to OUT/results.jsonl; --resume
skips those already there."""

EPILOG = """exit codes: 0 every candidate judged and passed every gate, 1 some violation, or some candidate that
pairs with no problem or could not be judged (no CUDA here, kgate's memory limits, the problem's own code
raised), 2 usage or infrastructure error (or no candidate could be judged at all, e.g. CUDA candidates
on a machine without CUDA, or none pairs with a problem), 3 stopped by --max-time before every candidate was
judged (run again with --resume).

examples:
  kgate audit --format kernelbench --problems KernelBench --candidates runs/ --report audit-report
  kgate audit --format kernelbench --problems P --candidates C --shard 2/8 --out shard2   # CI matrix
  kgate audit --format kernelbench --problems P --candidates C --resume --max-time 480   # in slices"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="judge a corpus of KernelBench-format kernels beside the standard test",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=["kernelbench"], default="kernelbench",
                   help="corpus format (only kernelbench so far)")
    p.add_argument("--problems", metavar="DIR", help="folder of problem files (searched recursively)")
    p.add_argument("--candidates", metavar="DIR", help="folder of candidate files (searched recursively)")
    p.add_argument("--index", metavar="FILE", help="JSON or CSV pairing candidate -> problem (overrides names)")
    p.add_argument("--manifest", metavar="FILE",
                   help="take --problems/--candidates/--index from the `format: kernelbench` entries of this kgate.yaml")
    p.add_argument("-k", dest="select", metavar="EXPR", help="only candidates whose id matches EXPR (like pytest -k)")
    p.add_argument("--gate", "-g", action="append", default=[], metavar="GATE",
                   help="run only this gate (repeat or comma-separate; default all: `kgate gates`)")
    p.add_argument("--dtypes", default=None, metavar="LIST",
                   help="the precisions to judge each candidate at, comma-separated: float32, float16, bfloat16 "
                        "(KernelBench's fp32/fp16/bf16: floating inputs and both models' parameters cast to it, integer "
                        "inputs untouched). Each gets its own gate results (oracle[float16], ...) and its own standard "
                        "test, at KernelBench's tolerance for that precision. Default: each problem's own precision, "
                        "float32, or float16/bfloat16 where every floating tensor its get_inputs() gives has that "
                        "dtype (KernelBench's harness casts to fp32 unless told: --dtypes float32 judges as it does)")
    p.add_argument("--device", default="auto", metavar="D",
                   help="auto, cpu, cuda (every visible GPU) or cuda:N (default auto)")
    p.add_argument("--jobs", "-j", type=COUNT, metavar="N",
                   help="candidates evaluated at once (default: one per GPU; on the CPU half the cores, at most 4); "
                        "several per GPU share its memory in equal parts, and all share the machine's cores (torch's CPU "
                        "threads)")
    p.add_argument("--prestart", action="store_true",
                   help="start each device's next workers while --jobs others judge (Python, torch and a CUDA "
                        "context take seconds per candidate, the GPU idle meanwhile): twice the worker "
                        "processes, --jobs of them judging at once, each waiting for its turn untimed. "
                        "Local backend only")
    p.add_argument("--order", choices=["longest", "given"], default="longest",
                   help="which candidates are judged first when several judge at once: longest (default) the ones "
                        "whose problem is estimated to take longest (its get_inputs() elements, its Model's "
                        "weighted layers and parameter elements, counted first on the meta device in a worker of kgate's own), so that "
                        "they do not start last while the other judges idle; given: in id order. With one judge "
                        "at a time the order changes nothing and nothing is counted")
    p.add_argument("--no-split", dest="split", action="store_false",
                   help="judge every candidate's gates in one worker; by default, with several judges and --order "
                        "longest, a candidate whose gates alone are estimated to take more than a judge's fair share "
                        "of the audit (its Model's weighted layers and parameters) has its gates split into parts "
                        "that separate workers judge at once, its record merged from them")
    p.add_argument("--compile-jobs", type=COUNT, metavar="N", help="extension builds at once (default half the cores)")
    p.add_argument("--no-compile-stage", action="store_true",
                   help="build extensions inside the evaluation instead of in a separate CPU stage")
    p.add_argument("--pch", action="store_true",
                   help="precompile torch/extension.h once before the builds and keep it shared (GCC uses it in "
                        "every build whose flags match: about a third less C++ compile time per load_inline "
                        "candidate); writes ~0.8 GB into torch's include folder. Local backend only")
    p.add_argument("--compile-only", action="store_true",
                   help="only build the selected candidates' extensions into OUT's cache (no GPU needed, nothing "
                        "judged or recorded: OUT/results.jsonl is left as it is; with --resume the candidates it "
                        "holds are not built); a later audit with the same --out finds them built. Lets the CPU "
                        "build while the GPU does other work")
    p.add_argument("--shard", metavar="I/N", help="judge only shard I of N (every candidate is in exactly one shard)")
    p.add_argument("--resume", action="store_true", help="keep OUT/results.jsonl and skip the candidates it holds")
    p.add_argument("--fresh", action="store_true",
                   help="discard the records OUT/results.jsonl already holds and judge every candidate again "
                        "(without --resume or --fresh, an OUT that holds records is refused: they may be hours of work)")
    p.add_argument("--rejudge-stale", action="store_true",
                   help="with --resume: judge again the selected candidates whose record another kgate made (a "
                        "different version or source, or none recorded), so that the report comes from one kgate; "
                        "their old records move to OUT/results.replaced.jsonl")
    p.add_argument("--keep-source", action="append", default=[], metavar="DIGEST",
                   help="with --rejudge-stale: records whose kgate source digest (a record's kgate.source, the "
                        "report lists them) is DIGEST count as current and are kept (repeatable): for an earlier "
                        "kgate whose changes since do not touch those records; the report still names every "
                        "source it joins")
    p.add_argument("--max-time", type=number(float, 0), metavar="SECONDS",
                   help="start no new candidate after this long; exit 3 if some are left (then --resume)")
    p.add_argument("--backend", choices=["local", "ray"], default="local", help="where candidates run (default local)")
    p.add_argument("--address", metavar="A",
                   help="Ray cluster address for --backend ray (default: a local instance); with --backend ray, "
                        "--device cuda asks Ray for GPUs (--jobs tasks share one GPU) and --device cpu for CPUs")
    p.add_argument("--timeout", type=SECONDS, default=300.0, metavar="SECONDS",
                   help="time limit per stage of one candidate: loading, the standard test, each gate (default 300)")
    p.add_argument("--compile-timeout", type=SECONDS, default=900.0, metavar="SECONDS",
                   help="time limit for building one candidate's extension (default 900)")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="resident memory limit per worker (default 32GiB, or 90%% of this machine's memory where "
                        "that is less: kgate then stops a worker, with the cause in its result, before the system's "
                        "out-of-memory killer does)")
    p.add_argument("--seed", type=int, default=42, help="the standard test's seed (KernelBench's default 42)")
    p.add_argument("--work-elements", type=number(int, 0), default=WORK_ELEMENTS, metavar="N",
                   help="contract, oracle, determinism and the standard test run at the problem's own shape; "
                        "the other gates at its free sizes halved until the inputs hold at most N elements "
                        f"(default {WORK_ELEMENTS}; 0: every gate at the problem's own shape)")
    p.add_argument("--out", default="kgate-audit", metavar="DIR",
                   help="results.jsonl, logs and the extension cache (default kgate-audit)")
    p.add_argument("--cache", metavar="DIR", default=os.environ.get(CACHE_ENV) or None,
                   help="keep the candidates' builds (torch extensions, Triton's cache; one folder per candidate "
                        f"source) here instead of in --out, so that audits into other --out folders reuse them; "
                        f"not for audits that run at the same time (default: ${CACHE_ENV}, else --out)")
    p.add_argument("--json", metavar="PATH", help="write the JSON report (kgate report + audit records) here")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML here (one suite per candidate)")
    p.add_argument("--report", metavar="DIR", help="write report.md, PNG plots and the stratified sample.csv here")
    p.add_argument("--sample", type=number(int, 0), default=5, metavar="N", help="candidates per stratum in sample.csv (default 5)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, only the summary")
    add_sandbox_option(p)
    p.set_defaults(func=main)


def _gates(values: list[str]) -> list[str]:
    chosen = registry.parse_option(values, phases=False)  # a KernelBench candidate has no backward phase
    return [g for g in registry.KNOWN_GATES if g in chosen] if chosen else list(registry.GATE_NAMES)


def _dtypes(value: str | None) -> list[str]:
    if value is None:  # each problem's own precision (AuditOptions.own_precision), float32 for nearly all
        return ["float32"]
    chosen = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [d for d in chosen if d not in AUDIT_DTYPES]
    if unknown or not chosen:
        raise UsageError(f"--dtypes {value}: expected a comma-separated list of {', '.join(AUDIT_DTYPES)}")
    return chosen


def _sources(args: argparse.Namespace) -> list[tuple[str, Path, Path, Path | None]]:
    """(label, problems, candidates, index) per corpus: from the flags or the manifest's entries."""
    if args.manifest:
        given = [flag for flag, value in (("--problems", args.problems), ("--candidates", args.candidates),
                                          ("--index", args.index)) if value]
        if given:
            raise UsageError(f"--manifest names its corpora itself; leave out {', '.join(given)} (or the manifest)")
        from kgate.manifest import load

        manifest = load(args.manifest)
        entries = manifest.kernelbench
        if not entries:
            raise UsageError(f"{args.manifest}: no entry with `format: kernelbench` (give --problems/--candidates)")
        return [(e.name, e.problems, e.candidates, e.index) for e in entries]
    if not args.problems or not args.candidates:
        raise UsageError("give --problems DIR and --candidates DIR (or --manifest with a `format: kernelbench` entry)")
    return [("", Path(args.problems), Path(args.candidates), Path(args.index) if args.index else None)]


def repro_args(args: argparse.Namespace, problems: Path, candidates: Path, index: Path | None) -> list[str]:
    out = ["--format", "kernelbench", "--problems", str(problems), "--candidates", str(candidates)]
    if index:
        out += ["--index", str(index)]
    if args.device != "auto":
        out += ["--device", args.device]
    if args.dtypes is not None:  # float32 too: given, it stops the problem's own precision being taken
        out += ["--dtypes", ",".join(_dtypes(args.dtypes))]
    return out + ["--out", "kgate-repro", "--fresh"]


DEFAULT_WORKER_MEMORY = 32 * 2**30


def default_worker_memory() -> int:
    """--memory's default: 32 GiB, or 90 % of this machine's memory where that is less (a worker past the
    machine's memory is taken by the system's out-of-memory killer, its result a bare SIGKILL)."""
    from kgate.procmem import machine_memory

    total = machine_memory()
    return min(DEFAULT_WORKER_MEMORY, int(0.9 * total)) if total else DEFAULT_WORKER_MEMORY


def main(args: argparse.Namespace) -> int:
    writable(args.json, "--json")
    writable(args.junit, "--junit")
    writable(args.report, "--report", folder=True)
    try:
        memory = parse_memory(args.memory) if args.memory is not None else default_worker_memory()
    except ValueError as exc:
        raise UsageError(f"--memory: {exc}") from None
    gate_names = _gates(args.gate)
    dtypes = _dtypes(args.dtypes)
    spec = parse_shard(args.shard)
    if args.address and args.backend != "ray":
        raise UsageError("--address is for --backend ray")
    if args.prestart and args.backend != "local":
        raise UsageError("--prestart is for the local backend")
    console = _console()
    code = 0
    for label, problems, candidates, index in _sources(args):
        out = Path(args.out) / label if label else Path(args.out)
        code = max(code, _audit(args, console, problems, candidates, index, out, gate_names, dtypes, memory, spec))
    return code


def _audit(args: argparse.Namespace, console: Console, problems: Path, candidates: Path, index: Path | None,
           out: Path, gate_names: list[str], dtypes: list[str], memory: int, spec: tuple[int, int] | None) -> int:
    from kgate.audit import report as audit_report
    from kgate.audit.evaluate import AuditOptions, kgate_stamp, needs_compile, pair_digest
    from kgate.audit.scheduler import (
        Plan,
        arch_list,
        count_sizes,
        longest_first,
        make_plan,
        run_local,
        split_parts,
    )
    from kgate.reports import junit

    pairs = discover(problems, candidates, index)
    if args.select:
        keep = matcher(args.select, [p.id for p in pairs])
        pairs = [p for p in pairs if keep(p.id)]
        if not pairs:
            raise UsageError(f"-k {args.select!r} selects no candidate")
    pairs = shard(pairs, spec)
    unpaired = [p for p in pairs if p.problem_error]
    if unpaired:  # known now: say so before the work, not only in the report after it
        console.print(f"[yellow]kgate audit: {len(unpaired)} candidate(s) will be recorded as not judged:[/]",
                      highlight=False)
        for pair in unpaired[:5]:
            console.print(f"  {escape(plain(pair.id))}: {escape(plain(pair.problem_error or ''))}", highlight=False)
        if len(unpaired) > 5:
            console.print(f"  ... and {len(unpaired) - 5} more (results.jsonl lists each)", highlight=False)
    results = ResultsFile(out / "results.jsonl")
    ids = {p.id for p in pairs}
    if args.fresh and args.resume:
        raise UsageError("--fresh discards the records that --resume keeps: give one of them")
    if args.rejudge_stale and not args.resume:
        raise UsageError("--rejudge-stale goes with --resume (without it every candidate is judged anew anyway)")
    if args.keep_source and not args.rejudge_stale:
        raise UsageError("--keep-source goes with --rejudge-stale (it names records that are not stale)")

    sources = {p.id: pair_digest(p) for p in pairs}
    changed: list[str] = []

    def stale(record: dict) -> bool:
        stamp = record.get("kgate")
        kept = isinstance(stamp, dict) and stamp.get("source") in args.keep_source
        return record.get("id") in ids and stamp != kgate_stamp() and not kept

    def drop(record: dict) -> bool:
        """A record judged on other files than the candidate's and problem's now (a candidate or problem file
        changed since), or with --rejudge-stale by another kgate: judged again."""
        if record.get("sources") not in (None, sources.get(record.get("id"), record.get("sources"))):
            changed.append(str(record.get("id")))
            return True
        return args.rejudge_stale and stale(record)
    try:
        if args.compile_only:
            # builds only: the results file is never written (a concurrent or later audit owns it); with
            # --resume the candidates it already holds need no build
            done = results.read() if args.resume else {}
        else:
            if not args.resume and not args.fresh and (held := len(results.read())):
                raise UsageError(f"{results.path} holds {held} record(s) of an earlier audit: add --resume to go on "
                                 "from them (the same command otherwise), or --fresh to discard them and judge "
                                 "every candidate again")
            done = results.start(resume=args.resume, drop=drop)
    except OSError as exc:
        raise UsageError(f"cannot write to --out {out}: {exc}") from None
    if results.unreadable:
        console.print(f"[yellow]kgate audit: {results.unreadable} line(s) of {results.path} could not be read (torn by "
                      "a kill, or damaged); the candidates they held, if any, are judged again[/]", highlight=False)
    if results.moved - len(changed) and not args.quiet:
        console.print(f"kgate audit: {results.moved - len(changed)} record(s) made by another kgate moved to "
                      f"{results.replaced}; judging those candidates again", highlight=False)
    if changed:
        console.print(f"kgate audit: {len(changed)} record(s) were judged on other candidate or problem files "
                      f"(first: {escape(changed[0])}), moved to {results.replaced}; judging those candidates again",
                      highlight=False)
    other_gates = [r["id"] for r in done.values() if r["id"] in ids and r.get("gates")
                   and {g["gate"] for g in r["gates"]} != set(gate_ids(gate_names, dtypes))]
    if other_gates:
        console.print(f"[yellow]kgate audit: {len(other_gates)} record(s) kept by --resume were judged with other "
                      f"gates than these (first: {escape(other_gates[0])}); they stand as they are: --fresh, or "
                      "another --out, judges every candidate with these gates[/]", highlight=False)
    todo = [p for p in pairs if p.id not in done]
    if args.backend == "ray":
        # The devices are the cluster's, not this machine's: Ray places each task on a GPU (or a CPU).
        kind = "cuda:0" if args.device.startswith("cuda") else "cpu"
        plan = Plan([kind], args.jobs or 1, args.compile_jobs or 1)
    else:
        plan = make_plan(args.device, args.jobs, args.compile_jobs)
    plan.compile_stage = not args.no_compile_stage
    plan.prestart = args.prestart
    options = AuditOptions(gates=gate_names, dtypes=dtypes, own_precision=args.dtypes is None, out_dir=out,
                           timeout=args.timeout, memory=memory,
                           compile_timeout=args.compile_timeout, seed=args.seed, work_elements=args.work_elements,
                           repro_args=repro_args(args, problems, candidates, index),
                           # local: run_local shares the cores among the judges; Ray's CPU workers as before
                           threads=plan.threads() if args.backend == "ray" and plan.devices == ["cpu"] else None,
                           arch_list=None if args.backend == "ray" else arch_list(plan.devices),
                           pch=args.pch and args.backend == "local",
                           corpus=[str(p.resolve()) for p in (problems, candidates)],
                           cache_dir=Path(args.cache).resolve() if args.cache else None)
    if not args.quiet:
        where = "Ray" + (f" at {args.address}" if args.address else " (local instance)") if args.backend == "ray" \
            else plan.describe()
        console.print(f"kgate audit: {len(pairs)} candidate(s)" + (f" (shard {spec[0]}/{spec[1]})" if spec else "")
                      + (f", {len(pairs) - len(todo)} already judged" if args.resume else "")
                      + f"; {len(gate_names)} gates + the standard test"
                      + (f" at each of {', '.join(dtypes)}" if dtypes != ["float32"] else "") + f"; {where}",
                      highlight=False)
    stop_at = time.monotonic() + args.max_time if args.max_time is not None else None
    if options.pch and any(p.problem is not None and needs_compile(p) for p in todo):
        from kgate.audit import pch

        built, line = pch.build()
        if not args.quiet or not built:
            console.print(line, highlight=False)
    if args.compile_only:
        return _compile_only(console, todo, options, plan, stop_at)
    judges = len(plan.devices) * plan.slots if args.backend == "local" else 2  # Ray: the cluster's, unknown here
    parts: dict[str, list[list[str]]] = {}  # split_parts: candidates judged in parts by several workers
    # the sizes order the candidates when more than the judges wait, and with gates they say which to split
    splitting = args.split and args.backend == "local" and bool(options.gates)
    if args.order == "longest" and judges > 1 and (len(todo) > judges or (splitting and todo)):
        started = time.monotonic()
        counting = len({p.problem for p in todo if p.problem is not None})
        with console.status(f"counting the sizes of {counting} problem(s) to judge the longest first",
                            spinner="dots") if not args.quiet else contextlib.nullcontext():
            sizes = count_sizes(todo, options, one=splitting)
            todo = longest_first(todo, options, sizes)
            parts = split_parts(todo, options, judges, sizes) if splitting else {}
        if not args.quiet:
            console.print(f"kgate audit: the longest problems first (sizes counted in "
                          f"{time.monotonic() - started:.1f} s; --order given: in id order)", highlight=False)
            if parts:
                shown = ", ".join(f"{pid} ({len(groups)})" for pid, groups in list(parts.items())[:3])
                console.print(f"kgate audit: {len(parts)} candidate(s) judged in parts, each by several workers at "
                              f"once: {shown}{' ...' if len(parts) > 3 else ''} (--no-split: one worker each)",
                              highlight=False)
    if args.backend == "local" and todo and "accumulation" in (options.gates or ()):
        # before any worker (the compile stage's run candidates' code too)
        from kgate.runner import seed_private_folders

        line = seed_private_folders(plan.devices)
        if line and not args.quiet:
            console.print(line, highlight=False)
    cancel = threading.Event()
    with _progress(console, len(todo), quiet=args.quiet) as progress:
        try:
            if args.backend == "ray":
                from kgate.audit.ray_backend import run_ray

                run_ray(todo, options, address=args.address, device=plan.devices[0], slots=plan.slots,
                        sink=results.append, progress=progress, stop_at=stop_at, cancel=cancel)
            else:
                run_local(todo, options, plan, results.append, progress, stop_at=stop_at, cancel=cancel,
                          parts=parts)
        except KeyboardInterrupt:
            cancel.set()
            raise
    records = [r for r in results.read().values() if r["id"] in ids]
    summary = audit_report.summarize(records, options.gate_ids, selected=len(pairs))
    audit_report.render(console, summary)
    label = f"kernelbench audit of {candidates} against {problems}"
    if args.json:
        audit_report.write_json(Path(args.json), records, summary, label)
    if args.junit:
        junit.write(audit_report.to_report(records, label), args.junit)
    if args.report:
        command = shlex.join(["kgate", "audit", *sys.argv[2:]]) if sys.argv[1:2] == ["audit"] else "kgate audit"
        path = audit_report.write_markdown(Path(args.report), summary, records, command=command,
                                           per_stratum=args.sample)
        console.print(f"report: {path}", highlight=False)
    left = len(pairs) - len(records)
    if left:
        console.print(f"[yellow]{left} candidate(s) not judged yet; run the same command with --resume[/]")
        return EXIT_INCOMPLETE
    if records and not summary["judged"]:
        console.print("[bold red]kgate audit: no candidate could be judged[/] (see the reasons above and the "
                      f"logs in {out / 'logs'})")
        return 2
    if unpaired:  # an input error the JUnit file counts as one: not a pass, whatever the others did
        console.print(f"[bold red]kgate audit: {len(unpaired)} candidate(s) pair with no problem[/] (none of that "
                      "name, or several; listed at the start and in results.jsonl): name each after its problem "
                      "(X.py or X__anything.py for problem X.py), or pair them with --index", highlight=False)
        return 1
    if summary["not_judged"]:  # unverified is not a pass: the reasons are listed above, each with what to do
        console.print(f"[bold red]kgate audit: {summary['not_judged']} candidate(s) not judged[/] (the reasons are "
                      "listed above): the audit passes only when every candidate is judged and passes",
                      highlight=False)
        return 1
    return 1 if summary["violation"] else 0


def _compile_only(console: Console, todo: list, options: AuditOptions, plan: Plan, stop_at: float | None) -> int:
    from kgate.audit.evaluate import compile_pair, needs_compile

    """Build the extensions of `todo` (those that build one) into the cache, `plan.compile_jobs` at a
    time; no new build starts after `stop_at`. Exit 0 when every build ran, EXIT_INCOMPLETE otherwise."""
    from concurrent.futures import ThreadPoolExecutor

    builds = [p for p in todo if p.problem is not None and needs_compile(p)]
    console.print(f"compile only: {len(builds)} of {len(todo)} candidate(s) build an extension; "
                  f"{plan.compile_jobs} build(s) at once", highlight=False)

    cancel = threading.Event()

    def build(pair):
        if cancel.is_set() or (stop_at is not None and time.monotonic() > stop_at):
            return pair, None
        return pair, compile_pair(pair, options, cancel=cancel)

    counts = {"built": 0, "failed": 0, "not started": 0}
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=plan.compile_jobs, thread_name_prefix="kgate-compile") as pool:
        try:
            for pair, outcome in pool.map(build, builds):
                kind = "not started" if outcome is None else ("built" if outcome.get("ok") else "failed")
                counts[kind] += 1
                if outcome is not None:
                    console.print(f"{kind:6s} {pair.id} ({outcome.get('wall_s', 0):.1f} s)"
                                  + (f": {str(outcome.get('message', ''))[-200:]}" if kind == "failed" else ""),
                                  highlight=False)
        except KeyboardInterrupt:
            cancel.set()  # the builds in flight are killed (their locks are cleared before a later build)
            raise
    console.print(f"compile only: {counts['built']} built, {counts['failed']} failed, {counts['not started']} not "
                  f"started (--max-time) in {time.monotonic() - start:.0f} s; cache: {options.out_dir}",
                  highlight=False)
    return EXIT_INCOMPLETE if counts["not started"] else 0


def _console() -> Console:
    probe = Console(highlight=False)
    return probe if probe.is_terminal else Console(highlight=False, width=160)


class _ConsoleProgress:
    """A live bar with ETA on a terminal; one line per finished candidate elsewhere. It is the scheduler's
    Progress (kgate.audit.scheduler.Progress) in all but the base class: that module imports torch, which
    `kgate --help` must not."""

    def __init__(self, console: Console, total: int, quiet: bool):
        self.console = console
        self.quiet = quiet
        self.counts = {"pass": 0, "violation": 0, "not judged": 0}
        self.live = console.is_terminal and not quiet
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                            transient=True)
        self.task = self.bar.add_task("audit", total=total)
        self._lock = threading.Lock()
        self._wider: set[str] = set()  # ids judged again now in a wider share, not finished yet

    def __enter__(self) -> _ConsoleProgress:
        if self.live:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.bar.stop()

    def started(self, pair: Any, device: str) -> None:
        pass

    def compiled(self, pair: Any, outcome: dict[str, Any]) -> None:
        pass

    def finished(self, record: dict[str, Any]) -> None:
        from kgate.audit import report as audit_report

        c = audit_report.classify(record)
        key = "not judged" if not c["judged"] else ("violation" if c["violation"] else "pass")
        with self._lock:
            self.counts[key] += 1
            if record.get("alone"):  # no longer waiting for a whole device
                self._count_held(-1)
            self._done_wider(record["id"])
            text = self._text()
        if self.live:
            self.bar.update(self.task, advance=1, description=text)
        elif not self.quiet:
            std = (record.get("standard") or {}).get("verdict", "-")
            flagged = [f.gate for f in audit_report.record_findings(record) if f.verdict == "fail"]  # tamper
            said = (f"violated: {','.join(c['violated_gates'] + flagged) or '-'}" if c["judged"]
                    else f"why: {audit_report.not_judged_reason(record, c)[:160]}")
            if record.get("tamper"):
                said += f"; {str(record['tamper'])[:160]}"
            self.console.print(f"{key:>10} {escape(plain(record['id']))} (standard {std}; {escape(plain(said))}; "
                               f"{record.get('duration_s', 0):.1f}s)", highlight=False)

    def _count_held(self, change: int) -> None:
        self.counts[HELD] = max(0, self.counts.get(HELD, 0) + change)

    def _done_wider(self, pair_id: str) -> None:
        if pair_id in self._wider:
            self._wider.discard(pair_id)
            self.counts[WIDER] = len(self._wider)

    def _text(self) -> str:
        return " · ".join(f"{k} {v}" for k, v in self.counts.items())

    def held(self, pair: Any, why: str) -> None:
        """A candidate waiting for a whole device: counted on the bar (else one line), so a run whose last
        minutes go to such candidates one at a time says why."""
        with self._lock:
            self._count_held(+1)
            self._done_wider(pair.id)  # outgrew the wider share too
            text = self._text()
        if self.live:
            self.bar.update(self.task, description=text)
        elif not self.quiet:
            self.console.print(f"{'held':>10} {escape(plain(pair.id))} ({why}: to be judged alone, with a whole device)",
                               highlight=False)

    def widened(self, pair: Any, share: float | None) -> None:
        """A candidate judged again at once in a wider share: counted on the bar while it runs (else one
        line)."""
        with self._lock:
            self._wider.add(pair.id)
            self.counts[WIDER] = len(self._wider)
            text = self._text()
        if self.live:
            self.bar.update(self.task, description=text)
        elif not self.quiet:
            self.console.print(f"{'again':>10} {escape(plain(pair.id))} (ran out of memory in its share: judged again "
                               f"now with {share:.0%} of the GPU's memory)", highlight=False)


HELD = "held for a whole device"  # the console's count of candidates waiting for one
WIDER = "again in a wider share"  # the console's count of candidates judged again now with more memory


def _progress(console: Console, total: int, quiet: bool) -> _ConsoleProgress:
    return _ConsoleProgress(console, total, quiet)
