"""Trial item 14: click's usage errors in gpudiag's one-line form, exit 2, and a
suggestion only when an option is close to what was typed (in-process: no subprocess)."""

from __future__ import annotations

import pytest

from gpudiag.cli.main import main


def _run(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, capsys.readouterr().err


def test_unknown_option_is_one_line_with_a_hint_and_no_far_suggestion(capsys):
    code, err = _run(capsys, "analyze", "--bogus", "x")
    assert code == 2
    lines = err.splitlines()
    assert lines == [
        "gpudiag: error: gpudiag analyze: no such option: --bogus",
        "  hint: see 'gpudiag analyze --help'",
    ]
    code, err = _run(capsys, "run", "--bogus", "--", "python", "-c", "pass")
    assert code == 2 and err.startswith("gpudiag: error: gpudiag run: no such option: --bogus")
    assert "Usage:" not in err and "--out" not in err


@pytest.mark.parametrize(("typed", "meant"), [("--jbos", "--jobs"), ("--form", "--format")])
def test_a_close_option_is_suggested(capsys, typed, meant):
    code, err = _run(capsys, "analyze", typed, "x")
    assert code == 2 and f"did you mean {meant}?" in err


def test_missing_argument_is_one_line(capsys):
    code, err = _run(capsys, "analyze")
    assert code == 2 and err.startswith("gpudiag: error: gpudiag analyze: Missing argument")
    assert len(err.splitlines()) == 2
