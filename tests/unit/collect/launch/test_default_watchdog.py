"""The watchdog's default rule: a plain ``gpudiag run`` calls a job stuck within about a minute.

Rule (Thresholds.hang): no rank finished a step for the larger of ``min_timeout_s`` (60 s)
and ``step_factor`` (10) × the median step; ``startup_timeout_s`` (300 s) before the first
step. A job that goes on after the report was pausing (evaluation, a checkpoint): the
evidence taken then is not reported as a hang.
"""

from __future__ import annotations

from pathlib import Path

from test_watchdog import Clock, _answer, _steps  # the watchdog tests' fakes, same folder

from gpudiag.collect.launch import watchdog
from gpudiag.config import Thresholds
from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.runend import read_run_end


def _default(run_dir: Path, clock: Clock, seen: list) -> watchdog.Watchdog:
    h = Thresholds().hang
    return watchdog.Watchdog(
        run_dir,
        None,
        "report",
        seen.append,
        min_timeout_s=h.min_timeout_s,
        step_factor=h.step_factor,
        clock=clock,
        startup_timeout_s=h.startup_timeout_s,
    )


def test_default_rule_constants() -> None:
    h = Thresholds().hang
    assert (h.timeout_s, h.min_timeout_s, h.step_factor, h.startup_timeout_s) == (0, 60, 10, 300)
    assert Thresholds().as_dict()["hang"]["min_timeout_s"] == 60  # recorded in every Diagnosis


def test_short_steps_stuck_after_a_minute_long_steps_after_ten(tmp_path: Path) -> None:
    clock, seen = Clock(), []
    wd = _default(tmp_path, clock, seen)
    assert wd.timeout_s() == 300  # start-up
    _steps(tmp_path, 0, 5)  # 0.1 s steps
    _steps(tmp_path, 1, 5)
    wd.tick()
    assert wd.timeout_s() == 60
    clock.t = 59.0
    wd.tick()
    assert wd.event is None
    clock.t = 61.0
    wd.tick()
    assert wd.event is not None and wd.event.on_hang == "report"
    assert wd.event.rule == "the larger of 60 s and 10 × the median step 0.1 s"
    slow = _default(tmp_path / "slow", clock, [])
    _steps(tmp_path / "slow", 0, 3, dur_ns=30 * 10**9)
    slow.tick()
    assert slow.timeout_s() == 300  # 10 × 30 s


def test_a_pause_is_not_a_hang(tmp_path: Path) -> None:
    clock, seen = Clock(), []
    wd = _default(tmp_path, clock, seen)
    _steps(tmp_path, 0, 5)
    wd.tick()
    clock.t = 61.0
    wd.tick()
    assert wd.event is not None
    _answer(tmp_path, 0, wd.event.request_id)
    assert wd.tick() is False and seen  # reported, the job left running
    _steps(tmp_path, 0, 1)  # it goes on
    wd.tick()
    assert wd.event.resumed_ns is not None
    m = rundir.RunManifest(exit_code=0, extra={"hang": wd.event.to_json()})
    end = read_run_end(tmp_path, m)
    assert end is not None and not end.stacks and not end.dumps
    assert any("then the job went on" in n for n in end.notes)
