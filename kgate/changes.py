"""Which kernels of a manifest a set of changed files touches: the pre-commit hook (`kgate hook`), `kgate run
--changed` and the Action's changed-only runs use the same mapping.

A kernel uses its kernel's, reference's and input factory's files (as the worker imports them) and whatever
its `files:` globs match; a changed manifest touches every kernel.
"""

from __future__ import annotations

import fnmatch
import glob
import posixpath
import subprocess
import sys
from pathlib import Path

from kgate.errors import UsageError
from kgate.manifest import LoadedManifest, ResolvedKernel

_WILDCARDS = frozenset("*?[")


def glob_patterns(pattern: str, base: Path) -> list[str]:
    """A `files:` glob as absolute `fnmatch` patterns: relative to the manifest's folder `base` (`..` and
    paths outside that folder allowed; an absolute glob stays as it is), its leading folders without
    wildcards resolved the way the changed files are (`..`, symlinks). `**/` also matches no folder at all
    (`src/**/*.cu` takes `src/a.cu`), and a folder named without wildcards takes every file under it."""
    parts = Path(pattern).parts
    literal = next((i for i, part in enumerate(parts) if _WILDCARDS & set(part)), len(parts))
    folder = (base / Path(*parts[:literal])).resolve()
    head = glob.escape(folder.as_posix())
    if literal == len(parts):
        return [head, posixpath.join(head, "*")] if folder.is_dir() else [head]
    rest = posixpath.normpath("/".join(parts[literal:])).split("/")
    stars = [i for i, part in enumerate(rest) if part == "**"]
    variants = []
    for mask in range(2 ** len(stars)):  # each `**` either present or dropped
        dropped = {stars[j] for j in range(len(stars)) if mask >> j & 1}
        variants.append(posixpath.join(head, *[part for i, part in enumerate(rest) if i not in dropped]))
    return list(dict.fromkeys(variants))


def kernels_for_files(manifest: LoadedManifest, files: list[str], cwd: Path | None = None) -> list[ResolvedKernel]:
    """The kernels that use one of `files` (paths relative to `cwd`); all of them if the manifest changed.
    A kernel uses its kernel's, reference's and inputs' files and whatever its `files:` globs match,
    relative to the manifest's folder."""
    cwd = cwd or Path.cwd()
    changed = {(cwd / f).resolve() for f in files}
    if manifest.path.resolve() in changed or (cwd / manifest.path).resolve() in changed:
        return list(manifest.kernels)
    base = manifest.base.resolve()
    changed_posix = [c.as_posix() for c in changed]
    selected = []
    for kernel in manifest.kernels:
        patterns = [p for g in kernel.entry.files for p in glob_patterns(g, base)]
        if kernel.source_files() & changed or any(fnmatch.fnmatch(c, p) for c in changed_posix for p in patterns):
            selected.append(kernel)
    return selected


def git_toplevel(cwd: Path) -> Path | None:
    """The top folder of the git work tree `cwd` is in (None: not in one, or no git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None


def changed_kernels(manifest: LoadedManifest, files: list[str], cwd: Path | None = None) -> list[ResolvedKernel]:
    """`kgate run --changed`: the kernels that use one of `files`, each path taken relative to `cwd` and,
    inside a git work tree, also relative to its top folder, as `git diff --name-only` prints them (run
    from a subfolder, those would otherwise match nothing). A path read both ways can only select more."""
    cwd = (cwd or Path.cwd()).resolve()
    kernels = kernels_for_files(manifest, files, cwd)
    top = git_toplevel(cwd)
    if top is not None and top != cwd:
        kernels += [k for k in kernels_for_files(manifest, files, top) if k not in kernels]
    return [k for k in manifest.kernels if k in kernels]


def read_list(path: str) -> list[str]:
    """Paths one a line from a file, or from stdin for '-'; blank lines ignored."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--changed {path}: cannot read the list of changed files: {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]
