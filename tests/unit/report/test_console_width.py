"""The console at 80 and 120 columns: snapshots, and the rules every line keeps.

A verdict first; no line wider than the terminal; no header cut ("comm-wa…"); no number
torn from its unit; wrapped findings and recommendations hang under their first word.
Refresh with ``pytest tests/unit/report/test_console_width.py --update-golden`` and review.
"""

from __future__ import annotations

import io
import re

import pytest
from testpaths import TESTS

import gpudiag
from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.report.console import render, wrap

SNAPSHOTS = TESTS / "golden" / "widths"
SHARED = ["sampled_2rank_a2a", "a100x8_r3", "edge_cpu_only", "mi300x_ddp8_r0_rccl"]
LOCAL = ["straggler_comms_id", "pipeline_4stage"]
WIDTHS = [80, 120]
_UNIT_ALONE = re.compile(r"^\s*(ns|µs|ms|s|GB/s|MHz|%)\b")


def _render(d: Diagnosis, width: int) -> str:
    buf = io.StringIO()
    render(d, buf, width=width, color=False)
    return buf.getvalue()


def _check_rules(text: str, width: int) -> None:
    lines = text.splitlines()
    assert lines[0].startswith("verdict: "), "the verdict comes first"
    for line in lines:
        assert len(line.rstrip()) <= width, f"wider than {width}: {line!r}"
        assert not _UNIT_ALONE.match(line), f"a unit torn from its number: {line!r}"
        assert "…" not in line or not line.lstrip().startswith(("rank ", "type ")), (
            f"a cut header: {line!r}"
        )
    header = next(x for x in lines if x.startswith("rank "))
    for col in ("steps", "median", "compute", "comm-wait", "data-wait", "other", "nc-idle"):
        assert col in header.split(), f"column {col} cut in {header!r}"


def _snapshot(d: Diagnosis, name: str, update: bool) -> None:
    for width in WIDTHS:
        got = _render(d, width)
        _check_rules(got, width)
        path = SNAPSHOTS / f"{name}.{width}.txt"
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(got)
            continue
        if not path.exists():
            pytest.fail(f"no snapshot {path.name}: run pytest --update-golden")
        assert got == path.read_text(), f"{path.name} changed"


def test_saved_run_directory_diagnosis_at_80_and_120_columns(update_golden):
    # the README's demo (2-rank CPU DDP under `gpudiag run`), saved with -f json: the
    # profiled window and the whole run (telemetry) side by side, CPU operators
    d = gpudiag.analyze(TESTS / "data" / "saved" / "demo_cpu_ddp2.json")
    assert d.whole_run is not None
    _snapshot(d, "demo_cpu_ddp2", update_golden)
    text = _render(d, 80)
    assert "profiled window: " in text and "whole run (telemetry): " in text


@pytest.mark.parametrize("name", SHARED)
def test_shared_set_at_80_and_120_columns(name, kineto_sets, update_golden):
    _snapshot(gpudiag.analyze(kineto_sets / name, jobs=1), name, update_golden)


@pytest.mark.parametrize("name", LOCAL)
def test_local_fixture_at_80_and_120_columns(name, update_golden):
    _snapshot(gpudiag.analyze(TESTS / "data" / name, jobs=1), name, update_golden)


def test_wrap_keeps_numbers_with_units_and_hangs():
    lines = wrap("synchronisation wait: r0 368.1 ms, r1 12.5 ms, r2 7.0 µs and 12 %", 30, " ! ")
    assert lines[0].startswith(" ! ")
    assert all(x.startswith("   ") for x in lines[1:])
    joined = "\n".join(lines)
    for kept in ("r0 368.1 ms", "r1 12.5 ms", "7.0 µs"):
        assert kept in joined.replace("\n   ", " ") and kept.split()[-1] != ""
    assert not any(_UNIT_ALONE.match(x) for x in lines)
    assert not any(x.rstrip().endswith((" r0", " r1", " r2")) for x in lines)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _ansi(d: Diagnosis, **kw: object) -> bool:
    buf = _Tty()
    render(d, buf, width=100, **kw)  # type: ignore[arg-type]
    return "\x1b[" in buf.getvalue()


def test_colour_follows_no_color_force_color_and_term(monkeypatch):
    d = gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1)
    for var in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert _ansi(d)
    assert not _ansi(d, color=False)
    monkeypatch.setenv("NO_COLOR", "1")
    buf = _Tty()
    render(d, buf, width=100)
    assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", buf.getvalue()), "no colour under NO_COLOR"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not _ansi(d)
    piped = io.StringIO()
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    render(d, piped, width=100)
    assert "\x1b[" in piped.getvalue(), "FORCE_COLOR colours a pipe"


def test_no_color_option_and_stdout_only_the_report(tmp_path):
    from cli_runner import run_cli

    r = run_cli(
        "analyze",
        "--no-color",
        str(TESTS / "data" / "straggler_comms_id"),
        cwd=tmp_path,
        env={"FORCE_COLOR": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "\x1b[3" not in r.stdout and ";3" not in r.stdout
    assert r.stdout.startswith("verdict: ")


def test_doctor_does_not_wrap_when_piped():
    from gpudiag.report.doctor import render_table

    reason = "torch sees no CUDA device (CPU build or no GPU) " * 4
    caps = {
        "nvml": False,
        "nvml_reason": reason,
        "torch_version": "2.13.0",
        "cuda_available": False,
        "torch_reason": reason,
    }
    out = io.StringIO()
    render_table(caps, out)
    nvml = next(x for x in out.getvalue().splitlines() if "NVML" in x)
    assert reason.strip() in nvml


def test_long_per_rank_lists_are_cut_to_the_longest():
    import dataclasses

    from gpudiag.analysis.model.diagnosis import RankSync

    d = gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1)
    assert d.collectives is not None
    per = {str(i): RankSync(i * 1000, 5) for i in range(64)}
    d = dataclasses.replace(d, collectives=dataclasses.replace(d.collectives, per_rank=per))
    text = _render(d, 80)
    _check_rules(text, 80)
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("waiting for the last rank"))
    assert lines[i].startswith("waiting for the last rank, the 8 longest of 64: in total over")
    block = text.split("waiting for the last rank")[1].split("\n\n")[0]
    assert "profiled step: r63 63.0 µs, r62 62.0 µs" in " ".join(block.split())
    assert "r55" not in block


def test_efficiency_fits_two_lines_of_80_columns_on_every_golden() -> None:
    import json

    from gpudiag.api.saved import diagnosis_from_json
    from gpudiag.report.format import efficiency_lines

    seen = 0
    for p in sorted((TESTS / "golden").glob("*/diagnosis.json")):
        d = diagnosis_from_json(json.loads(p.read_text()))
        effs = [d.efficiency] + [r.evidence.efficiency for r in d.ranks]
        for e in (e for e in effs if e is not None):
            lines = efficiency_lines(e)
            seen += 1
            assert 1 <= len(lines) <= 2, (p.parent.name, lines)
            for label, text in lines:
                assert len(label + text) <= 80, (p.parent.name, label + text)
    assert seen >= 8


def test_every_efficiency_gap_has_its_own_words():
    from typing import get_args

    from gpudiag.analysis.model.kinds import EfficiencyGap
    from gpudiag.report.format import NO_EFFICIENCY

    assert set(NO_EFFICIENCY) == set(get_args(EfficiencyGap))
    assert len(set(NO_EFFICIENCY.values())) == len(NO_EFFICIENCY)
