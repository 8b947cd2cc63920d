"""`kgate hook FILE...`: what the pre-commit hook runs.

Maps the changed files to the manifest entries that use them (the kernel's, the reference's and the
input factory's files, and the entry's `files:` globs; a changed manifest selects every kernel),
then judges those kernels with a quick profile: a fast subset of gates, the smallest declared shape,
the first dtype and seed, on the GPU when there is one and on the CPU otherwise, within a time budget.
Exit 1 lists kernel / gate / finding for each violation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import replace
from math import prod
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from kgate import names as registry
from kgate.changes import kernels_for_files
from kgate.commands import add_sandbox_option
from kgate.commands.run import CACHE_ENV, cache_dir
from kgate.errors import UsageError
from kgate.gates.base import ERROR, FAIL
from kgate.manifest import ResolvedKernel, load
from kgate.report import KernelResult
from kgate.reports.github import plain
from kgate.runner import Runner, RunOptions

# Cheap gates that catch most broken kernels; the slow ones (long sweeps, sanitizers) stay for CI.
QUICK_GATES = ("contract", "oracle", "special_values", "input_integrity", "determinism")
DEFAULT_BUDGET_S = 120.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hook", help="pre-commit: gate the kernels that the changed files belong to (quick profile)",
        description="Gate only the kernels of MANIFEST that use one of FILES (kernel, reference, inputs and "
        "`files:` globs; a changed manifest means every kernel), with a quick profile: the gates "
        f"{', '.join(QUICK_GATES)} (those the kernel selects), its smallest shape, first dtype and first seed, "
        "on the GPU if there is one, else the CPU, within --budget seconds. Exit 1 on a violation, listing "
        "kernel / gate / finding and a reproducer.")
    p.add_argument("files", nargs="*", metavar="FILE", help="changed files (pre-commit passes them)")
    p.add_argument("--manifest", "-m", default="kgate.yaml", help="the manifest (default: ./kgate.yaml)")
    p.add_argument("--gate", "-g", action="append", default=[], metavar="GATE",
                   help="run these gates instead of the quick subset (repeat or comma-separate)")
    p.add_argument("--full", action="store_true", help="every gate, shape, dtype and seed the manifest declares")
    p.add_argument("--device", default="auto", metavar="D", help="auto (default: GPU if present, else CPU), cpu, "
                   "cuda, cuda:N; overrides the manifest's")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"stop starting kernels after this long (default {DEFAULT_BUDGET_S:g}); the ones left are "
                   "listed, not failed")
    p.add_argument("--out", metavar="DIR", help="keep worker logs and results here (default: a temporary folder)")
    p.add_argument("--cache", metavar="DIR", default=os.environ.get(CACHE_ENV) or None,
                   help="keep each kernel's build caches here across commits, as `kgate run --cache` (default: "
                        f"${CACHE_ENV}, else a temporary folder): a kernel unchanged since the last commit is not "
                        "compiled again")
    add_sandbox_option(p)
    p.set_defaults(func=main)


# --------------------------------------------------------------------------------------------------
# The quick profile.


def _smallest(shapes: list) -> list[tuple[int, ...]] | None:
    declared = [s for s in shapes if s is not None]
    return [min(declared, key=lambda s: (prod(s), len(s)))] if declared else None


def quick_options(kernel: ResolvedKernel, base: RunOptions, gates: list[str] | None, full: bool) -> RunOptions:
    if full:
        return base
    selected = kernel.selected_gates(registry.GATE_NAMES)
    chosen = gates or [g for g in selected if g in QUICK_GATES] or selected[:1]
    return replace(base, gates=chosen, shapes=_smallest(kernel.shapes), seeds=kernel.seeds[:1],
                   dtypes=kernel.dtypes[:1])


def _print_findings(console: Console, result: KernelResult) -> None:
    for g in result.gates:
        if g.verdict not in (FAIL, ERROR):
            continue
        label = "FAIL" if g.verdict == FAIL else "ERROR"
        console.print(f"{label} {result.name} / {g.gate}: {escape(plain(' '.join(g.message.split())))}")
        if result.source_file:
            path = Path(result.source_file)
            if path.is_absolute() and path.is_relative_to(Path.cwd()):
                path = path.relative_to(Path.cwd())
            where = f"{path}:{result.source_line}" if result.source_line else str(path)
            console.print(f"    kernel: {where}")
        if g.repro:
            console.print(f"    reproduce: {escape(plain(g.repro))}")


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    gates = registry.parse_option(args.gate)
    if args.budget <= 0:
        raise UsageError("--budget must be a positive number of seconds")
    manifest = load(args.manifest)
    kernels = kernels_for_files(manifest, args.files)
    if not kernels:
        console.print(f"kgate hook: no kernel of {args.manifest} uses the {len(args.files)} changed file(s); "
                      "nothing to gate")
        return 0
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="kgate-hook-"))
    started = time.monotonic()
    results: list[KernelResult] = []
    left: list[str] = []
    profile = "every gate, shape, dtype and seed" if args.full else (
        f"quick profile: gates {', '.join(gates) if gates else 'of ' + ', '.join(QUICK_GATES)}; "
        "smallest shape, first dtype and seed")
    console.print(f"kgate hook: {len(kernels)} kernel(s) use the changed files ({profile}; device {args.device})")
    caches = cache_dir(args)
    try:
        for kernel in kernels:
            remaining = args.budget - (time.monotonic() - started)
            if remaining <= 0:
                left.append(kernel.name)
                continue
            base = RunOptions(device=args.device, timeout=min(kernel.limits.timeout, max(remaining, 10.0)),
                              out_dir=out_dir, cache_dir=caches)
            options = quick_options(kernel, base, gates or None, args.full)
            result = Runner(manifest, [kernel], options).run()[0]
            results.append(result)
            verdict = {"pass": "pass", "fail": "FAIL", "error": "ERROR"}[result.verdict]
            console.print(f"  {verdict:5} {kernel.name} ({', '.join(g.gate for g in result.gates)}; "
                          f"{result.device}, {result.duration_s:.1f}s)")
    finally:
        if not args.out:
            shutil.rmtree(out_dir, ignore_errors=True)
    for result in results:
        _print_findings(console, result)
    if left:
        console.print(f"kgate hook: time budget of {args.budget:g}s spent; not judged: {', '.join(left)} "
                      f"(run `kgate run {args.manifest} -k NAME`, or raise --budget)")
    bad = [r for r in results if r.verdict != "pass"]
    console.print(f"kgate hook: {len(results) - len(bad)} passed, {len(bad)} with violations "
                  f"in {time.monotonic() - started:.1f}s")
    return 1 if bad else 0
