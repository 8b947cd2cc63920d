"""Replay a measured audit pass's schedule under other orders and retry policies (a replay, not a
measurement): each candidate keeps its measured duration, the judges take them greedily in the order
given, and a candidate that outgrew its share (`retried_alone` or `retried_wider` in its record) first
loses `--lost` seconds of one judge (its try in the share, whose record is not kept), then is judged
again:

- `alone-at-end`: with the whole device once every shared candidate is done (what kgate did until commit
  80aef69);
- `wider`: at once in half the judges' slots, as soon as they free up, the others going on beside it;
- `wider+kept`: the same, the try keeping the standard test of the try before (kgate.audit.evaluate's
  kept_standard), so it lasts its duration less its standard test (the record's timeline).

Orders: `given` (id order), `longest` (kgate audit's default with gates: kgate.audit.evaluate.ProblemSize,
counted from the problem files the records name, which must be readable from here) and `best` (each
candidate's own measured duration, longest first: the best a size estimate could do).

    R=docs/records/2026-12-04-h200-7eb28d4/audit-throughput
    python bench/audit_replay.py $R.records.jsonl --where call=2 --as-run $R.json --run 0 --lost 90

`--as-run` adds the order the pass was judged in (a benchmark JSON's `ids`, or with --run N those of its
N-th entry of `runs`). On that record (H200, 4 judges) the id-order pass (`call=3`) replays to its measured
332.05 s with any --lost (its candidate that outgrew its share went last); the other (`call=2`), as run, to
its 328.69 s with --lost 90.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

POLICIES = ("alone-at-end", "wider", "wider+kept")


def outgrew(record: dict[str, Any]) -> bool:
    return bool(record.get("retried_alone") or record.get("retried_wider"))


def kept_duration(record: dict[str, Any]) -> float:
    """A try that keeps the standard test: the duration less the standard test's span in the timeline."""
    timeline = record.get("timeline") or {}
    standard = float(timeline.get("standard", 0.0)) - float(timeline.get("loaded", timeline.get("standard", 0.0)))
    return max(0.0, float(record["duration_s"]) - standard)


def replay(records: list[dict[str, Any]], slots: int, policy: str, lost: float) -> float:
    """The wall seconds of judging `records`, in their order, on `slots` judges under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy}: one of {', '.join(POLICIES)}")
    width = max(1, slots // 2) if policy != "alone-at-end" else slots
    queue = list(records)
    running: list[tuple[float, int, int, str, dict[str, Any]]] = []  # (end, order, slots held, kind, record)
    waiting: list[dict[str, Any]] = []  # outgrew their share: the second try, wider or alone
    alone: list[dict[str, Any]] = []
    now, count = 0.0, 0

    def used() -> int:
        return sum(r[2] for r in running)

    while queue or running or waiting:
        if policy != "alone-at-end" and waiting and used() + width <= slots:
            record = waiting.pop(0)
            seconds = kept_duration(record) if policy == "wider+kept" else float(record["duration_s"])
            heapq.heappush(running, (now + seconds, count, width, "second", record))
        elif not waiting and queue and used() < slots:
            record = queue.pop(0)
            kind, seconds = ("first", lost) if outgrew(record) else ("done", float(record["duration_s"]))
            heapq.heappush(running, (now + seconds, count, 1, kind, record))
        else:
            if not running:  # nothing runs and nothing can start: only alone-at-end's waiting ones remain
                alone.extend(waiting)
                waiting.clear()
                continue
            now, _, _, kind, record = heapq.heappop(running)
            if kind == "first":
                (alone if policy == "alone-at-end" else waiting).append(record)
        count += 1
    for record in alone:
        now += float(record["duration_s"])
    return round(now, 1)


def orders(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    from kgate.audit.evaluate import ProblemSize
    from kgate.kernelbench import problem_size

    def cost(problem: str) -> float | None:
        path = Path(problem)
        try:
            return ProblemSize(*problem_size(path)).seconds(True) if path.is_file() else None
        except Exception:  # noqa: BLE001 - a problem that cannot be counted: last, as in kgate audit
            return None

    given = sorted(records, key=lambda r: r["id"])
    out = {"given": given, "best": sorted(given, key=lambda r: -float(r["duration_s"]))}
    costs = {problem: cost(problem) for problem in dict.fromkeys(r.get("problem") or "" for r in given)}
    if any(c is not None for c in costs.values()):
        out["longest"] = sorted(given, key=lambda r: (costs[r.get("problem") or ""] is None,
                                                      -(costs[r.get("problem") or ""] or 0.0)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, help="a JSONL of audit records (a benchmark's .records.jsonl)")
    parser.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                        help="only the records whose KEY equals VALUE (e.g. call=3, or pass=...); repeatable")
    parser.add_argument("--slots", type=int, default=4, help="judges at once (default 4)")
    parser.add_argument("--lost", type=float, default=90.0,
                        help="seconds a candidate that outgrew its share ran in it before it failed (default 90)")
    parser.add_argument("--as-run", type=Path, metavar="JSON", help="a benchmark JSON: its `ids` are one more order")
    parser.add_argument("--run", type=int, help="with --as-run: the ids of its `runs` entry N (the record above)")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    for cond in args.where:
        key, _, value = cond.partition("=")
        records = [r for r in records if str(r.get(key)) == value]
    if not records:
        parser.error("no record matches")
    print(f"{len(records)} record(s), {args.slots} judges, {sum(outgrew(r) for r in records)} outgrew a share "
          f"(--lost {args.lost:g} s); lower bound (the durations shared out): "
          f"{round(sum(float(r['duration_s']) for r in records) / args.slots, 1)} s")
    print("| order | " + " | ".join(POLICIES) + " |\n|---|" + "---:|" * len(POLICIES))
    known = orders(records)
    if args.as_run:
        data = json.loads(args.as_run.read_text())
        ids = data["runs"][args.run]["ids"] if args.run is not None else data["ids"]
        by_id = {r["id"]: r for r in records}
        known["as run"] = [by_id[i] for i in ids if i in by_id]
    for name, ordered in known.items():
        print(f"| {name} | " + " | ".join(str(replay(ordered, args.slots, p, args.lost)) for p in POLICIES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
