"""Workers forked from a template (kgate.forkserver): each guarantee of the sandbox, with a job that tries to
break it and fails, and a job that needs what the guarantee leaves it and gets it. The jobs are the probes of
tests/data/forkserver/fs_probe.py, run through kgate.runner.supervise as kgate runs every worker. The
unsandboxed template is the control that shows each hostile probe can succeed where nothing stops it."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from kgate import forkserver, procmem, runner, sandbox
from tests.conftest import DATA

SECRETS = {"GITHUB_TOKEN": "ghp_kgateForkserverTokenNeverShown", "MY_PROJECT_PASSWORD": "never-shown"}
GIB = 2**30

if not sandbox.choose("auto").active:
    if os.environ.get("CI"):
        raise RuntimeError(f"the sandbox does not work on this CI machine: {sandbox.choose('auto').detail}")
    pytest.skip(f"no sandbox on this machine: {sandbox.choose('auto').detail}", allow_module_level=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The probes' folder: the jobs' working folder and PYTHONPATH (one template serves every job here)."""
    where = tmp_path_factory.mktemp("forkserver")
    for name in ("fs_probe.py",):
        shutil.copy(DATA / "forkserver" / name, where / name)
    return where


@pytest.fixture
def mode():
    """Selects a sandbox mode for the test (`mode(name)`), and restores the one chosen before it. What earlier
    tests in this process left of templates that failed on purpose (a fake torch that cannot be imported) is
    forgotten: the description of how workers start speaks of this test's templates."""
    from kgate import forkserver

    forkserver._failed.clear()
    before = list(sandbox._selected)

    def choose(name: str) -> sandbox.Sandbox:
        return sandbox.select(name)

    yield choose
    sandbox._selected[:] = before


def probe(folder: Path, name: str, *, timeout: float = 60, memory: int = 4 * GIB, env: dict | None = None,
          writable: list[Path] = (), cancel: threading.Event | None = None, **job) -> tuple[runner.WorkerExit, dict]:
    """Run probe `name` as a worker; (how it ended, what it found)."""
    found: dict = {}

    def on_event(event):
        if event.get("event") == "probe":
            found.update(event["result"])
        return "probe" if event.get("event") == "started" else None  # the per-stage clock starts

    base = {**os.environ, **SECRETS, "PYTHONPATH": str(folder), **(env or {})}
    if writable:
        job["writable"] = str(writable[0])
    exit_ = runner.supervise("fs_probe", {"probe": name, **job}, log_path=folder / f"{name}.log", cwd=folder,
                             timeout=timeout, memory=memory, on_event=on_event, env=base, writable=writable,
                             cancel=cancel)
    return exit_, found


def template_processes() -> list[int]:
    """Host pids of every template of this process and everything below them."""
    pids = []
    children = procmem.parents()
    for template in list(forkserver._templates.values()):
        pids += [template.proc.pid, *procmem.descendants(template.proc.pid, children)]
    return pids


def last_used() -> forkserver.Template:
    return max(forkserver._templates.values(), key=lambda t: t.used)


def test_jobs_start_from_the_template_in_well_under_a_second(folder, mode):
    mode("require")
    probe(folder, "child")  # the template starts (imports torch) once
    started = time.perf_counter()
    exit_, found = probe(folder, "environment")
    assert time.perf_counter() - started < 1.0 and exit_.returncode == 0, (exit_, found)
    assert "fs_probe" not in found["cmdline"] and "kgate.forkserver" in found["cmdline"], found  # forked
    assert found["argv"][1].endswith("job.json")  # as `python -m fs_probe JOB.json` has it
    assert "workers forked from a sandboxed template" in sandbox.choose().describe()


def test_jobs_in_other_folders_of_one_view_share_a_template_each_in_its_own_folder(folder, mode):
    """An audit's candidates lie in their runs' folders under one corpus: one template serves them all, and
    each job works in its own folder, which is not on its sys.path (nor the template's)."""
    mode("require")
    found = {}
    for name in ("run_a", "run_b"):
        (folder / name).mkdir(exist_ok=True)

        def on_event(event, name=name):
            if event.get("event") == "probe":
                found[name] = event["result"]
            return "probe" if event.get("event") == "started" else None

        exit_ = runner.supervise("fs_probe", {"probe": "environment"}, log_path=folder / f"{name}.log",
                                 cwd=folder / name, timeout=60, memory=4 * GIB, on_event=on_event,
                                 env={**os.environ, "PYTHONPATH": str(folder)}, readable=[folder])
        assert exit_.returncode == 0, exit_
    a, b = found["run_a"], found["run_b"]
    assert a["cwd"] == str(folder / "run_a") and b["cwd"] == str(folder / "run_b")
    assert not any(p in (a["cwd"], b["cwd"], "") for p in a["sys_path"] + b["sys_path"])
    key = forkserver._key(sandbox.choose(), "fs_probe", folder / "run_a", {**os.environ, "PYTHONPATH": str(folder)},
                          [folder], [])
    assert key == forkserver._key(sandbox.choose(), "fs_probe", folder / "run_b",
                                  {**os.environ, "PYTHONPATH": str(folder)}, [folder], [])
    assert key != forkserver._key(sandbox.choose(), "fs_probe", folder.parent, {**os.environ,
                                  "PYTHONPATH": str(folder)}, [folder], [])  # a wider view: another template
    assert a["cmdline"] == b["cmdline"] and "kgate.forkserver" in a["cmdline"]
    assert sum(1 for t in forkserver._templates.values() if t.key[2] == "fs_probe" and t.key[3] ==
               key[3]) == 1


def test_a_job_sees_and_signals_no_process_but_its_own(folder, mode):
    """A job holds a worker open while another looks for it, for the template, for kgate; the control: the same
    with an unsandboxed template, where it sees them."""
    for name, sandboxed in (("require", True), ("none", False)):
        mode(name)
        cancel = threading.Event()
        holder = threading.Thread(target=probe, args=(folder, "hang"), kwargs={"cancel": cancel})
        holder.start()
        try:
            deadline = time.monotonic() + 60
            while len(template_processes()) < (6 if sandboxed else 4) and time.monotonic() < deadline:
                time.sleep(0.05)
            others = [os.getpid(), *template_processes()]
            exit_, found = probe(folder, "see", targets=others)
        finally:
            cancel.set()
            holder.join()
        assert exit_.returncode == 0 and found["own_child_signal"] is None, (exit_, found)
        refused = {pid: err for pid, err in found["signals"].items() if err}
        if sandboxed:
            assert found["visible"][:2] == [1, 2] and len(found["visible"]) <= 3, found["visible"]
            assert set(refused) == {str(p) for p in others}, found["signals"]  # none of them exists for it
            init = found["init"]  # its init can be neither traced nor read
            assert init["fd"] == "PermissionError" and init["environ"] == "PermissionError" and init["ptrace"] != 0, init
        else:
            assert len(refused) < len(others) and len(found["visible"]) > 3, found  # it can, unconfined


def test_a_daemon_dies_with_its_job_and_is_reported(folder, mode):
    mode("require")
    marker = str(800000 + os.getpid() % 90000)
    exit_, found = probe(folder, "daemon", marker=marker, linger=1.0)
    assert exit_.returncode == 0 and exit_.detached, exit_  # seen from outside: an isolation fail in kgate
    assert not sleepers(marker), "a job's daemon outlived it"
    exit_, found = probe(folder, "child")  # control: a child waited for is nothing detached
    assert exit_.returncode == 0 and exit_.detached == [] and found == {"waited": True}, (exit_, found)


def sleepers(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", marker.encode()]:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_jobs_files_are_invisible_to_the_next_job(folder, mode, tmp_path):
    """Each job writes a marker in /tmp, /var/tmp, /dev/shm, its scratch folder (HOME, TMPDIR) and its own writable
    folder; the next job, with a writable folder beside the first one's, finds none of them. The control: with
    an unsandboxed template the next job finds the first one's /tmp marker."""
    caches = tmp_path / "caches"
    for name, sandboxed in (("require", True), ("none", False)):
        mode(name)
        exit_, first = probe(folder, "files", write=f"first-{name}", writable=[caches / f"a-{name}"])
        assert exit_.returncode == 0 and "marker-first-" + name in first["WRITABLE"], (exit_, first)
        exit_, second = probe(folder, "files", writable=[caches / f"b-{name}"])
        assert exit_.returncode == 0, exit_
        seen = {place: names for place, names in second.items() if isinstance(names, list)
                and any(n.startswith(f"marker-first-{name}") or n == f"a-{name}" for n in names)}
        if sandboxed:
            assert seen == {}, seen
            assert second["cwd_write"] == "OSError" and second["dev_write"] == "OSError", second
            assert second["WRITABLE_PARENT"] == [f"b-{name}"], second
            assert (caches / f"a-{name}" / f"marker-first-{name}").exists()  # what it wrote is kept for kgate
        else:
            assert "/tmp" in seen, second
            for place in ("/tmp", "/var/tmp", "/dev/shm"):
                (Path(place) / f"marker-first-{name}").unlink(missing_ok=True)
            (folder / "written-by-a-job").unlink(missing_ok=True)


def test_the_worker_holds_no_capability_and_no_new_privileges(folder, mode):
    mode("require")
    exit_, found = probe(folder, "privileges")
    assert exit_.returncode == 0, exit_
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(found[name], 16) == 0, (name, found)
    assert found["NoNewPrivs"] == "1"
    assert found["unshare"] != 0 and found["mount"] != 0, found  # no namespace, no mount of its own
    assert found["sysctl_write"] is not None, found  # /proc/sys read-only


def test_the_worker_gets_the_environment_allow_list(folder, mode):
    mode("require")
    exit_, found = probe(folder, "environment", env={"TRITON_CACHE_DIR": str(folder / "triton"), "LC_ALL": "C"})
    env = found["env"]
    assert exit_.returncode == 0 and not set(SECRETS) & set(env), sorted(env)
    assert env["TRITON_CACHE_DIR"] == str(folder / "triton") and env["LC_ALL"] == "C"
    assert env["HOME"].startswith(str(sandbox.run_root())) and env["TMPDIR"].startswith(str(sandbox.run_root()))
    assert env["HOME"] != probe(folder, "environment")[1]["env"]["HOME"]  # a scratch folder each


def test_crashing_hanging_and_hogging_jobs_leave_the_template_serving(folder, mode):
    mode("require")
    probe(folder, "child")
    template = last_used()
    exit_, _ = probe(folder, "crash")
    assert exit_.returncode == -signal.SIGSEGV, exit_
    exit_, _ = probe(folder, "hang", timeout=1)
    assert exit_.error and "timed out" in exit_.error, exit_
    exit_, _ = probe(folder, "hog", memory=GIB // 2)
    assert exit_.error and runner.MEMORY_LIMIT in exit_.error, exit_
    exit_, found = probe(folder, "child")
    assert exit_.returncode == 0 and found == {"waited": True}
    assert forkserver._templates[template.key] is template and template.alive()


@pytest.mark.parametrize("choice", ["require", "none"])
def test_a_template_outlives_the_thread_that_started_it(folder, mode, choice):
    """A template dies with kgate, not with the thread whose job started it: a judge's thread, or a pool's
    that ends with a kernel's gates. The parent-death signal is the creating thread's; a template started
    from a short-lived thread was killed as that thread ended, and every later job paid for a new one."""
    mode(choice)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(first=probe(folder, "child")))
    thread.start()
    thread.join()
    assert outcome["first"][0].returncode == 0, outcome
    template = last_used()
    time.sleep(0.5)  # the parent-death signal comes as the thread ends
    assert template.alive(), f"the template ended with the thread that started it ({template.proc.returncode})"
    exit_, found = probe(folder, "child")
    assert exit_.returncode == 0 and found == {"waited": True}, exit_
    assert last_used() is template  # the same template served the next job


def test_a_dead_template_is_started_again(folder, mode):
    mode("require")
    probe(folder, "child")
    template = last_used()
    os.killpg(template.proc.pid, signal.SIGKILL)
    template.proc.wait()
    exit_, found = probe(folder, "child")
    assert exit_.returncode == 0 and found == {"waited": True}, exit_
    assert forkserver._templates[template.key] is not template


def test_without_a_template_the_job_starts_on_its_own_and_the_run_says_why(folder, mode, monkeypatch):
    """A module the template cannot serve (no run_job) falls back to `python -m MODULE JOB.json`, said in the
    sandbox's description; KGATE_FORKSERVER=0 starts every worker so."""
    mode("require")
    (folder / "fs_plain.py").write_text((folder / "fs_probe.py").read_text().replace("def run_job(", "def _run_job(")
                                        .replace("sys.exit(run_job(", "sys.exit(_run_job("))
    failed = list(forkserver._failed)
    try:
        found: dict = {}
        exit_ = runner.supervise("fs_plain", {"probe": "environment"}, log_path=folder / "plain.log", cwd=folder,
                                 timeout=60, memory=4 * GIB, env={**os.environ, "PYTHONPATH": str(folder)},
                                 on_event=lambda e: found.update(e.get("result") or {}))
        assert exit_.returncode == 0 and "fs_plain" in found["cmdline"], (exit_, found)  # python -m fs_plain
        assert "fs_plain has no run_job" in sandbox.choose().describe(), sandbox.choose().describe()
    finally:
        forkserver._failed[:] = failed
    monkeypatch.setenv(forkserver.SWITCH_ENV, "0")
    exit_, found = probe(folder, "environment")
    assert exit_.returncode == 0 and "fs_probe" in found["cmdline"], found
    assert f"{forkserver.SWITCH_ENV}=0" in sandbox.choose().describe()
