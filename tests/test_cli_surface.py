"""The CLI as a user meets it: quick to start, and nothing a kernel prints can act on the terminal or the
CI log, or make the table lie about gate names."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rich.console import Console

from kgate.gates.base import FAIL, PASS, GateResult
from kgate.names import GATE_NAMES
from kgate.report import KernelResult, Report
from kgate.reports import console as console_report
from kgate.reports.github import plain

HEAVY = ("torch", "triton", "numpy")


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["gates"], ["schema"], ["run", "--help"],
                                  ["audit", "--help"]])
def test_light_commands_import_nothing_heavy(argv):
    code = ("import sys\nfrom kgate.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
            "assert not heavy, f'imported {heavy}'\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kgate {' '.join(argv)}: {done.stderr[-2000:]}"


def test_gates_lists_what_the_gate_classes_say():
    from kgate import gates as registry
    from kgate.commands.gates import describe

    for name in GATE_NAMES:
        gate = registry.get(name)
        assert describe(name) == (gate.name, gate.tolerance_free, gate.summary), name


def test_the_audit_console_progress_answers_every_scheduler_event():
    from kgate.audit.scheduler import Progress
    from kgate.commands.audit import _ConsoleProgress

    events = {n for n in vars(Progress) if not n.startswith("_")}
    missing = sorted(n for n in events if not callable(getattr(_ConsoleProgress, n, None)))
    assert not missing, f"_ConsoleProgress lacks {missing} of the scheduler's Progress"


@pytest.mark.parametrize("text", [
    "::error file=k.py,line=1::forged", "  ::add-mask::secret", "x\n::stop-commands::tok", "\r::warning::w",
    "a ##[error]old form", "\x1b[2J\x1b[31mred", "\x9b31m", "text \u202e reversed",
])
def test_kernel_text_cannot_start_a_workflow_command_or_an_escape(text):
    out = plain(text)
    for line in out.split("\n"):
        assert not line.lstrip().startswith("::"), repr(out)
    assert "##[" not in out and "\x1b" not in out and "\r" not in out and "\x9b" not in out, repr(out)
    assert "\u202e" not in out, repr(out)


def test_plain_text_is_left_as_it_is():
    text = "expected 1.0, got 2.0 at [3, 4]\n\tcase: shape=(7, 1000) a::b http://x"
    assert plain(text) == text


def _report(message: str, gates: list[str] = GATE_NAMES) -> Report:
    results = [GateResult(g, FAIL if g == "oracle" else PASS, message if g == "oracle" else "ok", False)
               for g in gates]
    kernel = KernelResult(name="softmax", kernel="k.py:k", reference="k.py:r", device="cpu", gates=results)
    return Report(manifest="kgate.yaml", kernels=[kernel])


def test_a_kernel_message_on_the_console_is_neutralised(capsys):
    console = Console(force_terminal=False, width=160, highlight=False)
    console_report.findings(console, _report("boom\n::error title=x::forged\n\x1b[31m[bold]red[/]"))
    out = capsys.readouterr().out
    assert "::error" not in out.replace("%3A%3Aerror", "") and "\x1b" not in out, out
    assert "[bold]red[/]" in out, "rich markup from a kernel is shown as text, not applied"


@pytest.mark.parametrize("width", [60, 100, 160, 400])
def test_the_table_keeps_every_gate_name_whole(width):
    console = Console(width=width, force_terminal=False, record=True)
    console.print(console_report.table(_report("bad"), width))
    text = console.export_text()
    assert "\u200b" not in text and "…" not in text, text
    words = set(text.replace("│", " ").replace("┃", " ").split())
    assert set(GATE_NAMES) <= words, f"cut at width {width}: {sorted(set(GATE_NAMES) - words)}\n{text}"


HOG_PY = """
import time
import torch

def ref(x):
    return x * 2

def hog(x):
    held = [bytearray(64 * 2**20) for _ in range(24)]  # 1.5 GiB, touched
    for block in held:
        block[::4096] = b"x" * len(block[::4096])
    time.sleep(5)
    return x * 2

def make_inputs(seed, shape=None):
    return (torch.ones(4),)
"""


def test_a_kernel_stopped_by_kgates_memory_limit_is_told_so(write_manifest, tmp_path, capsys):
    from kgate.cli import main

    path = write_manifest("""\
        version: 1
        defaults: {device: cpu, seeds: [0], gates: [contract], limits: {memory: 1GiB, timeout: 60}}
        kernels:
          - {name: hog, kernel: k.py:hog, reference: k.py:ref, inputs: k.py:make_inputs}
        """, {"k.py": HOG_PY})
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "-q"]) == 1
    out = capsys.readouterr().out
    assert "kgate's memory limit of 1.0 GiB was reached" in out and "limits.memory" in out, out
