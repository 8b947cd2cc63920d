"""The machine a GPU benchmark ran on, for its record's environment.txt: the time (UTC), the GPU and driver
(nvidia-smi), the installed version of each named distribution, and which kgate: the checkout's commit (and
whether its kgate/ differs from that commit: a copied working tree may carry older git metadata) and the
digest of the source of the kgate Python imports (the `kgate.source` of an audit's records), which tells
the code that ran whatever the git metadata says.

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
    commit = _run(["git", "rev-parse", "--short", "HEAD"])
    changed = _run(["git", "status", "--porcelain", "--", "kgate"]) if commit else None
    try:
        from kgate.audit.evaluate import kgate_stamp

        stamp = kgate_stamp()
        source = f"; imported kgate {stamp['version']}, source digest {stamp['source']}"
    except Exception as exc:  # noqa: BLE001 - the description goes on without it
        source = f"; kgate not importable ({type(exc).__name__})"
    lines.append(f"kgate {commit or '(not a git checkout)'}"
                 + (" (the checkout's kgate/ differs from that commit)" if changed else "") + source)
    return lines


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    print("\n".join(describe(sys.argv[1:])))
