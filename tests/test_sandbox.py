"""The sandbox (kgate.sandbox): kernels that attack kgate itself reach nothing but their own result.

Each attack of tests/data/sandbox/attacks.py is run as a user would run kgate (a separate process, CPU): a
daemon that forges the next workers' results, a kernel that rewrites another kernel's file, results.jsonl and
the reports after kgate exits, one that looks for secrets and the network, one that floods its log, one whose
children hold memory past the limit, one left running when kgate is killed with SIGKILL. With the sandbox the
other kernels' verdicts and the reports are those of a run without them; without it (`--sandbox none`) the
forgery succeeds, which is what makes these tests able to fail."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kgate import sandbox
from tests.conftest import DATA, ROOT

SECRETS = {"GITHUB_TOKEN": "ghp_kgateTestTokenNeverShown0123456789",
           "AWS_SECRET_ACCESS_KEY": "kgate-test-aws-secret-never-shown",
           "MY_PROJECT_PASSWORD": "kgate-test-password-never-shown"}
LOG_CAP_BYTES = 16 * 2**20 + 64 * 2**10 + 4096  # runner.LOG_CAP, its kept tail and the line between

if not sandbox.choose("auto").active:
    if os.environ.get("CI"):  # CI installs bubblewrap (.ci/run): its absence there is a failure, not a skip
        raise RuntimeError(f"the sandbox does not work on this CI machine: {sandbox.choose('auto').detail}")
    pytest.skip(f"no sandbox on this machine: {sandbox.choose('auto').detail}", allow_module_level=True)


class Listener:
    """A TCP listener on the host's loopback that counts the connections it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def attack_folder(tmp_path: Path, out: Path, port: int = 0, forge_seconds: float = 30) -> Path:
    src = tmp_path / "src"
    shutil.copytree(DATA / "sandbox", src, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(src / "attacks.py", src / "kernelbench" / "candidates")  # what the audit's candidates import
    marker = 900000 + os.getpid() % 90000
    (src / "attack.json").write_text(json.dumps({
        "out": str(out), "victim": str(src / "victim.py"), "secrets": sorted(SECRETS), "port": port,
        "forge_seconds": forge_seconds, "marker": marker}))
    shutil.copy(src / "attack.json", src / "kernelbench" / "candidates")
    return src


def kgate(*args: str, env: dict | None = None, timeout: float = 400, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kgate", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **SECRETS, **(env or {})}, cwd=kw.pop("cwd", ROOT), **kw)


def processes_in(folder: Path) -> list[int]:
    """Pids of processes whose working folder is inside `folder` (workers, what they started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = (proc / "cwd").resolve()
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(int(proc.name))
    return found


def kill_all_in(folder: Path) -> None:
    for pid in processes_in(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def verdicts(report: dict) -> dict[str, dict[str, str]]:
    return {k["name"]: {g["gate"]: g["verdict"] for g in k["gates"]} for k in report["kernels"]}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """One run of the whole attack manifest (but the kernel that is left hanging), the console, the reports
    as kgate wrote them, and the reports again once the daemons had time to act."""
    tmp = tmp_path_factory.mktemp("attacked")
    out = tmp / "out"
    listener = Listener()
    src = attack_folder(tmp, out, listener.port, forge_seconds=8)
    victim = (src / "victim.py").read_text()
    try:
        done = kgate("run", str(src / "kgate.yaml"), "-k", "not lingers", "-j", "2", "--out", str(out), "--junit",
                     str(out / "junit.xml"), "--sandbox", "require")
        written = {name: (out / name).read_text() for name in ("report.json", "junit.xml", "results.jsonl")}
        time.sleep(3)  # a daemon left behind would rewrite the reports now
        later = {name: (out / name).read_text() for name in written}
        left = processes_in(src)
    finally:
        kill_all_in(src)
        listener.close()
    return {"done": done, "out": out, "src": src, "written": written, "later": later, "left": left,
            "victim": victim, "connections": listener.connections}


def test_a_forging_daemon_changes_no_other_kernels_verdict(attacked):
    report = json.loads(attacked["written"]["report.json"])
    got = verdicts(report)
    assert got["wrong"]["oracle"] == "fail"  # forged as a pass without the sandbox
    assert got["good"] == {"oracle": "pass", "isolation": "pass"}
    assert got["snoop"] == {"oracle": "pass", "isolation": "pass"}
    assert attacked["done"].returncode == 1, attacked["done"].stdout[-3000:]
    # a kernel can forge its own results (it runs in the process that judges it), nobody else's
    forged = {json.loads(line)["kernel"] for line in attacked["written"]["results.jsonl"].splitlines()
              if json.loads(line)["message"] == "forged"}
    assert forged <= {"forger"}
    assert "sandbox: bubblewrap" in attacked["done"].stdout


def test_a_kernel_that_leaves_a_daemon_fails_isolation(attacked):
    got = {k["name"]: {g["gate"]: g for g in k["gates"]} for k in json.loads(attacked["written"]["report.json"])["kernels"]}
    for name in ("forger", "rewriter"):
        isolation = got[name]["isolation"]
        assert isolation["verdict"] == "fail" and isolation["tolerance_free"], isolation
        assert "detached" in isolation["message"] and isolation["details"]["detached"], isolation
        assert isolation["details"]["replaced"]["verdict"] == "pass"  # (the forger forged its own pass)
        assert got[name]["oracle"]["verdict"] == "pass"  # what it returns is right


def test_the_reports_stay_as_kgate_wrote_them(attacked, tmp_path):
    assert attacked["later"] == attacked["written"]
    report = json.loads(attacked["later"]["report.json"])
    assert report["summary"]["exit_code"] == 1 and report["environment"]["sandbox"].startswith("bubblewrap")
    assert 'name="sandbox" value="bubblewrap' in attacked["later"]["junit.xml"]
    # and `kgate github` agrees with the run
    done = kgate("github", str(attacked["out"] / "report.json"), "--run-exit-code", "1",
                 "--summary", str(tmp_path / "summary.md"), env={"GITHUB_OUTPUT": str(tmp_path / "outputs")})
    assert done.returncode == 1 and "verdict broken" in done.stdout, done.stdout + done.stderr


def test_kgate_github_refuses_a_report_that_contradicts_the_run(attacked, tmp_path):
    """What an unsandboxed leftover did in the field: the report rewritten to "all pass" after kgate exited 1."""
    data = json.loads(attacked["written"]["report.json"])
    for k in data["kernels"]:
        k["gates"] = [{**g, "verdict": "pass"} for g in k["gates"]]
    forged = tmp_path / "report.json"
    forged.write_text(json.dumps(data))
    done = kgate("github", str(forged), "--run-exit-code", "1", "--summary", str(tmp_path / "summary.md"),
                 env={"GITHUB_OUTPUT": str(tmp_path / "outputs")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "contradicts the run" in done.stdout and "verdict error" in done.stdout
    assert (tmp_path / "outputs").read_text().split("\n")[1] == "error"  # verdict<<DELIMITER, error, DELIMITER


def test_no_kernel_writes_another_kernels_file_or_the_results(attacked):
    assert (attacked["src"] / "victim.py").read_text() == attacked["victim"]
    lines = [json.loads(line) for line in attacked["written"]["results.jsonl"].splitlines()]
    assert all(line.get("digest") for line in lines)
    assert not any(line["message"] == "forged" for line in lines if line["kernel"] != "forger")


def test_no_secret_no_job_file_no_network_reaches_a_kernel(attacked):
    log = (attacked["out"] / "logs" / "snoop.log").read_text()
    snooped = [line for line in log.splitlines() if line.startswith("SNOOPED:")]
    assert snooped and all(json.loads(line.split(":", 1)[1]) == [] for line in snooped), snooped
    assert attacked["connections"] == 0
    everything = attacked["done"].stdout + attacked["done"].stderr + "".join(
        p.read_text(errors="replace") for p in attacked["out"].rglob("*") if p.is_file() and p.name != "flood.log")
    for value in SECRETS.values():
        assert value not in everything


def test_a_flooding_kernels_log_is_capped(attacked):
    log = attacked["out"] / "logs" / "flood.log"
    assert log.stat().st_size <= LOG_CAP_BYTES
    with open(log, "rb") as f:
        f.seek(LOG_CAP_BYTES - 200_000)
        assert b"more bytes than the log keeps" in f.read()
    got = verdicts(json.loads(attacked["written"]["report.json"]))
    assert got["flood"]["oracle"] == "pass"


def test_children_past_the_memory_limit_are_killed_with_their_worker(attacked):
    report = json.loads(attacked["written"]["report.json"])
    [forker] = [k for k in report["kernels"] if k["name"] == "forker"]
    assert forker["gates"][0]["verdict"] == "error"
    assert "exceeded the memory limit of 1.0 GiB" in forker["gates"][0]["message"]
    assert attacked["left"] == []  # no worker, no child, no daemon outlived the run


def test_without_the_sandbox_the_forgery_succeeds(tmp_path):
    """The same daemon with --sandbox none: the wrong kernel after it passes (so the tests above can fail)."""
    out = tmp_path / "out"
    src = attack_folder(tmp_path, out, forge_seconds=20)
    try:
        done = kgate("run", str(src / "kgate.yaml"), "-k", "forger or wrong", "--out", str(out), "--sandbox", "none")
    finally:
        kill_all_in(src)
    got = verdicts(json.loads((out / "report.json").read_text()))
    assert got["wrong"]["oracle"] == "pass", done.stdout[-3000:]
    assert "WARNING sandbox: none (--sandbox none)" in done.stdout


@pytest.mark.parametrize("verb", ["run", "audit"])
def test_kill_9_of_kgate_leaves_no_process_behind(tmp_path, verb):
    out = tmp_path / "out"
    src = attack_folder(tmp_path, out)
    marker = json.loads((src / "attack.json").read_text())["marker"]
    if verb == "run":
        args = ["run", str(src / "kgate.yaml"), "-k", "lingers", "--out", str(out)]
    else:
        args = ["audit", "--format", "kernelbench", "--problems", str(src / "kernelbench" / "problems"),
                "--candidates", str(src / "kernelbench" / "candidates"), "-k", "lingers", "--device", "cpu",
                "--gate", "oracle", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "kgate", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **SECRETS})

    def sleepers():
        found = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and (p / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", str(marker).encode()]:
                    found.append(int(p.name))
            except OSError:
                continue
        return found

    try:
        deadline = time.monotonic() + 120
        while not sleepers() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert sleepers(), f"the kernel's child never started (kgate exited {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while (sleepers() or processes_in(src)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sleepers() == [] and processes_in(src) == []
    finally:
        proc.kill()
        kill_all_in(src)
        for pid in sleepers():
            os.kill(pid, signal.SIGKILL)


def test_an_audit_candidate_cannot_forge_another_candidates_verdict(tmp_path):
    out = tmp_path / "out"
    src = attack_folder(tmp_path, out, forge_seconds=20)
    corpus = src / "kernelbench"
    try:
        done = kgate("audit", "--format", "kernelbench", "--problems", str(corpus / "problems"), "--candidates",
                     str(corpus / "candidates"), "-k", "forger or wrong", "--device", "cpu", "--gate",
                     "oracle,isolation", "--out", str(out), "--order", "given", "-q")
    finally:
        kill_all_in(src)
    records = {json.loads(line)["id"]: json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()
               if line.strip()}
    wrong = next(r for i, r in records.items() if i.endswith("__wrong"))
    forger = next(r for i, r in records.items() if i.endswith("__forger"))
    assert {g["gate"]: g["verdict"] for g in wrong["gates"]}["oracle"] == "fail", done.stdout[-3000:]
    assert wrong["standard"]["verdict"] == "fail"
    assert {g["gate"]: g["verdict"] for g in forger["gates"]} == {"oracle": "pass", "isolation": "fail"}
    assert done.returncode == 1


def test_sandbox_require_without_bubblewrap_is_exit_2_and_auto_says_none(tmp_path):
    out = tmp_path / "out"
    src = attack_folder(tmp_path, out)
    no_bwrap = {"PATH": str(Path(sys.executable).parent)}  # python, but no bwrap on the PATH
    done = kgate("run", str(src / "kgate.yaml"), "-k", "good", "--gate", "oracle", "--out", str(out),
                 "--sandbox", "require", env=no_bwrap)
    assert done.returncode == 2 and "bubblewrap (bwrap) is not installed" in done.stderr, done.stderr
    assert not (out / "report.json").exists()
    done = kgate("run", str(src / "kgate.yaml"), "-k", "good", "--gate", "oracle", "--out", str(out), env=no_bwrap)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["environment"]["sandbox"] == ("none (bubblewrap (bwrap) is not installed); workers forked from an "
                                                "unsandboxed template")
    assert "WARNING sandbox: none" in done.stdout


def test_the_environment_allow_list():
    env = {"PATH": "/bin", "GITHUB_TOKEN": "t", "TORCH_HUB_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "k",
           "CUDA_VISIBLE_DEVICES": "0", "TRITON_CACHE_DIR": "/c", "HOME": "/root", "MY_API_KEY": "k",
           "OPENAI_API_KEY": "k", "LC_ALL": "C", "SOMETHING_ELSE": "x", "TORCH_CUDA_ARCH_LIST": "9.0"}
    assert sandbox.allowed_env(env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "TRITON_CACHE_DIR": "/c",
                                        "LC_ALL": "C", "TORCH_CUDA_ARCH_LIST": "9.0"}
    assert sandbox.allowed_env(env, extra=["SOMETHING_ELSE"])["SOMETHING_ELSE"] == "x"


def test_the_sandbox_holds_for_an_unprivileged_user(tmp_path):
    """The same forgery, with kgate run by `nobody` (uid 65534, no capabilities): bubblewrap makes its
    namespaces through a user namespace then. Where Python lies in a folder `nobody` cannot enter (/root, as on
    this project's machines), the test shows it that folder read-only, and nothing else changes."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to become another user (setpriv)")
    work = Path(tempfile.mkdtemp(prefix="kgate-nobody-"))
    try:
        os.chmod(work, 0o777)
        src = attack_folder(work, work / "out", forge_seconds=20)
        for path in [work, *work.rglob("*")]:
            os.chown(path, 65534, 65534)
        show = []
        if not os.access("/root", os.X_OK, effective_ids=False) or (os.stat("/root").st_mode & 0o001) == 0:
            tops = {"/root/" + Path(p).relative_to("/root").parts[0]  # (folders bwrap makes on the way are 0700)
                    for p in (sys.prefix, sys.base_prefix, str(ROOT)) if p.startswith("/root/")}
            show = ["--tmpfs", "/root"] + [a for top in sorted(tops) for a in ("--ro-bind", top, top)]
        command = ["bwrap", "--dev-bind", "/", "/", *show, "--",
                   "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                   sys.executable, "-m", "kgate", "run", str(src / "kgate.yaml"), "-k", "forger or wrong",
                   "--out", str(work / "out"), "--sandbox", "require"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=work,
                              env={**os.environ, **SECRETS, "HOME": str(work), "PYTHONPATH": str(ROOT)})
        assert (work / "out" / "report.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
        got = verdicts(json.loads((work / "out" / "report.json").read_text()))
        assert got["wrong"]["oracle"] == "fail" and got["forger"]["isolation"] == "fail", (
            got, (work / "out" / "report.json").read_text()[:3000])
        assert "sandbox: bubblewrap" in done.stdout and done.returncode == 1
    finally:
        kill_all_in(work)
        shutil.rmtree(work, ignore_errors=True)
