"""What the sandbox costs a worker's start: workers started by kgate.runner.supervise side by side, with the
sandbox (bubblewrap) and without it, alternating, in one process; prints the median start-to-first-event and
start-to-exit times of each and their ratio.

    python bench/sandbox_start.py --repeat 20             # a worker that imports torch, then reports
    python bench/sandbox_start.py --repeat 20 --bare      # a worker that imports nothing
    python bench/sandbox_start.py --repeat 20 --cuda      # ... imports torch and makes its CUDA context

The worker is a module of this script's, started the way every kgate worker is (kgate.runner.kgate_command
inside the sandbox's command, its job file in its own scratch folder, its output through the capped log).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORKER = """
import json, os, sys
job = json.load(open(sys.argv[1]))
if job["torch"]:
    import torch
    if job["cuda"]:
        torch.zeros(1, device="cuda")  # the CUDA context: the driver's device nodes inside the sandbox
os.write(job["event_fd"], b'{"event": "ready"}\\n')
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10, help="workers of each kind (default 10)")
    parser.add_argument("--bare", action="store_true", help="the worker imports nothing (default: torch)")
    parser.add_argument("--cuda", action="store_true", help="the worker also makes its CUDA context")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)

    from kgate import runner, sandbox

    box = sandbox.choose("auto")
    if not box.active:
        print(f"no sandbox here: {box.detail}", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="kgate-bench-"))
    (folder / "bench_start_worker.py").write_text(WORKER)
    times: dict[str, dict[str, list[float]]] = {m: {"ready": [], "exit": []} for m in ("none", "auto")}
    import os

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    for _ in range(args.repeat):
        for mode in ("none", "auto"):
            sandbox.select(mode)
            start = time.perf_counter()
            ready: list[float] = []

            def on_event(event, ready=ready, start=start):
                if event.get("event") == "ready":
                    ready.append(time.perf_counter() - start)

            done = runner.supervise("bench_start_worker", {"torch": not args.bare, "cuda": args.cuda}, log_path=folder / "log.txt",
                                    cwd=folder, timeout=120, memory=1 << 34, on_event=on_event)
            if done.returncode != 0 or not ready:
                print(f"worker failed ({mode}): {(folder / 'log.txt').read_text()[-2000:]}", file=sys.stderr)
                return 1
            times[mode]["ready"].append(ready[0])
            times[mode]["exit"].append(time.perf_counter() - start)
    figures = {mode: {k: statistics.median(v) for k, v in t.items()} for mode, t in times.items()}
    what = "bare" if args.bare else "importing torch" + (" and making its CUDA context" if args.cuda else "")
    print(f"sandbox: {box.describe()}; worker {what}; "
          f"{args.repeat} workers of each kind, alternating")
    print(f"{'':14}{'to ready (s)':>14}{'to exit (s)':>14}")
    for mode, label in (("none", "no sandbox"), ("auto", "sandbox")):
        print(f"{label:14}{figures[mode]['ready']:14.3f}{figures[mode]['exit']:14.3f}")
    ratio = figures["auto"]["ready"] / figures["none"]["ready"]
    extra = figures["auto"]["ready"] - figures["none"]["ready"]
    print(f"sandbox / none: {ratio:.2f}x to ready ({extra * 1000:+.0f} ms)")
    if args.json:
        Path(args.json).write_text(json.dumps({"sandbox": box.describe(), "repeat": args.repeat,
                                               "worker": what, "median_s": figures,
                                               "ratio_ready": ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
