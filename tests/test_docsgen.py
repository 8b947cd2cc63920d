"""docs/reference/ is generated from the code (kgate.docsgen): the committed pages must be what the code
gives now, cover every command, option, manifest key, gate and control, and not depend on the terminal."""

from __future__ import annotations

import argparse
import shutil

import pytest
import yaml

from kgate import docsgen
from kgate import gates as registry
from kgate.cli import build_parser
from kgate.manifest import json_schema
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def pages():
    return docsgen.render()


def test_the_committed_reference_pages_are_what_the_code_gives(pages):
    stale = docsgen.stale(ROOT, pages)
    assert stale == [], (f"{', '.join(stale)} differ from what the code gives now: run `{docsgen.COMMAND}` "
                         "and commit docs/reference/")


def test_a_stale_page_is_named_with_the_command_that_fixes_it(tmp_path, capsys):
    shutil.copytree(ROOT / docsgen.REFERENCE, tmp_path / docsgen.REFERENCE)
    page = tmp_path / docsgen.REFERENCE / "manifest.md"
    page.write_text(page.read_text().replace("`bitwise_layouts`", "`bitwise_layout`"))
    (tmp_path / docsgen.REFERENCE / "cli.md").unlink()
    assert docsgen.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "docs/reference/manifest.md is stale" in err and "docs/reference/cli.md is stale" in err
    assert "gates.md" not in err and f"run `{docsgen.COMMAND}`" in err
    assert docsgen.main(["--root", str(tmp_path)]) == 0  # rewritten: current again
    assert docsgen.main(["--check", "--root", str(tmp_path)]) == 0


def test_the_pages_do_not_depend_on_the_terminal_width_or_the_environment(pages, monkeypatch):
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("KGATE_SANDBOX", "none")
    narrow = docsgen.render()
    monkeypatch.setenv("COLUMNS", "250")
    assert narrow == docsgen.render() == pages
    assert "/work/" not in "".join(pages.values()) and str(ROOT) not in "".join(pages.values())


def test_every_command_and_option_is_on_the_cli_page(pages):
    text = pages["cli.md"]
    commands = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    assert len(commands) >= 10
    for name, parser in commands.items():
        assert f"## kgate {name}\n" in text, f"kgate {name} has no section in cli.md"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue  # -h of every command is left out; a hidden option stays hidden
            for option in action.option_strings:
                assert f"`{option}`" in text, f"kgate {name} {option} is missing from cli.md"


def test_every_manifest_key_is_on_the_manifest_page(pages):
    text, schema = pages["manifest.md"], json_schema()
    models = {"The file": schema, **schema["$defs"]}
    for model, node in models.items():
        section = text.split(f"## {model}\n", 1)[1].split("\n## ", 1)[0]
        for key in node["properties"]:
            assert f"| `{key}` |" in section, f"{model}.{key} is missing from manifest.md"
    # a required key says so, a default is shown, a nested model is linked
    assert "| `kernel` | string | required |" in text and "| `factor` | number (> 0) | `8.0` |" in text
    assert "[Tolerance](#tolerance)" in text


def test_every_gate_and_control_is_on_the_gates_page(pages):
    text = pages["gates.md"]
    for gate in registry.all_gates():
        assert f"## {gate.name}\n" in text and gate.summary.split(";")[0] in text
    controls = yaml.safe_load((ROOT / "gates" / "kgate.yaml").read_text())["kernels"]
    for control in controls:
        assert f"| `{control['name']}` |" in text, f"control {control['name']} is missing from gates.md"
    assert f"{len(controls)} controls in all" in text
    # a violating control lists the verdicts it must get; a correct one that every gate passes
    assert "| `contract-violating-returns-input` | any | `contract`: fail, `shapes`: fail |" in text
    assert "| `contract-correct-clamp` | any | every gate passes or skips |" in text


def test_the_cli_page_walks_any_parser_tree():
    """The page follows the parsers, whatever commands they hold: nested subcommands, every nargs form."""
    def build():
        parser = argparse.ArgumentParser(prog="tool", description="A tool.")
        sub = parser.add_subparsers(dest="command")
        outer = sub.add_parser("outer", help="the outer command", epilog="examples:\n  tool outer inner x")
        inner = outer.add_subparsers(dest="inner").add_parser("inner", help="nested", description="Nested.")
        inner.add_argument("path", nargs="+")
        inner.add_argument("--level", type=int, choices=[1, 2], help="level %(choices)s")
        inner.add_argument("-n", "--names", nargs="*", metavar="NAME")
        inner.add_argument("--flag", action="store_true", help="a flag")
        inner.add_argument("--hidden", help=argparse.SUPPRESS)
        return parser

    text = docsgen.cli_page(build)
    assert "| [`tool outer`](#tool-outer) | the outer command |" in text
    assert "## tool outer\n" in text and "### tool outer inner\n" in text and "Nested." in text
    assert "| `path [path ...]` |  |" in text
    assert "| `--level` | `{1,2}` | level 1, 2 |" in text
    assert "| `-n`, `--names` | `[NAME ...]` |" in text and "| `--flag` |  | a flag |" in text
    assert "--hidden" not in text
    assert "```text\nexamples:\n  tool outer inner x\n```" in text


# Work periods are no part of the product. The word checked here (spelt in two parts, so that this file
# passes its own check) may appear only as the kernel's process grouping (setsid, bwrap's flag) or as
# pytest's fixture scope.
_WORD = "sess" "ion"
ALLOWED = (f"process {_WORD}", f"process group/{_WORD}", f"--new-{_WORD}", f'scope="{_WORD}"', f"item.{_WORD}.")


def test_the_repository_names_no_work_periods():
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    found = subprocess.run(["git", "grep", "-n", "-i", "-w", "-e", _WORD, "-e", "lea" "se"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert found.returncode in (0, 1), found.stderr
    other = [line for line in found.stdout.splitlines() if not any(word in line for word in ALLOWED)]
    assert other == [], ("these lines name a work period, not a process grouping (reword them; "
                         "see docs/records/README.md for dated records):\n" + "\n".join(other))
