"""What keeping a model's buffers in lockstep costs before each call, per KernelBench problem, side by side in one
process: kgate's `Lockstep` load (the plan it keeps from the module's previous load: identity checks, then one
comparison of all the bits at once) against a load name by name (walk the module's buffers, compare each with its
state value bitwise, copy where it differs: what each load did before the plan was kept), before a call of the
kernel (a copy of the Model), of the reference (the Model) and of the reference's float64 copy (the oracle's).
Each figure is the median of --repeat loads after one warm-up, the device synchronized after each; every load finds
one buffer changed (as a call of a model that writes its running statistics leaves it), so both copy one.

    python bench/lockstep_load.py corpus/problems/level3/16_DenseNet201.py --device cuda --repeat 50
"""

from __future__ import annotations

import copy
import json
import runpy
from pathlib import Path
from typing import Any

from oracle_cost import problems_device, problems_parser, timed


def by_name(module: Any, state: dict[str, Any]) -> None:
    """The load name by name: each buffer of the state's names compared with its value, copied where it differs."""
    import torch

    from kgate.compare import bitwise_mismatch

    held = dict(module.named_buffers())
    with torch.no_grad():
        for name, want in state.items():
            t = held.get(name)
            if t is None or t.shape != want.shape:
                continue
            value = want.to(device=t.device, dtype=t.dtype)
            if bitwise_mismatch(value, t) is not None:
                t.copy_(value)


def measure(path: Path, device: Any, repeat: int) -> dict[str, Any]:
    import torch

    from kgate.subject import Lockstep

    torch.manual_seed(0)
    space = runpy.run_path(str(path))
    reference = space["Model"](*space.get("get_init_inputs", lambda: [])()).to(device)
    kernel, wide = copy.deepcopy(reference), copy.deepcopy(reference).double()
    lock = Lockstep(kernel, reference)
    floating = [t for t in reference.buffers() if t.is_floating_point() and t.numel()]
    row: dict[str, Any] = {"problem": path.name, "buffers": len(lock.state)}
    if not floating:
        return row
    for label, module, planned in (("kernel", kernel, lock.before_kernel), ("reference", reference,
                                   lambda: lock.load(reference)), ("float64 copy", wide, lambda: lock.load(wide))):
        target = next(t for t in module.buffers() if t.is_floating_point() and t.numel())

        def moved(load: Any, target: Any = target) -> Any:
            def run() -> None:
                with torch.no_grad():
                    target.add_(1.0)  # one buffer moved since the last load, as a call leaves it
                load()
            return run

        row[f"{label}_plan_ms"] = timed(moved(planned), device, repeat) * 1e3
        row[f"{label}_by_name_ms"] = timed(moved(lambda module=module: by_name(module, lock.state)), device,
                                           repeat) * 1e3
        row[f"{label}_ratio"] = row[f"{label}_by_name_ms"] / row[f"{label}_plan_ms"]
        lock.load(module) if module is not kernel else lock.before_kernel()
        row[f"{label}_equal"] = all(torch.equal(t.double(), lock.state[n].to(t.device).double())
                                    for n, t in module.named_buffers() if n in lock.state)
    return row


def main(argv: list[str] | None = None) -> int:
    args = problems_parser(__doc__, "cpu", 30, "loads").parse_args(argv)
    device = problems_device("lockstep_load.py", args.problems, args.device)
    if device is None:
        return 2
    rows = []
    print("| problem | buffers | before | plan ms | by name ms | by name / plan | state loaded |\n"
          "|---|---:|---|---:|---:|---:|---|")
    for path in args.problems:
        try:
            row = measure(path, device, args.repeat)
        except Exception as exc:  # noqa: BLE001 - a problem that does not build or run here: said, the rest go on
            print(f"| {path.name} | {type(exc).__name__}: {str(exc)[:80]} | | | | | |")
            continue
        rows.append(row)
        if "kernel_plan_ms" not in row:
            print(f"| {row['problem']} | {row['buffers']} | no floating buffers | | | | |")
        for label in ("kernel", "reference", "float64 copy"):
            if f"{label}_plan_ms" in row:
                print(f"| {row['problem']} | {row['buffers']} | {label} | {row[f'{label}_plan_ms']:.3f} | "
                      f"{row[f'{label}_by_name_ms']:.3f} | {row[f'{label}_ratio']:.1f}x | "
                      f"{'yes' if row[f'{label}_equal'] else 'NO'} |")
        if args.json:  # after each problem: a run cut short keeps what it measured
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
