"""Live alerts (issue 22): the online rules on synthetic telemetry whose answer is known by
construction, the monitor on a real run directory written as a job would, and the alerts in
the offline diagnosis and the timeline file.

Synthetic DDP steps: every rank ends a step together; busy = the rank's own work, the rest of
the step is its wait in backward (DDP's all-reduce), so a rank that works longer makes the
others wait — the shape `gpudiag run`'s telemetry has (see the integration tests for real
jobs).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpudiag.analysis.model.diagnosis import RunStep
from gpudiag.analysis.run.online import LiveRules, alert_record
from gpudiag.config import LiveRules as LiveConfig
from gpudiag.config import StragglerRules, Thresholds
from gpudiag.rundir import layout as rundir

MS = 1_000_000
STEP = 100  # ms of work per step on every rank


def ddp_steps(steps, ranks=2, extra=None, data=None, start=0, profiled=()):
    """Steps ``start``…: extra[(rank, step)] ms more work, data[(rank, step)] ms of data-wait."""
    extra, data = extra or {}, data or {}
    out, t = [], start * 200 * MS
    for s in range(start, start + steps):
        busy = {r: STEP + extra.get((r, s), 0) + data.get((r, s), 0) for r in range(ranks)}
        dur = max(busy.values()) + 2
        for r in range(ranks):
            wait = dur - busy[r]
            out.append(
                RunStep(
                    r,
                    s,
                    t,
                    dur * MS,
                    data.get((r, s), 0) * MS,
                    None,
                    (wait + 10) * MS,
                    s in profiled,
                )
            )
        t += dur * MS
    return out


def feed(rules: LiveRules, steps):
    """Feed steps one step number at a time; (step fed, alert) for every alert."""
    out = []
    by_step: dict[int, list[RunStep]] = {}
    for s in steps:
        by_step.setdefault(s.step, []).append(s)
    for n in sorted(by_step):
        rules.add_steps(by_step[n])
        out += [(n, a) for a in rules.evaluate(time.time_ns())]
    return out


def straggling(onset, steps=40, rank=1, ms=300):
    return {(rank, s): ms for s in range(onset, steps)}


# ---- the rules ----


def test_a_persistent_straggler_is_named_one_step_after_its_onset_and_not_before():
    alerts = feed(LiveRules(), ddp_steps(40, extra=straggling(20)))
    (n, a), *rest = alerts
    assert (n, a.kind, a.ranks, a.state) == (21, "straggler", [1], "raised")
    assert a.step == 21 and a.metrics["onset_step"] == 20
    assert "rank 1 is a straggler: +300 ms a step" in a.message
    assert "since step 20, the others wait for it in backward" in a.message
    assert rest == []  # raised once, not again while it lasts


def test_four_ranks_name_the_one_that_straggles():
    alerts = feed(LiveRules(), ddp_steps(30, ranks=4, extra=straggling(18, rank=2)))
    assert [(n, a.kind, a.ranks) for n, a in alerts] == [(19, "straggler", [2])]


@pytest.mark.parametrize("slow_ms", [300, 1000, 5000])
def test_a_single_slow_step_never_raises(slow_ms):
    """A checkpoint or a GC on one rank, or on every rank: one step, however long."""
    one_rank = {(1, 20): slow_ms}
    every_rank = {(0, 25): slow_ms, (1, 25): slow_ms}
    data_once = {(0, 30): slow_ms, (1, 30): slow_ms}
    steps = ddp_steps(40, extra={**one_rank, **every_rank}, data=data_once)
    assert feed(LiveRules(), steps) == []


def test_slow_input_is_named_data_bound_for_the_ranks_it_slows():
    data = {(r, s): 200 for r in (0, 1) for s in range(20, 40)}
    alerts = feed(LiveRules(), ddp_steps(40, data=data))
    (n, a), *rest = alerts
    assert (n, a.kind, a.ranks) == (21, "data_bound", [0, 1])
    assert "waiting for data" in a.message and "since step 20" in a.message
    assert a.metrics["threshold"] == Thresholds().data_bound_ratio
    # the telemetry's idle (data + comm wait) is the same time: not a second alert
    assert [x.kind for _, x in rest] == []


def test_exposed_communication_is_named_comm_bound():
    """Collectives called from Python (comm_wait measured, no DDP backward): from step 20
    every rank blocks 150 ms a step in them, more than its own 100 ms of work."""
    steps = [
        RunStep(
            x.rank,
            x.step,
            x.start_ns,
            x.duration_ns + (150 * MS if x.step >= 20 else 0),
            0,
            2 * MS + (150 * MS if x.step >= 20 else 0),
            None,
            False,
        )
        for x in ddp_steps(40)
    ]
    alerts = feed(LiveRules(), steps)
    assert [(n, a.kind, a.ranks) for n, a in alerts] == [(21, "comm_bound", [0, 1])]
    assert "waiting for communication" in alerts[0][1].message


def test_an_alert_clears_once_after_the_effect_is_gone():
    steps = ddp_steps(50, extra={(1, s): 300 for s in range(20, 30)})
    alerts = feed(LiveRules(), steps)
    assert [(n, a.state) for n, a in alerts] == [(21, "raised"), (32, "cleared")]
    cleared = alerts[1][1]
    assert cleared.message == "rank 1 is no longer a straggler (raised at step 21)"


def test_hysteresis_keeps_an_alert_through_a_milder_step():
    """Half the effect (above hysteresis × the raising threshold) keeps it raised."""
    extra = {(1, s): 300 for s in range(20, 40)}
    extra[(1, 28)] = 150
    alerts = feed(LiveRules(), ddp_steps(40, extra=extra))
    assert [(n, a.state) for n, a in alerts] == [(21, "raised")]


def test_a_repeat_waits_for_the_minimum_gap():
    # two bursts 13 steps apart: the second is inside min_gap_steps (20) of the first raise
    extra = {(1, s): 300 for s in [*range(20, 26), *range(33, 45)]}
    alerts = feed(LiveRules(), ddp_steps(60, extra=extra))
    assert [(n, a.state) for n, a in alerts] == [
        (21, "raised"),
        (28, "cleared"),
        (41, "raised"),
        (47, "cleared"),
    ]


def test_a_busy_host_asks_one_more_step_and_says_so():
    rules = LiveRules()
    rules.host_busy(["other processes used 60% of the CPUs (limit 25%)"])
    (n, a), *_ = feed(rules, ddp_steps(40, extra=straggling(20)))
    assert n == 22
    assert a.metrics["onset_step"] == 20
    assert a.message.endswith("(host busy: other processes used 60% of the CPUs (limit 25%))")


def test_host_jitter_raises_the_bar_an_onset_must_clear():
    """Steps that swing by ±25 ms on a busy host: a 30 ms excess (above 10% of a step) twice
    in a row is within the jitter, so it is not a straggler; 300 ms is."""
    jitter = {(r, s): (25 if (s + r) % 2 else -25) for r in (0, 1) for s in range(40)}
    small = {**jitter, **{(1, s): jitter[(1, s)] + 30 for s in (20, 21)}}
    assert feed(LiveRules(), ddp_steps(40, extra=small)) == []
    big = {**jitter, **{(1, s): 300 for s in range(20, 40)}}
    assert [(n, a.ranks) for n, a in feed(LiveRules(), ddp_steps(40, extra=big))] == [(21, [1])]


def test_warm_up_and_profiled_steps_are_not_judged():
    # slow from the very first step, and during a profiled window: nothing until a whole
    # window of steady steps (after warm-up and the profiled steps 5-9 and step 10)
    steps = ddp_steps(30, extra=straggling(0, steps=30), profiled=range(5, 10))
    alerts = feed(LiveRules(), steps)
    cfg = LiveConfig()
    assert alerts[0][0] == 11 + cfg.window_steps - 1


def test_the_constants_come_from_thresholds():
    th = Thresholds().replace(live=LiveConfig(confirm_steps=4, window_steps=8))
    assert [n for n, _ in feed(LiveRules(th), ddp_steps(40, extra=straggling(20)))] == [23]
    # 30 ms more a step: above the default excess_ratio (10% of a ~100 ms step), not above 50%
    small = ddp_steps(40, extra=straggling(20, ms=30))
    assert [n for n, _ in feed(LiveRules(), small)] == [21]
    th = Thresholds().replace(stragglers=StragglerRules(excess_ratio=0.5))
    assert feed(LiveRules(th), small) == []


def test_nvml_idle_is_judged_where_a_gpu_is_sampled():
    rules = LiveRules()
    steps = ddp_steps(30)
    rules.add_steps(steps)
    for r in (0, 1):
        mine = [s for s in steps if s.rank == r]
        samples = []
        for s in mine:  # 10 samples a step; from step 20 the GPU of rank 0 is idle half the time
            busy = 0.4 if (r == 0 and s.step >= 20) else 0.95
            samples += [(s.start_ns + k * s.duration_ns // 10, busy) for k in range(10)]
        rules.add_gpu_samples(r, samples)
    rules2 = LiveRules()
    for r in (0, 1):
        rules2.add_gpu_samples(r, rules.util[r])
    alerts = feed(rules2, steps)
    # the window's idle (6 steps, time-weighted): at step 21 (4 × 5% + 2 × 60%) / 6 = 23%,
    # at step 22 (3 × 5% + 3 × 60%) / 6 = 33% > 30%: raised there, each of its last 2 steps idle
    assert [(n, a.kind, a.ranks, a.metrics["source"]) for n, a in alerts] == [
        (22, "idle_ratio", [0], "nvml")
    ]
    message = alerts[0][1].message
    assert "rank 0: GPU idle 32% of the latest steps by NVML's utilisation" in message
    assert message.endswith("since step 20")


def test_no_progress_comes_from_the_watchdog_and_clears_when_steps_finish():
    rules = LiveRules()
    feed(rules, ddp_steps(15))
    a = rules.no_progress(time.time_ns(), "no rank finished a step for 300 s", {"idle_s": 300})
    assert a is not None and a.kind == "no_progress" and a.step == 14
    assert rules.no_progress(time.time_ns(), "again", {}) is None  # once while it lasts
    alerts = feed(rules, ddp_steps(1, start=15))
    assert [(a.kind, a.state) for _, a in alerts] == [("no_progress", "cleared")]


def test_a_restarted_job_counts_its_steps_again():
    rules = LiveRules()
    assert [n for n, _ in feed(rules, ddp_steps(30, extra=straggling(20, steps=30)))] == [21]
    rules.restart()  # torchrun restarted the ranks: steps from 0 again, the straggler gone
    alerts = feed(rules, ddp_steps(20))
    assert [(n, a.state) for n, a in alerts] == [(12, "cleared")]


def test_cost_of_a_quiet_step_is_small():
    """The rules' own cost per step on a quiet 8-rank job (the figure the report gives)."""
    rules = LiveRules()
    steps = ddp_steps(400, ranks=8)
    t0 = time.thread_time_ns()
    assert feed(rules, steps) == []
    per_step_us = (time.thread_time_ns() - t0) / 400 / 1000
    print(f"online rules: {per_step_us:.0f} µs CPU per step, 8 ranks, nothing raised")
    assert per_step_us < 2000  # far above what it takes (~100 µs): only a gross regression


# ---- the monitor on a run directory ----


def _write_rank(run: Path, rank: int, steps) -> None:
    p = run / rundir.RANKS_DIR / f"rank-{rank}.steps.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        if f.tell() == 0:
            f.write(
                json.dumps(
                    {
                        "type": "header",
                        "format": "gpudiag.steps",
                        "version": 1,
                        "rank": rank,
                        "world_size": 2,
                        "gpu_uuid": None,
                    }
                )
                + "\n"
            )
        for s in steps:
            f.write(
                json.dumps(
                    {
                        "type": "step",
                        "step": s.step,
                        "start_ns": s.start_ns,
                        "end_ns": s.start_ns + s.duration_ns,
                        "data_wait_ns": s.data_wait_ns,
                        "comm_wait_ns": None,
                        "backward_ns": s.backward_ns,
                        "profiled": s.profiled,
                    }
                )
                + "\n"
            )


def test_monitor_follows_the_files_and_tells_stderr_the_file_and_the_command(tmp_path, capsys):
    from gpudiag.live.monitor import AlertOptions, Monitor

    run = tmp_path / "run"
    run.mkdir()
    got = tmp_path / "exec.jsonl"
    lines: list[str] = []
    mon = Monitor(opts=AlertOptions(exec_cmd=f"cat >> {got}", poll_s=3600), log=lines.append)
    mon.start(run, os.getpid())
    assert (run / "alerts.jsonl").read_text() == ""  # created empty at the start
    steps = ddp_steps(30, extra=straggling(20))
    for n in range(30):  # the job writes a step at a time; half a line waits for the next poll
        for r in (0, 1):
            _write_rank(run, r, [s for s in steps if s.step == n and s.rank == r])
        mon.poll_once()
    summary = mon.stop()
    recs = [json.loads(x) for x in (run / "alerts.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"], r["ranks"], r["state"]) for r in recs] == [
        (21, "straggler", [1], "raised")
    ]
    assert set(recs[0]) == {
        "type",
        "time",
        "time_ns",
        "step",
        "kind",
        "state",
        "ranks",
        "message",
        "metrics",
    }
    assert lines[0].startswith("alert: step 21: rank 1 is a straggler: +300 ms a step")
    assert json.loads(got.read_text()) == recs[0]
    assert summary["raised"] == 1 and summary["steps_judged"] == 30 and not summary["errors"]


def test_a_hanging_alert_command_never_blocks_the_monitor(tmp_path):
    from gpudiag.live.monitor import AlertOptions, Monitor

    run = tmp_path / "run"
    run.mkdir()
    lines: list[str] = []
    opts = AlertOptions(exec_cmd="sleep 60", exec_timeout_s=0.5, poll_s=3600)
    mon = Monitor(opts=opts, log=lines.append)
    mon.start(run, os.getpid())
    for r in (0, 1):
        _write_rank(run, r, [s for s in ddp_steps(30, extra=straggling(20)) if s.rank == r])
    t0 = time.monotonic()
    assert [a.kind for a in mon.poll_once()] == ["straggler"]
    assert time.monotonic() - t0 < 0.5  # the command runs on its own thread
    mon.stop()
    assert "--alert-exec killed after 0.5 s" in lines


def test_monitor_reads_the_run_conditions(tmp_path):
    from gpudiag.live.monitor import AlertOptions, Monitor

    run = tmp_path / "run"
    (run / "conditions").mkdir(parents=True)
    (run / "conditions" / "h.jsonl").write_text(
        json.dumps({"type": "header", "format": "gpudiag.conditions", "version": 1})
        + "\n"
        + json.dumps({"type": "sample", "time_ns": 1, "other_cpu_ratio": 0.6, "steal_ratio": 0.0})
        + "\n"
    )
    mon = Monitor(opts=AlertOptions(stderr=False, poll_s=3600))
    mon.start(run, os.getpid())
    for r in (0, 1):
        _write_rank(run, r, [s for s in ddp_steps(30, extra=straggling(20)) if s.rank == r])
    (a,) = mon.poll_once()
    mon.stop()
    assert a.step == 22 and a.metrics["host_busy"] == [
        "other processes used 60% of the CPUs (limit 25%)"
    ]


# ---- the offline diagnosis and the timeline file ----


def test_the_diagnosis_lists_the_alerts_and_the_timeline_shows_them(tmp_path):
    import dataclasses

    from builders import gpu_run

    from gpudiag.analysis.diagnose import live_alerts
    from gpudiag.api.load import diagnose_with_timeline
    from gpudiag.api.saved import diagnosis_from_json, schema_problem
    from gpudiag.report import timeline

    alerts = [
        a for _, a in feed(LiveRules(), ddp_steps(50, extra={(1, s): 300 for s in range(20, 30)}))
    ]
    records = [alert_record(a) for a in alerts]
    found, notes = live_alerts(records)
    assert found == alerts
    assert len(notes) == 1 and "step 21: rank 1 is a straggler" in notes[0]
    assert notes[0].endswith("; cleared at step 32")

    run = dataclasses.replace(gpu_run(), alerts=records)
    d, tl = diagnose_with_timeline(run, map=lambda f, xs: [f(x) for x in xs])
    doc = d.to_json()
    assert schema_problem(doc) is None
    assert [(a["step"], a["state"]) for a in doc["alerts"]] == [(21, "raised"), (32, "cleared")]
    assert any("live alert at" in n and "cleared at step 32" in n for n in doc["notes"])
    assert diagnosis_from_json(json.loads(json.dumps(doc))).alerts == alerts
    path = timeline.write(d, tl, tmp_path / "t.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    marks = [e for e in events if e.get("cat") == "alert"]
    assert [(e["ph"], e["name"], e["pid"], e["args"]["step"]) for e in marks] == [
        ("i", "alert: straggler", 1, 21),
        ("i", "alert cleared: straggler", 1, 32),
    ]


def test_a_run_directory_with_its_alerts_file_loads_them(tmp_path):
    from gpudiag.traces.runfiles.alerts import load_alerts

    (tmp_path / "manifest.json").write_text("{}")
    alerts = [a for _, a in feed(LiveRules(), ddp_steps(30, extra=straggling(20)))]
    (tmp_path / "alerts.jsonl").write_text(
        "".join(json.dumps(alert_record(a)) + "\n" for a in alerts) + '{"type":"alert","ti'
    )  # a truncated last line (the monitor killed mid-write) is left out
    assert [r["step"] for r in load_alerts(tmp_path)] == [21]


def test_a_damaged_alerts_file_is_one_line_naming_it(tmp_path):
    from gpudiag.errors import InputError
    from gpudiag.traces.runfiles.alerts import load_alerts

    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "alerts.jsonl").write_text('{"type":"alert","time_ns":"x"}\n')
    with pytest.raises(InputError, match=r"alerts.jsonl.*line 1: time_ns is not an integer"):
        load_alerts(tmp_path)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ---- the command line and the status line ----


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--alerts", "maybe"], "--alerts maybe is not on or off"),
        (["--alerts", "off", "--alert-exec", "cat"], "--alert-exec needs the alerts on"),
    ],
)
def test_bad_alert_options_are_usage_errors_before_the_job_starts(tmp_path, args, says):
    from cli_runner import run_cli

    r = run_cli("run", "--out", str(tmp_path / "run"), *args, "--", sys.executable, "-c", "0")
    assert r.returncode == 2 and says in r.stderr
    assert not (tmp_path / "run").exists()


def test_the_status_line_shows_the_raised_alerts():
    from gpudiag.collect.launch.progress import Progress, RankProgress
    from gpudiag.report.live import progress_line

    p = Progress(
        Path("runs/x"),
        12.0,
        ranks={0: RankProgress(22), 1: RankProgress(22)},
        alerts=["alert: step 21: rank 1 is a straggler: +300 ms a step"],
    )
    text = progress_line(p)
    assert "alert" in text and "step 21: rank 1 is a straggler: +300 ms a step" in text
