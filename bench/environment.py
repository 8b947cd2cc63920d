"""The machine a GPU benchmark ran on, for its record's environment.txt: the time (UTC), the GPU and driver
(nvidia-smi), the installed version of each named distribution, and the kgate commit.

    python bench/environment.py torch triton fla-core ...
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def describe(distributions: list[str]) -> list[str]:
    lines = [datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")]
    gpu = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) \
        if shutil.which("nvidia-smi") else None
    lines.append(gpu or "no nvidia-smi")
    for name in distributions:
        try:
            lines.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{name} not installed")
    lines.append(f"kgate {_run(['git', 'rev-parse', '--short', 'HEAD']) or '(not a git checkout)'}")
    return lines


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    print("\n".join(describe(sys.argv[1:])))
