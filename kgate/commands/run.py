"""`kgate run`: gate the kernels of a manifest and write the reports."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rich.console import Console

from kgate import names as registry
from kgate.commands import SECONDS, SEED, add_sandbox_option, writable
from kgate.errors import UsageError
from kgate.manifest import DTYPE_ALIASES, DTYPES, load, parse_memory
from kgate.report import Report, environment, now
from kgate.reports import console as console_report
from kgate.reports import junit
from kgate.runner import Runner, RunOptions
from kgate.selection import matcher

# The --cache default from the environment: the kernels' build caches kept across runs.
CACHE_ENV = "KGATE_RUN_CACHE"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="gate the kernels of a manifest",
        description="Run the gates on every kernel of MANIFEST (default ./kgate.yaml), each kernel in its own "
        "worker process with a time and a memory limit. Exit 0 when all pass, 1 on any violation or kernel "
        "error, 2 on a usage, manifest or infrastructure error.")
    p.add_argument("manifest", nargs="?", default="kgate.yaml", help="the manifest (default: ./kgate.yaml)")
    p.add_argument("-k", dest="select", metavar="EXPR",
                   help="only kernels matching EXPR: a name, a substring, or words with and/or/not (like pytest -k)")
    p.add_argument("--gate", "-g", action="append", metavar="GATE", default=[],
                   help="run only this gate (repeat, or comma-separate; NAME[backward]: only its "
                        "gradients' phase); `kgate gates` lists them")
    p.add_argument("--device", metavar="D", help="auto, cpu, cuda or cuda:N (default: the manifest's)")
    p.add_argument("--seed", action="append", type=SEED, metavar="S", default=[],
                   help="use this seed instead of the manifest's (repeatable)")
    p.add_argument("--dtype", action="append", metavar="DTYPE", default=[],
                   help="use this dtype instead of the manifest's (repeatable)")
    p.add_argument("--shape", action="append", metavar="N,M,...", default=[],
                   help="use this shape instead of the manifest's (repeatable), e.g. --shape 7,1000")
    p.add_argument("--timeout", type=SECONDS, metavar="SECONDS", help="time limit per gate of one kernel")
    p.add_argument("--memory", metavar="SIZE", help="memory limit per worker, e.g. 8GiB")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="workers at once (default 1): kernels judged in parallel; with fewer kernels than N, "
                        "each kernel's gates are spread over N // kernels workers; N workers share the cores (torch's "
                        "CPU threads), and several on one GPU its memory in equal shares: what runs out of memory "
                        "in its share is judged again alone, with the whole GPU, after the shared work (one "
                        "kgate run per GPU)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML here")
    p.add_argument("--json", metavar="PATH", help="write the JSON report here")
    p.add_argument("--out", metavar="DIR", default="kgate-out",
                   help="folder for the streamed results.jsonl, report.json and worker logs (default kgate-out)")
    p.add_argument("--resume", action="store_true",
                   help="keep OUT/results.jsonl and judge only the (kernel, gate) results it lacks, or whose "
                        "gate judged nothing (not run, cancelled): a run cut short (a time limit, a lost "
                        "machine) goes on where it stopped. Use the same command otherwise; the report "
                        "holds the kept results and the new ones")
    p.add_argument("--cache", metavar="DIR", default=os.environ.get(CACHE_ENV) or None,
                   help="keep each kernel's build caches (Triton's cache and autotuning, torch extensions, the "
                        "manifest's cache_env) in DIR/<name>-<digest> across runs, so a later run or --resume of the "
                        "same kernel does not compile again; a changed kernel gets a fresh folder, and no kernel "
                        f"sees another's (default: ${CACHE_ENV}, else a temporary folder removed at exit)")
    p.add_argument("--container", metavar="IMAGE",
                   help="run the gates inside this container image (docker SDK): no network, the current folder "
                   "mounted read-only, --out writable, GPUs passed through (see --gpus)")
    p.add_argument("--gpus", metavar="WHICH", default="all",
                   help="with --container: all (default), none, a count (2) or device ids (0,1); "
                   "--device cpu requests none")
    p.add_argument("--container-timeout", type=SECONDS, default=3600.0, metavar="SECONDS",
                   help="with --container: wall-clock limit of the whole container (default 3600)")
    p.add_argument("--container-memory", metavar="SIZE",
                   help="with --container: memory limit of the container (default: 80%% of the host's memory)")
    p.add_argument("--changed", metavar="LIST",
                   help="only kernels that use a file listed in LIST (one path a line, relative to the current "
                   "folder or, in a git work tree, to its top folder as `git diff --name-only` prints them; '-' "
                   "reads stdin): kernel, reference, inputs and `files:` globs; a listed manifest selects all")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, only the table and findings")
    add_sandbox_option(p)
    p.set_defaults(func=main)


def _split(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def options_from(args: argparse.Namespace) -> RunOptions:
    gates = registry.parse_option(args.gate)
    dtypes = [DTYPE_ALIASES.get(d, d) for d in _split(args.dtype)]
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"--dtype {d}: use one of {', '.join(DTYPES)}")
    shapes = []
    for text in args.shape:
        try:
            shapes.append(() if text == "scalar" else tuple(int(x) for x in text.split(",") if x.strip()))
        except ValueError:
            raise UsageError(f"--shape {text}: write sizes separated by commas, e.g. 7,1000") from None
    if args.device and args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
        raise UsageError(f"--device {args.device}: use auto, cpu, cuda or cuda:N")
    try:
        memory = parse_memory(args.memory) if args.memory else None
    except ValueError as exc:
        raise UsageError(f"--memory: {exc}") from None
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    return RunOptions(gates=gates or None, device=args.device, seeds=args.seed or None, dtypes=dtypes or None,
                      shapes=shapes or None, timeout=args.timeout, memory=memory, jobs=args.jobs,
                      out_dir=Path(args.out), resume=getattr(args, "resume", False), cache_dir=cache_dir(args))


def cache_dir(args: argparse.Namespace) -> Path | None:
    """--cache, made if missing (a usage error, exit 2, where it cannot be)."""
    value = getattr(args, "cache", None)
    if not value:
        return None
    writable(value, "--cache", folder=True)
    folder = Path(value).expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--cache {value}: cannot make the folder ({exc.strerror or exc}); name a writable "
                         "folder") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--cache {value}: the folder is not writable; name a writable folder")
    return folder


def main(args: argparse.Namespace) -> int:
    if args.container:
        from kgate.container import run_in_container

        return run_in_container(args)
    console = make_console()
    options = options_from(args)
    writable(args.json, "--json")
    writable(args.junit, "--junit")
    manifest = load(args.manifest)
    kernels = manifest.kernels
    if not kernels:
        raise UsageError(f"{args.manifest} lists no kernel entries for `kgate run`, only `format: kernelbench` "
                         f"corpora: judge those with `kgate audit --manifest {args.manifest}`")
    if args.select:
        keep = matcher(args.select, [k.name for k in kernels])
        kernels = [k for k in kernels if keep(k.name)]
        if not kernels:
            raise UsageError(f"-k {args.select!r} selects no kernel of {args.manifest}; "
                             f"names: {', '.join(k.name for k in manifest.kernels)}")
    if args.changed:
        from kgate.changes import changed_kernels, read_list

        touched = changed_kernels(manifest, read_list(args.changed))
        kernels = [k for k in kernels if k in touched]
        if not kernels:
            console.print(f"kgate: no selected kernel of {args.manifest} uses a changed file; nothing to gate")
    report = run_kernels(manifest, kernels, options, console, quiet=args.quiet)
    report.write(options.out_dir / "report.json")
    if args.json:
        report.write(args.json)
    if args.junit:
        junit.write(report, args.junit)
    return report.exit_code


def make_console() -> Console:
    """A terminal gets its own width; logs (CI, pipes) get a wide one so the table does not wrap."""
    probe = Console(highlight=False)
    return probe if probe.is_terminal else Console(highlight=False, width=160)


def run_kernels(manifest, kernels, options: RunOptions, console: Console, *, quiet: bool = False) -> Report:
    report = Report(manifest=str(manifest.path), kernels=[], environment=environment())
    console_report.sandbox_notice(console, report.environment["sandbox"])
    started = time.perf_counter()
    runner = Runner(manifest, kernels, options)
    total = sum(len(runner.gates_for(k)) for k in kernels)
    if quiet or not console.is_terminal:
        if not quiet:
            runner.events = _PlainEvents(console)
        report.kernels = runner.run()
    else:
        with console_report.ProgressEvents(console, total) as events:
            runner.events = events
            report.kernels = runner.run()
    if runner.stale:
        console.print(f"kgate: --resume: {runner.stale} result(s) in {runner.results_path} were judged on another "
                      "manifest or other kernel files (or carry no digest) and were judged again")
    report.finished = now()
    console_report.render(console, report, time.perf_counter() - started)
    return report


class _PlainEvents(console_report.ProgressEvents):
    """Progress for logs (CI, pipes): one line per finished kernel, no live bar."""

    def __init__(self, console: Console):
        self.console = console

    def gate_started(self, kernel, gate) -> None:
        pass

    def gate_finished(self, kernel, result) -> None:
        pass
