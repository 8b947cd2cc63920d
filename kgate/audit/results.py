"""The audit's results file and how work is split: one JSON line per finished candidate, shards.

A record is appended (and fsynced) only when its candidate is completely judged, under a lock, so
an audit killed at any point leaves whole lines plus at most one torn last line, which reading
ignores. `--resume` skips every candidate with a record; nothing is lost and nothing judged twice.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kgate.errors import UsageError
from kgate.kernelbench import Pair


class ResultsFile:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.moved = 0  # records start() moved to `replaced`
        self.unreadable = 0  # lines the last read() could not parse

    def read(self) -> dict[str, dict[str, Any]]:
        """Complete records by candidate id (the first one wins if a file was concatenated twice)."""
        records: dict[str, dict[str, Any]] = {}
        self.unreadable = 0
        try:
            # bytes that are not UTF-8 (a damaged file) spoil their line only
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return records
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                self.unreadable += bool(line.strip())  # a line torn by a kill mid-write, or damaged
                continue
            if isinstance(record, dict) and record.get("complete") and isinstance(record.get("id"), str):
                records.setdefault(record["id"], record)
        return records

    def start(self, *, resume: bool, drop: Callable[[dict[str, Any]], bool] | None = None
              ) -> dict[str, dict[str, Any]]:
        """Begin an audit: an empty file, or (`resume`) the records already there, minus those `drop`
        selects, which move to `replaced` (appended there first, so a crash between the two steps leaves
        a record in both files, never in neither) to be judged again."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.path.write_text("", encoding="utf-8")
            return {}
        if drop is not None:
            self.moved = self._move_out(drop)
        done = self.read()
        self._repair()
        return done

    @property
    def replaced(self) -> Path:
        return self.path.with_name(self.path.stem + ".replaced.jsonl")

    def _move_out(self, drop: Callable[[dict[str, Any]], bool]) -> int:
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return 0
        keep, out = [], []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn line: dropped as reading would
            (out if isinstance(record, dict) and drop(record) else keep).append(line)
        if not out:
            return 0
        with open(self.replaced, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in out))
            f.flush()
            os.fsync(f.fileno())
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return len(out)

    def _repair(self) -> None:
        """End a torn last line with a newline so the next record starts on its own line."""
        try:
            with open(self.path, "rb+") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() == 0:
                    return
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
        except FileNotFoundError:
            pass

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'I/N' (1 <= I <= N) -> (I, N)."""
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text}: write I/N, e.g. --shard 2/8 (shard 2 of 8)") from None
    if n < 1 or not 1 <= i <= n:
        raise UsageError(f"--shard {text}: need 1 <= I <= N")
    return i, n


def shard(pairs: list[Pair], spec: tuple[int, int] | None) -> list[Pair]:
    """Shard I of N: every N-th candidate in id order, starting at the I-th. Over I = 1..N each
    candidate falls in exactly one shard, and shards differ in size by at most one."""
    if spec is None:
        return pairs
    i, n = spec
    ordered = sorted(pairs, key=lambda p: p.id)
    return [p for k, p in enumerate(ordered) if k % n == i - 1]
