"""gpudiag.cli.quick parses `gpudiag analyze` as typer's command does, or leaves it to typer (issue 34).

The truth is typer's: its built ``analyze`` command's options, and the call its callback
makes for the same command line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import analyze as cli_analyze
from gpudiag.cli import base, quick
from gpudiag.cli import main as cli


def _typer_analyze() -> Any:
    import typer

    return typer.main.get_command(cli._app_for(["analyze", "x"])).commands["analyze"]


def test_the_table_is_typers_analyze_command() -> None:
    params = _typer_analyze().params
    args = [p for p in params if p.param_type_name == "argument"]
    assert [p.name for p in args] == ["paths"]
    options = {p.name: p for p in params if p.param_type_name == "option"}
    table = {dest: (flags, kind) for dest, flags, kind in quick.ANALYZE_OPTIONS}
    assert set(options) == set(table)
    for name, p in options.items():
        flags, kind = table[name]
        assert tuple(p.opts) == flags, name
        assert not p.secondary_opts and not p.multiple and p.nargs == 1, name
        assert p.is_flag == (kind == "flag"), name
        assert p.envvar is None, name  # an environment variable would be typer's to read
        assert p.default in (None, False), name
    import typer

    group = typer.main.get_command(cli.typer_app())
    root = {o: p for p in group.params for o in p.opts}
    for flag in quick.ROOT_FLAGS:  # the root's own switches, nothing more
        assert root[flag].is_flag and not root[flag].is_eager, flag


LINES = [
    ["analyze", "d"],
    ["analyze", "a", "b", "-f", "json", "-o", "out.json"],
    ["--debug", "analyze", "d", "--format=csv", "--output=o.csv", "--no-cache"],
    ["--no-color", "analyze", "d", "--steps", "--include-warmup", "-j", "3"],
    ["analyze", "--idle-threshold", "0.25", "d", "--jobs", " 2 "],
    ["analyze", "d", "--step-marker", r"^it(\d+)$", "--data-marker", "load.*"],
    ["analyze", "d", "--timeline", "t.json.gz", "--timeline-full", "--nsys", "/opt/nsys"],
    ["analyze", "d", "--scheduler", "tcp://h:8786", "-f", "json", "-f", "markdown"],
    ["analyze", "--", "-odd-name", "d"],
    ["analyze", "d", "--no-color"],
    ["analyze", "-", "d"],
    ["analyze", "d", "--idle-threshold", "1e-1"],
]

TO_TYPER = [
    ["analyze"],  # no path
    ["analyze", "--help"],
    ["analyze", "d", "-h"],
    ["analyze", "d", "--bogus"],
    ["analyze", "d", "--jobs", "x"],  # a value that does not convert
    ["analyze", "d", "--jobs", "-1"],  # looks like an option
    ["analyze", "d", "-o"],  # a missing value
    ["analyze", "d", "-fjson"],  # a short option with its value attached
    ["analyze", "d", "--steps=yes"],
    ["analyze", "d", "--format="],
    ["analyze", ""],
    ["--version", "analyze", "d"],
    ["report", "d"],
    [],
]


def _calls(monkeypatch: pytest.MonkeyPatch, argv: list[str], quick_path: bool) -> Any:
    """(exit, the call of run_analyze, the state and NO_COLOR it ran with) on one path."""
    seen: list[Any] = []

    def spy(paths: list[Path], **kw: Any) -> None:
        seen.append((paths, kw, dict(base.state), os.environ.get("NO_COLOR")))

    monkeypatch.setattr("gpudiag.cli.analyzing.run_analyze", spy)
    monkeypatch.setattr(cli_analyze, "run_analyze", spy)
    monkeypatch.delenv("NO_COLOR", raising=False)
    if not quick_path:
        monkeypatch.setattr("gpudiag.cli.quick.analyze_call", lambda args: None)
    code: object = None
    try:
        cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    return code, seen


@pytest.mark.parametrize("argv", LINES)
def test_quick_path_calls_what_typer_calls(
    monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    assert quick.analyze_call(cli._hoisted(argv)) is not None, argv
    via_typer = _calls(monkeypatch, argv, quick_path=False)
    via_quick = _calls(monkeypatch, argv, quick_path=True)
    assert via_typer[1], via_typer  # typer did call analyze
    assert via_quick == via_typer


@pytest.mark.parametrize("argv", TO_TYPER)
def test_anything_else_goes_to_typer(argv: list[str]) -> None:
    assert quick.analyze_call(cli._hoisted(argv)) is None


def test_errors_come_from_typer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, seen = _calls(monkeypatch, ["analyze", "d", "--jobs", "x"], quick_path=True)
    err = capsys.readouterr().err
    assert code == 2 and not seen
    assert "gpudiag analyze: Invalid value for '--jobs'" in err and "hint:" in err


@pytest.mark.parametrize("quick_path", [True, False])
def test_ctrl_c_exits_130_on_either_path(monkeypatch: pytest.MonkeyPatch, quick_path: bool) -> None:
    """Ctrl-C while analysing: exit 130, as `gpudiag run` and the shell say (typer used to
    turn it into a returned code that main dropped: exit 0, as if the analysis had ended)."""

    def interrupted(paths: list[Path], **kw: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("gpudiag.cli.analyzing.run_analyze", interrupted)
    monkeypatch.setattr(cli_analyze, "run_analyze", interrupted)
    if not quick_path:
        monkeypatch.setattr("gpudiag.cli.quick.analyze_call", lambda args: None)
    with pytest.raises(SystemExit) as e:
        cli.main(["analyze", "d", "-f", "json"])
    assert e.value.code == 130
