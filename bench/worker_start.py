"""Worker start, spawn to ready to judge: workers started by kgate.runner.supervise the old way (each its own
`python -m MODULE JOB.json`, KGATE_FORKSERVER=0) and forked from a template (kgate.forkserver), side by side,
alternating, in one process, in the same sandbox; prints the median of each, their ratio, and the template's
own start (paid once per run and configuration).

    python bench/worker_start.py --repeat 10                  # on the CPU, the sandbox kgate would choose
    python bench/worker_start.py --repeat 10 --cuda           # ... each worker also makes its CUDA context
    python bench/worker_start.py --repeat 10 --sandbox none   # unsandboxed (old path: no bubblewrap either)

"Ready" is what kgate's worker reaches before it loads a kernel: torch and kgate's gate modules imported, the
process prepared (memory limit, threads), the device made current (with --cuda, its CUDA context made), the
first event sent. The worker is a module of this script's, given to supervise as kgate gives kgate.worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORKER = '''
import json, os, sys


def run_job(job):
    from kgate.worker import Channel, prepare_device, prepare_process

    channel = Channel(int(job["event_fd"]))
    prepare_process(job)
    from kgate import gates, inputs, loading, manifest, subject  # what kgate.worker imports before loading

    prepare_device(job["device"])
    if job["device"].startswith("cuda"):
        import torch

        torch.zeros(1, device=job["device"])  # the CUDA context
    channel.send("ready")
    return 0


if __name__ == "__main__":
    sys.exit(run_job(json.load(open(sys.argv[1]))))
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10, help="workers of each kind (default 10)")
    parser.add_argument("--cuda", action="store_true", help="each worker also makes its CUDA context")
    parser.add_argument("--sandbox", choices=("auto", "require", "none"), default="auto")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)

    from kgate import forkserver, runner, sandbox

    box = sandbox.select(args.sandbox)
    folder = Path(tempfile.mkdtemp(prefix="kgate-bench-"))
    (folder / "bench_worker_start.py").write_text(WORKER)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    device = "cuda:0" if args.cuda else "cpu"

    def start(path: str) -> tuple[float, float]:
        os.environ[forkserver.SWITCH_ENV] = "1" if path == "template" else "0"
        begun = time.perf_counter()
        ready: list[float] = []

        def on_event(event):
            if event.get("event") == "ready":
                ready.append(time.perf_counter() - begun)

        done = runner.supervise("bench_worker_start", {"device": device, "memory": 1 << 34}, cwd=folder,
                                log_path=folder / "log.txt", timeout=300, memory=1 << 34, on_event=on_event)
        if done.returncode != 0 or not ready:
            raise SystemExit(f"worker failed ({path}): {done}: {(folder / 'log.txt').read_text()[-2000:]}")
        return ready[0], time.perf_counter() - begun

    first, _ = start("template")  # the template's own start: imports torch and kgate once
    times: dict[str, dict[str, list[float]]] = {p: {"ready": [], "exit": []} for p in ("old", "template")}
    for _ in range(args.repeat):
        for path in ("old", "template"):
            ready, ended = start(path)
            times[path]["ready"].append(ready)
            times[path]["exit"].append(ended)
    figures = {p: {k: statistics.median(v) for k, v in t.items()} for p, t in times.items()}
    os.environ[forkserver.SWITCH_ENV] = "1"
    what = "importing torch and kgate" + (", making its CUDA context" if args.cuda else "")
    print(f"sandbox: {box.describe()}; worker {what}; {args.repeat} of each, alternating")
    print(f"{'':30}{'to ready (s)':>14}{'to exit (s)':>14}")
    for path, label in (("old", "own process (python -m)"), ("template", "forked from the template")):
        print(f"{label:30}{figures[path]['ready']:14.3f}{figures[path]['exit']:14.3f}")
    ratio = figures["old"]["ready"] / figures["template"]["ready"]
    print(f"own process / template: {ratio:.1f}x to ready; the template's own first start (once): {first:.2f} s")
    goal = figures["template"]["ready"] < 1.0
    print(f"goal (spawn to ready under 1 s): {'met' if goal else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sandbox": box.describe(), "device": device, "repeat": args.repeat,
                                               "median_s": figures, "ratio_ready": ratio, "template_first_s": first,
                                               "samples_s": times}, indent=1))
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
