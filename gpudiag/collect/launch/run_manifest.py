"""The run's manifest completed after the job ends, from what the ranks wrote.

Ranks, hosts, world size and sources from each rank's telemetry file; the job's own
profiler, the profiled windows' status and a ``--profile-steps`` that fits a job too short for
the one asked; and one more "diagnosis incomplete" reason added to an existing manifest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpudiag.collect.launch import outcome
from gpudiag.collect.launch.log import log
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.sections import JobProfilerSession, JobTrace, ProfileWindow, RankError


def read_rank_records(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int]:
    """(last header, every record but steps, step count) of one telemetry file."""
    header: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    steps = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if '"type":"step"' in line:
                steps += 1
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("type") == "header":
                header, events, steps = rec, [], 0  # a restarted rank starts a new segment
            else:
                events.append(rec)
    return header, events, steps


def suggest_window(steps: int) -> str | None:
    """A ``--profile-steps`` that fits a job of ``steps`` steps (one warm-up step before it)."""
    if steps < 2:
        return None
    a = min(5, max(1, steps // 3))
    return f"{a}:{min(steps, a + 5)}"


def finish_manifest(run_dir: Path, m: rundir.RunManifest) -> None:
    """Fill ranks, hosts, world size and sources from what the ranks wrote."""
    ranks_dir = run_dir / rundir.RANKS_DIR
    files = (
        sorted(p for p in ranks_dir.glob("rank-*.steps.jsonl") if p.is_file())
        if ranks_dir.is_dir()
        else []
    )
    errors: list[RankError] = []
    per_rank: dict[int, list[dict[str, Any]]] = {}
    steps_total = 0
    for path in files:
        header, events, steps = read_rank_records(path)
        if header is None:
            continue
        r = int(header["rank"])
        steps_total += steps
        per_rank[r] = events
        m.ranks.append(
            rundir.RankInfo(
                rank=r,
                local_rank=int(header.get("local_rank", 0)),
                host=str(header.get("host", "")),
                pid=header.get("pid"),
                gpu_uuid=header.get("gpu_uuid"),
                device=header.get("device"),
            )
        )
        if header.get("host") and header["host"] not in m.hosts:
            m.hosts.append(str(header["host"]))
        ws = header.get("world_size")
        if isinstance(ws, int):
            m.world_size = max(m.world_size or 0, ws)
        for ev in events:
            kind = ev.get("type")
            if kind == "error":
                errors.append(RankError(rank=r, where=ev.get("where"), message=ev.get("message")))
                if ev.get("where") == "gpudiag":
                    m.diagnosis_incomplete.append(f"rank {r}: {ev.get('message')}")
            elif kind == "lost":
                # the rank ran the steps whose records were lost: "ran N steps" counts them
                steps += int((ev.get("types") or {}).get("step", 0))
                m.diagnosis_incomplete.append(
                    f"rank {r}: telemetry lost {ev.get('records')} records (steps "
                    f"{ev.get('first_step')}-{ev.get('last_step')}): {ev.get('message')}"
                )
        kinds = {ev.get("type") for ev in events}
        if m.exit_code == 0 and steps and not kinds & {"exit", "exec"}:
            m.diagnosis_incomplete.append(
                f"rank {r}: telemetry ends without an exit record after {steps} steps "
                "(its last writes failed, or the rank was killed)"
            )
        m.extra.setdefault("steps_per_rank", {})[str(r)] = steps
    m.ranks.sort(key=lambda x: x.rank)
    if errors:
        m.extra["rank_errors"] = errors
    rel = [str(p.relative_to(run_dir)) for p in files]
    if steps_total:
        m.sources["telemetry"] = rundir.SourceStatus(True, files=rel)
    else:
        if ranks_dir.exists() and not ranks_dir.is_dir():
            why = f"{ranks_dir} is not a directory: the ranks could not write their telemetry"
        else:
            why = (
                "no rank reported a step: no torch.optim step() ran, the job is not Python, "
                "or python -S/-E/-I skipped the bootstrap"
            )
        m.sources["telemetry"] = rundir.SourceStatus(False, why, files=rel)
        m.diagnosis_incomplete.append(why)
    _job_profiler_extras(per_rank, m)
    m.sources["kineto"] = _kineto_status(run_dir, ranks_dir, per_rank, m)
    m.sources.setdefault("nsys", rundir.SourceStatus(False, "not requested"))


def _job_profiler_extras(per_rank: dict[int, list[dict[str, Any]]], m: rundir.RunManifest) -> None:
    """``extra.job_traces``, ``extra.job_profiler`` and ``extra.profile_windows``."""
    traces: list[JobTrace] = []
    sessions: list[JobProfilerSession] = []
    windows: list[ProfileWindow] = []
    for r, events in sorted(per_rank.items()):
        open_: dict[str, JobProfilerSession] = {}
        for ev in events:
            kind = ev.get("type")
            if kind == "job_trace":
                traces.append(
                    JobTrace(
                        rank=r,
                        path=ev.get("path"),
                        api=ev.get("api"),
                        step=ev.get("step"),
                        time_ns=ev.get("time_ns"),
                        exists=os.path.exists(str(ev.get("path"))),
                    )
                )
            elif kind == "job_profiler" and ev.get("event") == "start":
                s = JobProfilerSession(
                    rank=r,
                    api=ev.get("api"),
                    start_step=ev.get("step"),
                    start_ns=ev.get("time_ns"),
                    stop_step=None,
                    stop_ns=None,
                )
                open_[str(ev.get("api"))] = s
                sessions.append(s)
            elif kind == "job_profiler" and ev.get("event") == "stop":
                started = open_.pop(str(ev.get("api")), None)
                if started is not None:
                    started["stop_step"], started["stop_ns"] = ev.get("step"), ev.get("time_ns")
            elif kind == "window":
                windows.append(
                    ProfileWindow(
                        rank=r,
                        window=ev.get("window"),
                        status=ev.get("status"),
                        step=ev.get("step"),
                        reason=ev.get("reason"),
                        kept=ev.get("kept"),
                        job_api=ev.get("job_api"),
                        job_since_step=ev.get("job_since_step"),
                    )
                )
    if traces:
        m.extra["job_traces"] = traces
    if sessions:
        m.extra["job_profiler"] = sessions
    if windows:
        m.extra["profile_windows"] = windows


def _kineto_status(
    run_dir: Path, ranks_dir: Path, per_rank: dict[int, list[dict[str, Any]]], m: rundir.RunManifest
) -> rundir.SourceStatus:
    """Whether gpudiag's traces were captured and, either way, what happened to the window."""
    traces = sorted(ranks_dir.glob("rank-*.pt.trace.json.gz")) if ranks_dir.is_dir() else []
    files = [str(p.relative_to(run_dir)) for p in traces]
    windows = [w for w in m.extra.get("profile_windows", []) if w.get("status") != "saved"]
    job_traces = m.extra.get("job_traces", [])
    tail = ""
    if job_traces:
        tail = (
            f"; the job's own traces: {len(job_traces)} file(s) in extra.job_traces, "
            f"e.g. {job_traces[0]['path']}"
        )
    note = _window_note(windows)
    if traces:
        lost_some = outcome.lost_traces(m.profile_steps, traces, per_rank, m.extra)
        note = "; ".join(x for x in (note, lost_some) if x)
        return rundir.SourceStatus(True, note + tail if note else "", files=files)
    if not m.profile_steps or m.profile_steps == "off":
        return rundir.SourceStatus(False, "profiling off (--profile-steps off)" + tail)
    if note:
        log(f"no profiler trace from gpudiag: {note}{tail}")
        return rundir.SourceStatus(False, note + tail)
    lost = outcome.lost_window(
        m.profile_steps, m.extra.get("steps_per_rank", {}), per_rank, m.exit_code
    )
    if lost:
        log(lost)
        return rundir.SourceStatus(False, lost + tail)
    gone = _window_record_lost(m.profile_steps, per_rank)
    if gone:
        log(gone)
        return rundir.SourceStatus(False, gone + tail)
    most = max(m.extra.get("steps_per_rank", {}).values(), default=0)
    why = f"profile window {m.profile_steps} not reached: ranks ran {most} steps"
    fit = suggest_window(most)
    why += f"; rerun with --profile-steps {fit}" if fit else ""
    if most:
        log(why)
    return rundir.SourceStatus(False, why + tail)


def _window_record_lost(
    profile_steps: str | None, per_rank: dict[int, list[dict[str, Any]]]
) -> str:
    """Why no trace exists when the record of the window's outcome was lost with telemetry.

    A rank whose telemetry writes failed (a full disk) drops whole records; when a dropped
    record was the window's own (saved, not saved, cut), what became of the window is not
    known from the run directory: said so, with the steps and the write error, rather than
    guessed from the steps that remain.
    """
    lost = [
        (r, ev)
        for r, evs in sorted(per_rank.items())
        for ev in evs
        if ev.get("type") == "lost" and (ev.get("types") or {}).get("window")
    ]
    if not lost:
        return ""
    ranks = sorted({r for r, _ in lost})
    who = "every rank" if len(ranks) == len(per_rank) else f"ranks {ranks}"
    ev = lost[0][1]
    return (
        f"window {profile_steps}: no trace, and the record of what became of it was lost with "
        f"the telemetry of steps {ev.get('first_step')}-{ev.get('last_step')} ({who}: "
        f"{ev.get('message')})"
    )


def _window_note(windows: list[ProfileWindow]) -> str:
    """One sentence on the first window that did not end normally, naming the ranks."""
    if not windows:
        return ""
    first = windows[0]
    same = sorted(
        {
            w["rank"]
            for w in windows
            if w.get("status") == first.get("status") and w.get("window") == first.get("window")
        }
    )
    who = "every rank" if len(same) == len({w["rank"] for w in windows}) else f"ranks {same}"
    w = first.get("window") or [0, 0]
    win = f"{w[0]}:{w[1]}"
    status, step, reason = first.get("status"), first.get("step"), first.get("reason") or ""
    api = first.get("job_api") or "torch.profiler"
    if status == "stood_down":
        if first.get("job_since_step") == 0:
            return f"the job runs its own {api} from step 0; no gpudiag window ({who})"
        return f"window {win} not opened at step {step}: {reason} ({who})"
    if status == "cut":
        kept = first.get("kept")
        if kept:
            return (
                f"window {win} cut at step {step}: {reason}; steps {kept[0]}-{kept[1] - 1} "
                f"kept ({who})"
            )
        return f"window {win} cut at step {step} before a complete step: {reason} ({who})"
    if status == "cut_by_exit":
        kept = first.get("kept") or w
        return f"window {win} cut by the job's exit; steps {kept[0]}-{kept[1] - 1} kept ({who})"
    if status == "not_reached":
        return ""  # the caller words it with the step count and a window that fits
    if status == "not_saved":
        return f"window {win}: {reason} ({who})"
    if status == "failed":
        return f"window {win} lost at step {step}: {reason} ({who})"
    return f"window {win} {status} at step {step}: {reason} ({who})"


def record_incomplete(run_dir: Path, message: str) -> None:
    """Append one 'diagnosis incomplete' reason to an existing manifest; never raises."""
    try:
        m = rundir.read_manifest(run_dir / rundir.MANIFEST)
        m.diagnosis_incomplete.append(message)
        rundir.write_manifest(run_dir, m)
    except Exception as e:
        log(f"cannot update the manifest: {e}")
