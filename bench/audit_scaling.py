"""Multi-GPU scaling of `kgate audit`: the same fixed set of candidates judged on 1 GPU and on
N GPUs of one machine, in one process, and the verdicts of the runs compared.

Stages, in order:
1. compile: every extension built once on the CPU cores into one cache (timed; every run below uses it);
2. one timed pass per device count in --devices (e.g. 1,all): the evaluation pool of `kgate audit`
   (`kgate.audit.scheduler.run_local`) on the first N visible GPUs, --jobs-per-device workers on each,
   each worker limited to its share of its GPU's memory, exactly as `kgate audit --device cuda --jobs
   N x jobs-per-device` plans it.
Reported per run: wall seconds, kernels per hour, and the scaling efficiency (kernels per hour on N
devices / (N x kernels per hour on the first run's device count)); then whether every candidate got
the same verdicts (the standard test's and every gate's) in every run, with each difference listed.
On the CPU (--device cpu, for testing) a "device" is --jobs-per-device workers more on the one CPU.

    python bench/audit_scaling.py --problems P --candidates C [--index I] --device cuda --devices 1,all \
        --jobs-per-device 6 --limit 300 --out /tmp/kgate-scaling --json scaling.json --markdown scaling.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit_common import add_corpus_args, compile_stage, differences, ordered, select, timed_pass  # noqa: E402

from kgate import gates as registry  # noqa: E402
from kgate.audit.evaluate import AuditOptions  # noqa: E402
from kgate.audit.scheduler import Plan, arch_list  # noqa: E402
from kgate.runner import cuda_devices  # noqa: E402


def device_counts(spec: str, available: int) -> list[int]:
    counts = []
    for part in spec.split(","):
        n = available if part.strip() == "all" else int(part)
        if not 1 <= n <= available:
            sys.exit(f"--devices {spec}: {n} device(s) asked for, {available} available")
        if n not in counts:
            counts.append(n)
    return counts


def markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# Audit scaling across GPUs", "",
             f"Command: `{command}`", "",
             f"{result['when']}; {result['hardware']}; {result['candidates']} candidate(s), "
             f"{result['jobs_per_device']} worker(s) per device; compile stage (once, shared by every run): "
             f"{result['compile']['kernels']} extension(s) in {result['compile']['wall_s']} s.", "",
             "| devices | workers | kernels | wall s | kernels/h | scaling efficiency | verdicts as the first run |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for run in result["runs"]:
        same = "(the first run)" if run is result["runs"][0] else (
            "identical" if not run["differences"] else f"{len(run['differences'])} candidate(s) differ")
        lines.append(f"| {run['devices']} | {run['workers']} | {run['kernels']} | {run['wall_s']} | "
                     f"{run['kernels_per_hour']} | {run['efficiency']} | {same} |")
    lines.append("")
    lines.append("Scaling efficiency: kernels per hour on N devices / (N x kernels per hour of the first run per "
                 "device). Verdicts: the standard test's and every gate's, per candidate.")
    for run in result["runs"][1:]:
        if run["differences"]:
            lines += ["", f"Differences on {run['devices']} device(s):", ""]
            lines += [f"- {d}" for d in run["differences"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_args(parser)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--devices", default="1,all", help="device counts to run, e.g. 1,all or 1,2,4 (default 1,all)")
    parser.add_argument("--jobs-per-device", type=int, default=1)
    parser.add_argument("--memory", default=None, help="host memory per worker, as kgate audit --memory (e.g. 24GiB)")
    parser.add_argument("--markdown", type=Path, help="write the figures as markdown here (docs/audit/scaling.md)")
    args = parser.parse_args(argv)

    pairs = select(args)
    if args.device == "cuda":
        visible = cuda_devices()
        if not visible:
            sys.exit("--device cuda: no CUDA device is visible")
        names = [f"cuda:{i}" for i in visible]
        # asked of a short-lived process: this one must hold no CUDA context (as kgate audit's parent)
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                               capture_output=True, text=True, timeout=120)
        hardware = f"{len(names)} x {probe.stdout.strip() or 'GPU'}"
    else:
        names = ["cpu"] * 64  # CPU "devices": more workers on the one CPU
        hardware = "CPU"
    counts = device_counts(args.devices, len(names) if args.device == "cuda" else 64)
    compile_jobs = args.compile_jobs or 8
    base: dict[str, Any] = dict(out_dir=args.out, timeout=args.timeout,
                                arch_list=arch_list(names) if args.device == "cuda" else None,
                                pch=args.pch)  # torch threads: run_local shares the cores among each run's judges
    if args.memory:
        from kgate.manifest import parse_memory

        base["memory"] = parse_memory(args.memory)
    options = AuditOptions(gates=list(registry.GATE_NAMES), **base)
    pairs = ordered(pairs, args.order, options)  # the full gates' order, the same for every device count
    print(f"{len(pairs)} candidate(s), order {args.order}; device counts {counts}; {args.jobs_per_device} worker(s) "
          "per device", flush=True)
    compile_row, _ = compile_stage(pairs, base, compile_jobs, args.pch)

    runs: list[dict[str, Any]] = []
    first_records: list[dict[str, Any]] = []
    for n in counts:
        if args.device == "cuda":
            plan = Plan(names[:n], args.jobs_per_device, compile_jobs, compile_stage=False)
        else:
            plan = Plan(["cpu"], args.jobs_per_device * n, compile_jobs, compile_stage=False)
        row, records = timed_pass(pairs, options, plan, f"{n} device(s)")
        row.update(devices=n, workers=n * args.jobs_per_device)
        if not runs:
            first_records, per_device = records, (row["kernels_per_hour"] or 0) / n
        row["efficiency"] = round((row["kernels_per_hour"] or 0) / (n * per_device), 3) if per_device else None
        row["differences"] = differences(first_records, records) if runs else []
        runs.append(row)

    result = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "hardware": hardware, "candidates": len(pairs), "jobs_per_device": args.jobs_per_device,
              "compile": compile_row, "runs": runs}
    command = "python bench/audit_scaling.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                   else sys.argv[1:]))
    text = markdown(result, command)
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
