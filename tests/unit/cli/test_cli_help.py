"""Issue 24 §6: help a practitioner reads, and docs/cli.md that agrees with it.

Help spells no Python types (``<list[str]>``, ``{command}...``, ``<list[Path]>``,
``<str>``), fits 80 columns without cutting the top-level command list, ends each command
with an example; docs/cli.md documents exactly the options each command's help lists, with
the same metavar and the same numeric defaults. An unknown option before the command of
``gpudiag run`` is a usage error that names it and leaves no run directory.
"""

from __future__ import annotations

import re

import pytest
from cli_runner import run_cli
from testpaths import ROOT

from gpudiag.cli.help import EXAMPLES

DOCS = ROOT / "docs" / "cli.md"
COMMANDS = ["analyze", "run", "attach", "doctor", "gate", "diff", "report"]
TABLED = ["analyze", "run", "attach", "gate"]  # commands with an option table in the docs


def _help(*args: str) -> str:
    r = run_cli(*args, "--help", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("cmd", [None, *COMMANDS])
def test_help_has_no_python_types_and_fits_80_columns(cmd):
    text = _help(*([cmd] if cmd else []))
    for bad in ("<list[", "{command}", "{paths}", "<str>", "<int>", "<float>", "<path>", "[str]"):
        assert bad not in text, (cmd, bad, text)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "..." not in text.split("Commands:")[-1] if cmd is None else True
    if cmd:
        assert "Examples:" in text and all(e in text for e in EXAMPLES[cmd]), text


def test_top_level_help_lists_every_command_whole():
    text = _help()
    for cmd in COMMANDS:
        assert re.search(rf"^  {cmd}\s", text, re.M), text
    assert "report   Write one self-contained HTML report (charts inline, works\n" in text


def _doc_rows(cmd: str) -> list[str]:
    text = DOCS.read_text()
    m = re.search(rf"^## `gpudiag {cmd}\b.*?$(.*?)(?=^## )", text, re.M | re.S)
    assert m, cmd
    return [line for line in m.group(1).splitlines() if line.startswith("| `")]


def _spellings(cell: str) -> dict[str, str]:
    """``--flag`` → its metavar ('' for a flag) from a docs cell or a help line."""
    out = {}
    for m in re.finditer(r"(?:(-\w), )?(--[\w-]+)(?: ([^\s,`]+))?", cell.replace("\\|", "|")):
        meta = m.group(3) or ""
        out[m.group(2)] = "" if meta.startswith("--") or meta.startswith("[") else meta
    return out


def _help_options(cmd: str) -> dict[str, tuple[str, str]]:
    """``--flag`` → (metavar, help text) from ``gpudiag CMD --help``."""
    text = _help(cmd).split("Options:")[1].split("Examples:")[0]
    out: dict[str, tuple[str, str]] = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"  (?:(-\w), )?(--[\w-]+)(?: (\S+))?(?:\s{2,}(.*))?$", line)
        if m:
            flag = m.group(2)
            out[flag] = (m.group(3) or "", m.group(4) or "")
        elif flag and line.strip():
            meta, helptext = out[flag]
            out[flag] = (meta, helptext + " " + line.strip())
    out.pop("--help", None)
    return out


@pytest.mark.parametrize("cmd", TABLED)
def test_docs_list_the_options_help_lists_with_the_same_metavars(cmd):
    docs: dict[str, str] = {}
    for row in _doc_rows(cmd):
        first = row.split(" | ")[0]
        for span in re.findall(r"`([^`]+)`", first):
            docs.update(_spellings(span))
    helped = {flag: meta for flag, (meta, _) in _help_options(cmd).items()}
    assert docs == helped


@pytest.mark.parametrize("cmd", TABLED)
def test_numeric_defaults_in_help_are_the_docs(cmd):
    rows = _doc_rows(cmd)
    for flag, (_, text) in _help_options(cmd).items():
        numbers = re.findall(r"(?:default: [^\]]*?|, |\()(\d+(?:\.\d+)?)\)?[\].]", text)
        row = next(r for r in rows if re.search(rf"`[^`]*{re.escape(flag)}\b", r))
        documented = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", row)}
        for n in numbers:
            assert float(n) in documented, (cmd, flag, n, text, row)


def test_unknown_option_before_the_command_is_a_usage_error(tmp_path):
    r = run_cli("run", "--no-such-option", "15", "--", "python", "-c", "pass", cwd=tmp_path)
    assert r.returncode == 2
    assert "no such option: --no-such-option" in r.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.iterdir())
    # options after the command are the command's own
    ok = run_cli(
        "run",
        "-q",
        "--no-analyze",
        "--out",
        str(tmp_path / "r"),
        "python",
        "-c",
        "import sys; assert sys.argv[1:] == ['--foo']",
        "--foo",
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
