"""In ``gpudiag run``: notices that no rank finishes a step, asks every rank for its evidence.

Rule (``Thresholds.hang``, docs/definitions.md "The live watchdog"): the job is *stuck*
when no rank has finished a step for the hang timeout: ``--hang-timeout S`` or
``[tool.gpudiag.hang] timeout_s``, else the larger of ``hang.min_timeout_s`` (60 s) and
``hang.step_factor`` (10) × the median step time so far. It is on by default: a plain
``gpudiag run`` says so on stderr within about a minute of the stall. Until some rank has
finished its first step (start-up: imports, rendezvous, a first compilation) the limit is
at least ``hang.startup_timeout_s`` (300 s), counted from the launch.

Then the watchdog writes a ``hang_dump`` request into the control file; each rank's own
gpudiag thread (``collect/hangdump.py``) answers with its thread stacks and flight
recorder; once every rank seen so far has answered (or after ``hang.answer_wait_s``) the
report callback prints the hang diagnosis, and with ``--on-hang kill`` the job is ended
as Ctrl-C ends it first — SIGINT to its process group, so each rank unwinds and its exit
handlers run (a profiler window it was inside is saved, cut at the step it was in) — then,
if it is still alive after ``INTERRUPT_GRACE_S``, SIGTERM, and SIGKILL after
``KILL_GRACE_S``; ``gpudiag run`` exits ``EXIT_HANG_KILLED`` (124, as ``timeout`` does).
The watchdog fires once per run.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from gpudiag._support.records import dataclass
from gpudiag.collect.launch.log import log
from gpudiag.collect.rank import hangdump
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.sections import FlightRecorderSection, HangSection

ANSWER_WAIT_S = 10.0
INTERRUPT_GRACE_S = 30.0  # for the ranks to unwind and save their profiler windows
KILL_GRACE_S = 5.0
EXIT_HANG_KILLED = 124
ON_HANG = ("report", "kill")
# The job keeps this many entries per process group when gpudiag turns the recorder on.
FR_BUFFER_SIZE = "2000"
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_DUMP_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_env(env: dict[str, str], run_dir: Path) -> FlightRecorderSection:
    """Turn the flight recorder on in ``env`` unless the job set it; what was done, in words.

    The job's own settings win. torch's own dumps on a timeout
    (``TORCH_NCCL_DUMP_ON_TIMEOUT``) land in the run directory unless the job chose a path.
    """
    info = FlightRecorderSection()
    own = next((k for k in FR_ENV if env.get(k)), None)
    if own is None:
        env["TORCH_FR_BUFFER_SIZE"] = FR_BUFFER_SIZE
        info["buffer_size"] = int(FR_BUFFER_SIZE)
        info["set_by"] = "gpudiag"
    else:
        info["buffer_size"] = env[own]
        info["set_by"] = f"the job ({own})"
    if not any(env.get(k) for k in FR_DUMP_ENV):
        prefix = str(hangdump.hang_dir(run_dir.resolve()) / "torch_fr_rank_")
        for k in FR_DUMP_ENV:
            env[k] = prefix
        info["torch_dump_prefix"] = prefix
    return info


@dataclass
class HangEvent:
    """What the watchdog saw and asked for."""

    request_id: str
    detected_ns: int
    idle_s: float
    timeout_s: float
    steps: dict[int, int]
    expected: list[int]
    answered: list[int] = field(default_factory=list)
    answer_s: float = 0.0
    report_ns: int | None = None
    run_dir: str = ""
    on_hang: str = "report"
    rule: str = ""  # the rule that set timeout_s, in words
    resumed_ns: int | None = None  # a rank finished a step after the report: not a hang

    def to_json(self) -> HangSection:
        """The manifest's ``extra.hang`` record."""
        return HangSection(
            request_id=self.request_id,
            detected_ns=self.detected_ns,
            idle_s=round(self.idle_s, 3),
            timeout_s=self.timeout_s,
            steps={str(k): v for k, v in sorted(self.steps.items())},
            expected_ranks=self.expected,
            answered_ranks=self.answered,
            answer_s=round(self.answer_s, 3),
            report_ns=self.report_ns,
            resumed_ns=self.resumed_ns,
        )


class _Tail:
    """Step count and durations of every rank, from the telemetry files as they grow."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}
        self.steps: dict[int, int] = {}
        self.durations_ns: list[int] = []

    def poll(self) -> bool:
        """Read what was appended; True when some rank finished a step."""
        advanced = False
        for rank, lines in rundir.appended_step_lines(self.run_dir, self.offsets):
            self.steps.setdefault(rank, 0)
            for line in lines:
                if b'"type":"step"' not in line:
                    continue
                self.steps[rank] += 1
                advanced = True
                try:
                    rec = json.loads(line)
                    self.durations_ns.append(int(rec["end_ns"]) - int(rec["start_ns"]))
                except (ValueError, KeyError, TypeError):
                    pass
        return advanced


class Watchdog:
    """Ticked by the launcher's loop; says when to kill the job."""

    def __init__(
        self,
        run_dir: Path,
        timeout_s: float | None,
        on_hang: str,
        report: Callable[[HangEvent], None] | None = None,
        min_timeout_s: float = 60.0,
        step_factor: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        answer_wait_s: float = ANSWER_WAIT_S,
        startup_timeout_s: float = 300.0,
    ) -> None:
        self.run_dir = run_dir
        self.fixed_timeout_s = timeout_s
        self.on_hang = on_hang
        self.report = report
        self.min_timeout_s = min_timeout_s
        self.step_factor = step_factor
        self.startup_timeout_s = startup_timeout_s
        self.clock = clock
        self.answer_wait_s = answer_wait_s
        self.tail = _Tail(run_dir)
        self.last_progress = clock()
        self.event: HangEvent | None = None
        self._asked_at: float | None = None
        self._reported = False

    def rule_words(self) -> str:
        """The rule that set the timeout now, in words (for the live message)."""
        if not any(self.tail.steps.values()):
            return f"no first step yet: start-up limit {self.timeout_s():g} s"
        if self.fixed_timeout_s is not None:
            return f"--hang-timeout {self.fixed_timeout_s:g} s"
        if not self.tail.durations_ns:
            return f"the minimum {self.min_timeout_s:g} s"
        median_s = statistics.median(self.tail.durations_ns) / 1e9
        return (
            f"the larger of {self.min_timeout_s:g} s and {self.step_factor:g} × the "
            f"median step {median_s:.3g} s"
        )

    def timeout_s(self) -> float:
        """The hang timeout now: fixed, or max(min, factor × median step so far)."""
        if not any(self.tail.steps.values()):
            return max(self.fixed_timeout_s or 0.0, self.startup_timeout_s)
        if self.fixed_timeout_s is not None:
            return self.fixed_timeout_s
        if not self.tail.durations_ns:
            return self.min_timeout_s
        median_s = statistics.median(self.tail.durations_ns) / 1e9
        return max(self.min_timeout_s, self.step_factor * median_s)

    def tick(self) -> bool:
        """One look at the run; True when the job should be killed now."""
        now = self.clock()
        if self.event is None:
            if self.tail.poll():
                self.last_progress = now
            idle = now - self.last_progress
            limit = self.timeout_s()
            if idle < limit:
                return False
            self._ask(idle, limit)
            return False
        if self._reported:
            if self.event.resumed_ns is None and self.tail.poll():
                self.event.resumed_ns = time.time_ns()  # a pause, not a hang (report mode)
                log("the job went on: a rank finished a step again, so that was a pause")
            return False
        answered = self._answered()
        assert self._asked_at is not None
        waited = now - self._asked_at
        if set(self.event.expected) <= set(answered) or waited >= self.answer_wait_s:
            self.event.answered = answered
            self.event.answer_s = waited
            self._reported = True
            if self.report is not None:
                self.report(self.event)
            self.event.report_ns = time.time_ns()
            return self.on_hang == "kill"
        return False

    def _ask(self, idle: float, limit: float) -> None:
        rid = secrets.token_hex(4)
        self.event = HangEvent(
            request_id=rid,
            detected_ns=time.time_ns(),
            idle_s=idle,
            timeout_s=limit,
            steps=dict(self.tail.steps),
            expected=sorted(self.tail.steps),
            run_dir=str(self.run_dir),
            on_hang=self.on_hang,
            rule=self.rule_words(),
        )
        path = rundir.control_path(self.run_dir)
        try:
            req = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(req, dict):
                req = {}
        except (OSError, ValueError):
            req = {}
        req["hang_dump"] = {"id": rid, "time_ns": self.event.detected_ns}
        with rundir.atomic_write(path) as f:
            json.dump(req, f)
        self._asked_at = self.clock()

    def _answered(self) -> list[int]:
        assert self.event is not None
        out = []
        for p in hangdump.hang_dir(self.run_dir).glob("rank-*.stacks.json"):
            try:
                doc = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("request") == self.event.request_id:
                r = doc.get("rank")
                if isinstance(r, int):
                    out.append(r)
        return sorted(out)


def kill_job(
    pid: int,
    wait: Callable[[float], int | None],
    interrupt_grace_s: float = INTERRUPT_GRACE_S,
    kill_grace_s: float = KILL_GRACE_S,
) -> str:
    """End the job's process group; the signal that ended it (``SIGINT``, ``SIGTERM``, …).

    SIGINT first, as Ctrl-C: the ranks raise KeyboardInterrupt and run their exit handlers
    (gpudiag's saves the profiler window they were in); SIGTERM after ``interrupt_grace_s``
    if the job is still alive; SIGKILL after another ``kill_grace_s``. "" when the group
    was already gone.
    """
    import signal

    last = ""
    for sig, grace in (
        (signal.SIGINT, interrupt_grace_s),
        (signal.SIGTERM, kill_grace_s),
        (signal.SIGKILL, None),
    ):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return last  # gone after the previous signal (or before the first)
        last = sig.name
        if grace is None or wait(grace) is not None:
            return last
    return last


@dataclass
class HangOptions:
    """``--hang-timeout``, ``--on-hang`` and ``[tool.gpudiag.hang]`` for one run."""

    timeout_s: float | None = None  # None: automatic
    on_hang: str = "report"
    min_timeout_s: float = 60.0
    step_factor: float = 10.0
    startup_timeout_s: float = 300.0
    answer_wait_s: float = ANSWER_WAIT_S
    report: Callable[[HangEvent], None] | None = None
    flight_recorder: FlightRecorderSection | None = None  # what child_env did


class Running:
    """The launcher's handle: the watchdog and whether it ended the job."""

    def __init__(self, wd: Watchdog) -> None:
        self.wd = wd
        self.killed = False
        self.kill_signal = ""  # the signal that ended the job (kill_job)


def start(opts: HangOptions | None, run_dir: Path, m: rundir.RunManifest) -> Running | None:
    """The watchdog for this run (None without options); notes the recorder in the manifest."""
    if opts is None:
        return None
    if opts.flight_recorder is not None:
        m.extra["flight_recorder"] = opts.flight_recorder
    return Running(
        Watchdog(
            run_dir,
            opts.timeout_s,
            opts.on_hang,
            opts.report,
            min_timeout_s=opts.min_timeout_s,
            step_factor=opts.step_factor,
            answer_wait_s=opts.answer_wait_s,
            startup_timeout_s=opts.startup_timeout_s,
        )
    )


def tick(run: Running, child: Any, m: rundir.RunManifest) -> bool:
    """One watchdog look from the launcher's loop; True when it ended the job."""
    try:
        kill = run.wd.tick()
    except Exception as e:  # gpudiag's failure never touches the job
        m.diagnosis_incomplete.append(f"hang watchdog failed: {type(e).__name__}: {e}")
        run.wd.event = run.wd.event or HangEvent("failed", time.time_ns(), 0.0, 0.0, {}, [])
        run.wd._reported = True
        return False
    if run.wd.event is not None:
        m.extra["hang"] = run.wd.event.to_json()
    if not kill:
        return False

    def wait(t: float) -> int | None:
        try:
            return int(child.wait(timeout=t))
        except Exception:
            return None

    run.killed = True
    run.kill_signal = kill_job(child.pid, wait)
    return True


def finish(run: Running, m: rundir.RunManifest, code: int) -> int:
    """The exit code of ``gpudiag run``: the job's, or ``EXIT_HANG_KILLED`` if it ended it."""
    if run.wd.event is not None:
        rec = run.wd.event.to_json()
        rec["killed"] = run.killed
        if run.kill_signal:
            rec["kill_signal"] = run.kill_signal
        rec["job_exit_code"] = code
        m.extra["hang"] = rec
    return EXIT_HANG_KILLED if run.killed else code


def ended_words(m: rundir.RunManifest, code: int) -> str:
    """How the job ended, for the log line after it: its code, or why gpudiag's differs."""
    hang = m.extra.get("hang") or {}
    if hang.get("killed"):
        return (
            f"the hang watchdog ended the job (--on-hang kill; the job's code "
            f"{m.exit_code}); exit {code}"
        )
    if m.extra.get("interrupted"):
        return f"interrupted (Ctrl-C): the job stopped with {m.exit_code}; exit {code}"
    return f"job exited with {code}"
