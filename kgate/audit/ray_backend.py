"""The Ray backend: the same per-pair evaluation as the local backend, one Ray task per candidate, for
audits past one machine (`kgate audit --backend ray --address HOST:PORT`).

Each task receives the problem's and the candidate's source text (the nodes need no shared file
system, only kgate installed), writes them to a node-local folder, and runs the compile stage and
the evaluation there with the same worker processes and limits as a local run. The driver appends
each record to results.jsonl as it arrives, so `--resume` works the same. A GPU task asks Ray for
1/slots of a GPU (Ray's CUDA_VISIBLE_DEVICES then makes it `cuda:0` inside the task) and its worker may
use only that share of the GPU's memory, as in the local backend; a candidate that runs out of GPU
memory (or past its host memory limit) there is judged again in a task that asks for a whole GPU,
which Ray starts only when no shared task holds that GPU: a neighbour's appetite never becomes a
candidate's verdict.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kgate.audit.evaluate import AuditOptions, compile_pair, evaluate_pair, needs_compile
from kgate.audit.scheduler import HELD_OOM, HELD_PROBLEM, Outgrown, Progress, mark_alone
from kgate.errors import InfrastructureError, UsageError
from kgate.kernelbench import Pair
from kgate.shares import memory_share

NODE_CACHE = Path(tempfile.gettempdir()) / "kgate-ray"


def _remote_evaluate(pair_json: dict[str, Any], problem_src: bytes | None, candidate_src: bytes,
                     options_json: dict[str, Any], device: str, fraction: float | None = None,
                     earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runs on a Ray worker: materialize the pair locally, compile if needed, evaluate (`earlier`: the
    record of a try in a share of a GPU, kgate.audit.evaluate.evaluate_pair)."""
    pair = Pair.from_json(pair_json)
    options = AuditOptions.from_json(options_json)
    options.out_dir = NODE_CACHE  # logs and the extension cache stay on the node, between runs too
    folder = Path(tempfile.mkdtemp(prefix="pair-", dir=_ensure(NODE_CACHE / "pairs")))
    candidate = folder / "candidate" / pair.candidate.name
    candidate.parent.mkdir()
    candidate.write_bytes(candidate_src)
    problem = None
    if problem_src is not None and pair.problem is not None:
        problem = folder / "problem" / pair.problem.name
        problem.parent.mkdir()
        problem.write_bytes(problem_src)
    local = Pair(pair.id, candidate, problem, pair.level, pair.problem_error, pair.labels)
    compiled = compile_pair(local, options) if problem is not None and needs_compile(local) else None
    record = evaluate_pair(local, options, device, gpu_memory_fraction=fraction, compiled=compiled, earlier=earlier)
    record["candidate"], record["problem"] = pair_json["candidate"], pair_json["problem"] or ""
    try:
        import socket

        record["node"] = socket.gethostname()
    except OSError:
        pass
    return record


def task_share(gpu: bool, slots: int, alone: bool) -> tuple[float, float | None]:
    """(GPUs the Ray task asks for, the share of the GPU's memory its worker may use) for a task that
    shares a GPU with slots - 1 others, or has one to itself (`alone`, or one slot per GPU)."""
    if not gpu:
        return 0.0, None
    if alone or slots <= 1:
        return 1.0, None
    return 1.0 / slots, memory_share(1, slots)


def _earlier(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a try with more memory needs of the try before (evaluate_pair's `earlier`), kept small."""
    if not record:
        return None
    return {"standard": record.get("standard"), "standard_s": record.get("standard_s"), "tamper": record.get("tamper"),
            "gates": [{k: g.get(k) for k in ("gate", "verdict", "message")} for g in record.get("gates") or []]}


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_ray(pairs: list[Pair], options: AuditOptions, *, address: str | None, device: str, slots: int,
            sink: Callable[[dict[str, Any]], None], progress: Progress | None = None,
            stop_at: float | None = None, cancel: threading.Event | None = None, num_cpus: int | None = None) -> int:
    """Judge the pairs on a Ray cluster (`address`; "local" or None starts a local instance)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--backend ray needs Ray: pip install 'kgate[ray]' (on the driver and every node)") from None
    progress = progress or Progress()
    cancel = cancel or threading.Event()
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address in (None, "", "local"):
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - connection problems come in many types
            raise InfrastructureError(f"--address {address}: cannot connect to Ray: {exc}") from None
    gpu = device.startswith("cuda")
    task_device = "cuda:0" if gpu else "cpu"
    options_json = options.to_json()
    window = max(2, 2 * slots * max(1, int(ray.cluster_resources().get("GPU" if gpu else "CPU", 1))))
    queue = list(pairs)
    in_flight: dict[Any, tuple[Pair, str | None]] = {}  # task -> (pair, why alone, or None: sharing)
    whole = Outgrown()  # problems whose candidates skip sharing (kgate.audit.scheduler)
    judged = 0

    def submit(pair: Pair, alone: str | None, earlier: dict[str, Any] | None = None) -> None:
        gpus, fraction = task_share(gpu, slots, alone is not None)
        remote = ray.remote(_remote_evaluate).options(num_cpus=1, num_gpus=gpus, max_retries=0)
        problem_src = pair.problem.read_bytes() if pair.problem is not None else None
        ref = remote.remote(pair.to_json(), problem_src, pair.candidate.read_bytes(), options_json, task_device,
                            fraction, _earlier(earlier))
        in_flight[ref] = (pair, alone)
        progress.started(pair, "ray")

    try:
        while (queue or in_flight) and not cancel.is_set():
            while queue and len(in_flight) < window and (stop_at is None or time.monotonic() < stop_at):
                pair = queue.pop(0)
                alone = HELD_PROBLEM if task_share(gpu, slots, False)[1] is not None and whole.known(pair) else None
                if alone:
                    progress.held(pair, alone)
                submit(pair, alone)
            if stop_at is not None and time.monotonic() >= stop_at:
                queue.clear()
            if not in_flight:
                break
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
            for ref in done:
                pair, alone = in_flight.pop(ref)
                try:
                    record = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a lost node or a kgate bug on the node
                    raise InfrastructureError(f"Ray task for {pair.id} failed: {exc}") from None
                if task_share(gpu, slots, alone is not None)[1] is not None and whole.needs(record, pair):
                    progress.held(pair, HELD_OOM)
                    if stop_at is None or time.monotonic() < stop_at:
                        submit(pair, HELD_OOM, record)  # not recorded now; past the deadline, left to --resume
                    continue
                if alone and gpu and slots > 1:
                    mark_alone(record, alone)
                sink(record)
                judged += 1
                progress.finished(record)
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
    return judged
