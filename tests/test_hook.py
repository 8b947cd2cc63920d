"""The pre-commit hook: mapping changed files to manifest entries, `kgate hook`'s quick profile, the
hooks manifest, and `pre-commit run` with a committed snapshot of this tree as the hook repository, in a temporary
kernel repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kgate.changes import kernels_for_files
from kgate.cli import main as kgate_main
from kgate.commands.hook import quick_options
from kgate.manifest import load
from kgate.runner import RunOptions
from tests.conftest import ROOT

PRE_COMMIT = str(Path(sys.executable).parent / "pre-commit")

MANIFEST = """\
version: 1
defaults:
  device: cpu
  seeds: [0, 1, 2]
kernels:
  - name: softmax
    kernel: kernels/softmax.py:softmax
    reference: reference.py:softmax_ref
    inputs: reference.py:make_inputs
    shapes: [[64, 257], [1, 128], [7, 100]]
    dtypes: [float32, float64]
    files: [kernels/*.cu]
  - name: scale
    kernel: kernels/scale.py:scale
    reference: kernels/scale.py:scale_ref
    inputs: [{shape: [3, 5]}]
"""
REFERENCE = """\
import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype=dtype, device=device),)


def softmax_ref(x):
    return torch.softmax(x, dim=-1)
"""
BROKEN = """\
import torch


def softmax(x):
    z = torch.exp(x)  # no max subtraction: overflows to inf/inf = NaN
    return z / z.sum(dim=-1, keepdim=True)
"""
FIXED = """\
import torch


def softmax(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)
"""
SCALE = """\
def scale(x):
    return x * 2


def scale_ref(x):
    return x * 2
"""


def _kernel_repo(path: Path, kernel: str = BROKEN) -> Path:
    for rel, text in {"kgate.yaml": MANIFEST, "reference.py": REFERENCE, "kernels/softmax.py": kernel,
                      "kernels/scale.py": SCALE, "kernels/softmax.cu": "// CUDA source\n",
                      "README.md": "kernels\n"}.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def _names(manifest, files, cwd):
    return [k.name for k in kernels_for_files(manifest, files, cwd)]


def test_changed_files_map_to_the_entries_that_use_them(tmp_path):
    _kernel_repo(tmp_path)
    manifest = load(tmp_path / "kgate.yaml")
    assert _names(manifest, ["kernels/softmax.py"], tmp_path) == ["softmax"]  # kernel
    assert _names(manifest, ["reference.py"], tmp_path) == ["softmax"]  # reference and inputs
    assert _names(manifest, ["kernels/softmax.cu"], tmp_path) == ["softmax"]  # files: glob
    assert _names(manifest, ["kernels/scale.py"], tmp_path) == ["scale"]
    assert _names(manifest, ["README.md", "kernels/other.py"], tmp_path) == []
    assert _names(manifest, ["kgate.yaml"], tmp_path) == ["softmax", "scale"]  # the manifest itself
    # paths are taken relative to where the hook runs
    assert _names(manifest, ["softmax.py"], tmp_path / "kernels") == ["softmax"]


def _globs_repo(root: Path, files: list[str], manifest_folder: str, globs: dict[str, str]) -> Path:
    """Empty `files` (the kernel module kernels/scale.py holds SCALE) and a manifest in `manifest_folder`
    with one kernel per entry of `globs` (name -> its `files:` list, as YAML); returns the manifest's path."""
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(SCALE if rel.endswith("scale.py") else "")
    entries = "".join(f"""\
  - name: {name}
    kernel: kernels/scale.py:{'scale' if i == 0 else 'scale_ref'}
    reference: kernels/scale.py:scale_ref
    inputs: [{{shape: [3]}}]
    files: {globs_text}
""" for i, (name, globs_text) in enumerate(globs.items()))
    path = root / manifest_folder / "kgate.yaml"
    path.write_text("version: 1\nkernels:\n" + entries)
    return path


def test_files_globs_are_relative_to_the_manifests_folder_inside_and_outside_it(tmp_path):
    # The manifest in a subfolder of the repository; its `files:` reach the sources beside it with `..`.
    repo = tmp_path / "repo"
    ci = repo / "ci"
    _globs_repo(repo, ["ci/kernels/scale.py", "ci/kernels/local.cuh", "src/kernels/scale.cu",
                       "src/kernels/deep/tile.cuh", "src/other/scale.cu", "include/common.h", "ci/src/kernels/decoy.cu"],
                "ci", {"scale": "[../src/kernels/*.cu, ../src/kernels/**/*.cuh, ../include/common.h, kernels/*.cuh]",
                       "other": "[./../src/other/*.cu]"})
    manifest = load(ci / "kgate.yaml")
    # from the repository's root, as pre-commit and the Action run it
    assert _names(manifest, ["src/kernels/scale.cu"], repo) == ["scale"]
    assert _names(manifest, ["src/kernels/deep/tile.cuh"], repo) == ["scale"]
    assert _names(manifest, ["include/common.h"], repo) == ["scale"]
    assert _names(manifest, ["src/other/scale.cu"], repo) == ["other"]
    assert _names(manifest, ["ci/kernels/local.cuh"], repo) == ["scale"]  # inside the manifest's folder
    assert _names(manifest, ["ci/src/kernels/decoy.cu", "include/other.h", "src/kernels/scale.h"], repo) == []
    # from elsewhere, with `..` and absolute paths in the list
    assert _names(manifest, ["../src/kernels/scale.cu"], ci) == ["scale"]
    assert _names(manifest, ["../../../repo/src/other/scale.cu"], ci / "kernels") == ["other"]
    assert _names(manifest, [str(repo / "include" / "common.h")], tmp_path) == ["scale"]
    # the kernel's own source module and the manifest still select what they did
    assert _names(manifest, ["ci/kernels/scale.py"], repo) == ["scale", "other"]
    assert _names(manifest, ["ci/kgate.yaml"], repo) == ["scale", "other"]
    # the manifest reached through a symlinked folder: the globs resolve as the changed files do
    (tmp_path / "link").symlink_to(repo)
    linked = load(tmp_path / "link" / "ci" / "kgate.yaml")
    assert _names(linked, ["src/kernels/scale.cu"], repo) == ["scale"]
    assert _names(linked, ["link/src/other/scale.cu"], tmp_path) == ["other"]


def test_quick_profile_is_one_small_case_of_the_cheap_gates(tmp_path):
    _kernel_repo(tmp_path)
    softmax = load(tmp_path / "kgate.yaml").by_name("softmax")
    options = quick_options(softmax, RunOptions(), None, full=False)
    assert options.shapes == [(1, 128)] and options.seeds == [0] and options.dtypes == ["float32"]
    assert set(options.gates) <= {"contract", "oracle", "special_values", "input_integrity", "determinism"}
    assert "special_values" in options.gates
    assert quick_options(softmax, RunOptions(), None, full=True).gates is None


@pytest.fixture
def hook(monkeypatch, capsys):
    """`kgate hook ARGS` run in the folder `cwd`, in this process (the console script's process is tested
    through pre-commit below): its exit code and what it printed, as a finished process gives them."""

    def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        with monkeypatch.context() as patch:
            patch.chdir(cwd)
            code = kgate_main(["hook", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["kgate", "hook", *args], code, out, err)

    return run


def test_kgate_hook_fails_naming_kernel_gate_and_finding_then_passes_when_fixed(tmp_path, hook):
    _kernel_repo(tmp_path)
    started = time.monotonic()
    proc = hook(tmp_path, "kernels/softmax.py")
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL softmax / special_values: " in proc.stdout
    assert "kernel: kernels/softmax.py:4" in proc.stdout
    assert "reproduce: kgate run kgate.yaml -k softmax --gate special_values" in proc.stdout
    assert "scale" not in proc.stdout  # not touched by the change
    print(f"kgate hook on one changed kernel (CPU): {elapsed:.1f}s wall")
    (tmp_path / "kernels" / "softmax.py").write_text(FIXED)
    proc = hook(tmp_path, "kernels/softmax.py")
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 0 with violations" in proc.stdout
    proc = hook(tmp_path, "README.md")
    assert proc.returncode == 0 and "nothing to gate" in proc.stdout


def test_kgate_hook_reports_a_bad_manifest_with_exit_2(tmp_path, hook):
    (tmp_path / "kgate.yaml").write_text("version: 1\nkernels: []\n")
    proc = hook(tmp_path, "a.py")
    assert proc.returncode == 2 and "kgate.yaml" in proc.stderr


def test_hooks_manifest_is_valid():
    proc = subprocess.run([PRE_COMMIT, "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------------
# pre-commit, for real: the hook installed from a repository and run on a commit.


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                           *args], cwd=cwd, check=True, capture_output=True, text=True)


def _snapshot_of_this_tree(dest: Path) -> Path:
    """This working tree as pre-commit would clone it, committed in a repository of its own: the real
    repository's HEAD and index are not touched."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if not src.is_file() or rel.startswith(("tests/", "fixtures/")):
            continue  # pre-commit installs the package; the test suite and fixtures are not needed
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-qm", "snapshot")
    return dest


def _pip_env(tmp: Path) -> dict[str, str]:
    """Pin the hook environment's torch to the one installed here, so pip takes the local CPU wheel
    (find-links) rather than a multi-gigabyte CUDA build; and skip pip's one-file-at-a-time byte
    compilation of torch (30 s), as `make venv` does: the hook compiles what it imports. (pip reads
    PIP_NO_COMPILE as the value of its `compile` setting: "0" is --no-compile, "1" compiles.)"""
    import torch

    constraints = tmp / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")
    return {"PIP_CONSTRAINT": str(constraints), "PIP_NO_COMPILE": "0"}


@pytest.fixture(scope="module")
def pre_commit(tmp_path_factory):
    """Runs `pre-commit ARGS` in a kernel repository whose .pre-commit-config.yaml names a committed snapshot
    of this tree, as a user's config names kgate's repository. Every case shares one store, so the hook's
    environment (kgate and torch) is installed once, by the first case, as pre-commit does for a user."""
    base = tmp_path_factory.mktemp("pre-commit")
    snapshot = _snapshot_of_this_tree(base / "kgate-snapshot")
    rev = _git(snapshot, "rev-parse", "HEAD").stdout.strip()
    env = {**os.environ, "PRE_COMMIT_HOME": str(base / "home"), **_pip_env(base)}
    env.pop("PRE_COMMIT", None)

    def run(repo: Path, *args: str) -> subprocess.CompletedProcess:
        (repo / ".pre-commit-config.yaml").write_text(textwrap.dedent(f"""\
            repos:
              - repo: {snapshot}
                rev: {rev}
                hooks:
                  - id: kgate
            """))
        return subprocess.run([PRE_COMMIT, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=900)

    return run


@pytest.mark.slow
def test_pre_commit_fails_on_a_broken_kernel_naming_the_gate(pre_commit, tmp_path):
    repo = _kernel_repo(tmp_path / "kernels-repo")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    proc = pre_commit(repo, "run", "kgate", "--verbose")  # on the staged files
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "kgate (quick gates on the changed kernels)" in out and "Failed" in out
    assert "FAIL softmax / special_values: " in out
    assert "reproduce: kgate run kgate.yaml -k softmax --gate special_values" in out


@pytest.mark.slow
def test_pre_commit_passes_the_fixed_kernel_and_skips_a_commit_without_kernels(pre_commit, tmp_path):
    repo = _kernel_repo(tmp_path / "kernels-repo", kernel=FIXED)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    proc = pre_commit(repo, "run", "kgate", "--verbose")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Passed" in proc.stdout and "2 passed, 0 with violations" in proc.stdout  # a new manifest: all

    _git(repo, "commit", "-qm", "kernels")
    (repo / "README.md").write_text("kernels, documented\n")
    _git(repo, "add", "README.md")
    proc = pre_commit(repo, "run", "kgate")  # a commit that touches no kernel
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(no files to check)Skipped" in proc.stdout


def test_the_plain_git_hook_fails_a_commit_that_deletes_a_kernels_file(tmp_path):
    """hooks/pre-commit listed only added, copied, modified and renamed files: a commit deleting a file a
    kernel is made of passed unseen."""
    repo = _kernel_repo(tmp_path / "kernels-repo", kernel=FIXED)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "kernels")
    _git(repo, "rm", "-q", "kernels/scale.py")
    bin_dir = Path(sys.executable).parent  # kgate's console script beside this interpreter
    proc = subprocess.run(["bash", str(ROOT / "hooks" / "pre-commit")], cwd=repo, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the manifest names a file that is gone
    assert "scale.py" in proc.stdout + proc.stderr


def test_run_changed_takes_paths_as_git_diff_prints_them_from_a_subfolder(tmp_path):
    """`git diff --name-only` prints paths from the work tree's top folder; `kgate run --changed` run in
    the manifest's subfolder read them from there and matched nothing."""
    from kgate.changes import changed_kernels

    repo = tmp_path / "repo"
    _kernel_repo(repo / "ci")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    manifest = load(repo / "ci" / "kgate.yaml")
    names = [k.name for k in changed_kernels(manifest, ["ci/kernels/scale.py"], repo / "ci")]
    assert names == ["scale"]
    # relative to the current folder still works, and both readings only add
    assert [k.name for k in changed_kernels(manifest, ["kernels/softmax.py"], repo / "ci")] == ["softmax"]
    assert [k.name for k in changed_kernels(manifest, ["ci/README.md"], repo / "ci")] == []
    # outside a git work tree: relative to the current folder only
    plain = tmp_path / "plain"
    _kernel_repo(plain)
    assert [k.name for k in changed_kernels(load(plain / "kgate.yaml"), ["plain/kernels/scale.py"], plain)] == []


def test_double_star_matches_no_folder_too_and_a_folder_takes_its_files(tmp_path):
    """`src/**/*.cu` left a change to src/a.cu ungated; `files: [src/sub]` matched no file inside it."""
    _globs_repo(tmp_path, ["kernels/scale.py", "src/a.cu", "src/sub/b.cu", "src/sub/deep/c.cuh", "other/d.cu"], ".",
                {"deep": "[src/**/*.cu]", "folder": "[src/sub]"})
    manifest = load(tmp_path / "kgate.yaml")
    assert _names(manifest, ["src/a.cu"], tmp_path) == ["deep"]
    assert _names(manifest, ["src/sub/b.cu"], tmp_path) == ["deep", "folder"]
    assert _names(manifest, ["src/sub/deep/c.cuh"], tmp_path) == ["folder"]
    assert _names(manifest, ["other/d.cu", "src/a.cuh"], tmp_path) == []


def test_a_module_reference_watches_the_file_the_worker_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "ops.py").write_text(SCALE)
    (tmp_path / "kgate.yaml").write_text(textwrap.dedent("""\
        version: 1
        kernels:
          - name: scale
            kernel: pkg.ops:scale
            reference: pkg.ops:scale_ref
            inputs: [{shape: [3]}]
        """))
    manifest = load(tmp_path / "kgate.yaml")
    assert _names(manifest, ["pkg/ops.py"], tmp_path) == ["scale"]
    assert _names(manifest, ["pkg/__init__.py"], tmp_path) == []
