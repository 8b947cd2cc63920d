"""Errors that end a kgate command with exit code 2 (usage, manifest or infrastructure)."""

from __future__ import annotations

from dataclasses import dataclass


class KgateError(Exception):
    """An error the user must fix before anything can run; the CLI prints it and exits 2."""

    exit_code = 2


@dataclass
class Problem:
    """One problem in an input file, located like a compiler diagnostic."""

    file: str
    line: int | None
    column: int | None
    key: str | None
    message: str
    hint: str | None = None

    def format(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        key = f" [{self.key}]" if self.key else ""
        text = f"{where}: error{key}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ManifestError(KgateError):
    """The manifest cannot be used; carries every problem found, each with file, line and key."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(p.format() for p in problems))

    def first(self, limit: int = 50) -> str:
        """The first `limit` problems, then how many more there are (a generated manifest can have thousands)."""
        text = "\n".join(p.format() for p in self.problems[:limit])
        more = len(self.problems) - limit
        return text + (f"\n... and {more} more problem(s); fix these and run again to see the rest" if more > 0 else "")


class UsageError(KgateError):
    """Bad command-line usage."""


class InfrastructureError(KgateError):
    """kgate itself could not do its work (no GPU runtime, no Docker daemon, unwritable output...)."""
