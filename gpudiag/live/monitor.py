"""Live alerts during ``gpudiag run``: follows the run directory, judges, and tells.

A thread of the ``gpudiag run`` process polls the run directory every ``poll_s`` (0.2 s):
each rank's new step telemetry (:class:`gpudiag.traces.runfiles.telemetry.StepsFollower`), the NVML
samples (utilisation per rank's GPU) and the run conditions (whether the host is busy, by
the gate's contention limits). :class:`gpudiag.analysis.run.online.LiveRules` judges every step
that all ranks have finished. Each alert raised or cleared is

* one line on stderr (``gpudiag: alert: step 21: rank 1 is a straggler: …``),
* one JSON line appended to ``alerts.jsonl`` in the run directory (created empty when the
  monitor starts; one ``write`` per record on an ``O_APPEND`` descriptor),
* shown on the status line while raised (:meth:`Monitor.raised`), and
* with ``--alert-exec CMD``, the stdin of ``/bin/sh -c CMD``, run on a thread of its own in
  a session of its own and killed after ``exec_timeout_s``: it never blocks the monitor,
  and the job never waits for gpudiag.

The monitor's own CPU time is measured per poll (``time.thread_time_ns``) and reported per
judged step in the manifest (``extra.alerts``). Nothing it does can stop the job: any
failure is logged once and the monitor stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag._support.records import dataclass
from gpudiag.config import Thresholds, gate_config
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.conditions import RunConditions, contention
from gpudiag.rundir.sections import WatcherName
from gpudiag.traces.runfiles.jsonl import Follower

if TYPE_CHECKING:  # the rules and the followers need numpy and pandas: imported at start()
    from gpudiag.analysis.model.diagnosis import RunStep
    from gpudiag.analysis.run.online import Alert, LiveRules
    from gpudiag.traces.runfiles.samples import SamplesFollower
    from gpudiag.traces.runfiles.telemetry import StepsFollower


SETUP_TIMEOUT_S = 60.0  # the most a poll waits for the thread to build its followers


@dataclass
class AlertOptions:
    """``--alerts on|off``, ``--alert-exec CMD`` and how often to look."""

    enabled: bool = True
    exec_cmd: str | None = None
    exec_timeout_s: float = 10.0
    poll_s: float = 0.2
    stderr: bool = True


class Monitor:
    """The live reader: ``start(run_dir, child_pid)`` once the job runs, ``stop()`` after it."""

    name: WatcherName = "alerts"

    def __init__(
        self,
        thresholds: Thresholds | None = None,
        opts: AlertOptions | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.th = thresholds or Thresholds()
        self.opts = opts or AlertOptions()
        self.log = log or (lambda msg: None)
        self._rules: LiveRules | None = None
        self.run_dir: Path | None = None
        self.path: Path | None = None
        self._steps: StepsFollower | None = None
        self._samples: SamplesFollower | None = None
        self._conditions: dict[Path, Follower] = {}
        self._gpu_rank: dict[str, int] = {}
        self._limits = gate_config(self.th.extra.get("gate"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()  # the thread has built its followers (or failed to)
        self._lock = threading.Lock()
        self._execs: list[threading.Thread] = []
        self.errors: list[str] = []
        self.polls = 0
        self.cpu_ns = 0
        self.rules_cpu_ns = 0  # of which judging (LiveRules.evaluate)
        self.alerts: list[Alert] = []

    @property
    def rules(self) -> LiveRules:
        """The live rules, built on first use (after the job started).

        Their numpy and pandas imports (~1 s of CPU on a 2-core host) never delay the job.
        """
        if self._rules is None:
            from gpudiag.analysis.run.online import LiveRules

            self._rules = LiveRules(self.th)
        return self._rules

    # ---- lifecycle (called by the launcher) ----

    def start(self, run_dir: Path, child_pid: int) -> None:
        """Create ``alerts.jsonl`` empty and start following ``run_dir``."""
        del child_pid  # the telemetry says which ranks run
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / rundir.ALERTS
        with open(self.path, "wb"):
            pass
        self._thread = threading.Thread(target=self._run, name="gpudiag-alerts", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """The monitor's thread: its followers and rules (their imports), then the loop.

        Built here, not in :meth:`start`, so that the launcher's thread goes on at once to
        forward the job's signals: a Ctrl-C during these imports reaches the job.
        """
        try:
            from gpudiag.traces.runfiles.samples import SamplesFollower
            from gpudiag.traces.runfiles.telemetry import StepsFollower

            assert self.run_dir is not None
            self._samples = SamplesFollower(self.run_dir)
            self._steps = StepsFollower(self.run_dir)
            self.rules  # noqa: B018 (built now, in this thread)
        except Exception as e:
            msg = f"live alerts stopped: {type(e).__name__}: {e}"
            self.errors.append(msg)
            self.log(msg)
            return
        finally:
            self._ready.set()
        self._loop()

    def stop(self) -> dict[str, Any]:
        """Judge what the job wrote last, stop, and say what happened (for the manifest)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        if not self.errors and self._steps is not None:
            self._guarded_poll()
        for t in self._execs:
            t.join(timeout=self.opts.exec_timeout_s + 1.0)
        for f in (self._steps, self._samples, *self._conditions.values()):
            if f is not None:
                f.close()
        from gpudiag.analysis.run.online import RAISED

        judged = max(1, self.rules.judged)
        return {
            "file": rundir.ALERTS,
            "raised": sum(1 for a in self.alerts if a.state == RAISED),
            "cleared": sum(1 for a in self.alerts if a.state != RAISED),
            "steps_judged": self.rules.judged,
            "polls": self.polls,
            "cpu_ns": self.cpu_ns,
            "cpu_ns_per_step": round(self.cpu_ns / judged),
            "rules_cpu_ns_per_step": round(self.rules_cpu_ns / judged),
            "cpu_ns_per_poll": round(self.cpu_ns / max(1, self.polls)),
            "errors": list(self.errors),
        }

    def raised(self) -> list[Alert]:
        """The alerts raised and not cleared (for the status line)."""
        with self._lock:
            return self._rules.raised() if self._rules is not None else []

    def no_progress(self, message: str, metrics: dict[str, Any]) -> None:
        """The hang watchdog's finding, as an alert (cleared when a step finishes again)."""
        with self._lock:
            a = self.rules.no_progress(time.time_ns(), message, metrics)
        if a is not None:
            self._emit(a)

    # ---- the loop ----

    def _loop(self) -> None:
        while not self._stop.wait(self.opts.poll_s):
            if not self._guarded_poll():
                return

    def _guarded_poll(self) -> bool:
        try:
            self.poll_once()
            return True
        except Exception as e:
            msg = f"live alerts stopped: {type(e).__name__}: {e}"
            self.errors.append(msg)
            self.log(msg)
            return False

    def poll_once(self) -> list[Alert]:
        """Read what was appended, judge the steps every rank finished, tell each alert."""
        if self._thread is not None:
            self._ready.wait(SETUP_TIMEOUT_S)  # the thread's set-up: its imports
        t0 = time.thread_time_ns()
        assert self._steps is not None
        assert self._samples is not None
        with self._lock:
            for header, recs, restarted in self._steps.poll():
                if restarted:
                    self.rules.restart()
                rank = int(header["rank"])
                uuid = header.get("gpu_uuid")
                if isinstance(uuid, str):
                    self._gpu_rank[uuid] = rank
                self.rules.add_steps(_run_step(rank, r) for r in recs)
            for s in self._samples.poll():
                owner = self._gpu_rank.get(s["gpu_uuid"])
                if owner is not None and s.get("util_ratio") is not None:
                    self.rules.add_gpu_samples(owner, [(s["time_ns"], float(s["util_ratio"]))])
            busy = self._host_busy()
            if busy is not None:
                self.rules.host_busy(busy)
            t1 = time.thread_time_ns()
            out = self.rules.evaluate(time.time_ns())
            self.rules_cpu_ns += time.thread_time_ns() - t1
        self.polls += 1
        self.cpu_ns += time.thread_time_ns() - t0
        for a in out:
            self._emit(a)
        return out

    def _host_busy(self) -> list[str] | None:
        """Why the latest run-conditions sample calls the host busy; None: no new sample."""
        assert self.run_dir is not None
        if not self._conditions:  # the sampler writes one file, from its start
            with contextlib.suppress(OSError):
                for p in (self.run_dir / rundir.CONDITIONS_DIR).glob("*.jsonl"):
                    self._conditions.setdefault(p, Follower(p))
        latest: dict[str, Any] | None = None
        for f in self._conditions.values():
            for rec in f.poll():
                if rec["type"] == "sample":
                    latest = rec
        if latest is None:
            return None
        summary = {
            k + "_mean": latest.get(k)
            for k in ("other_cpu_ratio", "steal_ratio")
            if isinstance(latest.get(k), (int, float))
        }
        return contention(RunConditions({"samples": 1, **summary}), self._limits)

    # ---- telling ----

    def _emit(self, a: Alert) -> None:
        self.alerts.append(a)
        from gpudiag.analysis.run.online import alert_record

        record = json.dumps(alert_record(a), separators=(",", ":")) + "\n"
        if self.path is not None:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, record.encode())
                finally:
                    os.close(fd)
            except OSError as e:
                if not self.errors:
                    self.log(f"cannot write {self.path}: {e}")
                self.errors.append(f"{self.path}: {e}")
        if self.opts.stderr:
            self.log(a.line())
        if self.opts.exec_cmd:
            t = threading.Thread(target=self._exec, args=(record,), daemon=True)
            t.start()
            self._execs = [x for x in self._execs if x.is_alive()] + [t]

    def _exec(self, record: str) -> None:
        """Run ``--alert-exec`` with the alert on stdin; kill it after the timeout."""
        assert self.opts.exec_cmd is not None
        try:
            p = subprocess.Popen(
                ["/bin/sh", "-c", self.opts.exec_cmd],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            self.log(f"--alert-exec could not start: {e}")
            return
        try:
            p.communicate(record.encode(), timeout=self.opts.exec_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            self.log(f"--alert-exec killed after {self.opts.exec_timeout_s:g} s")
            return
        except OSError:
            p.wait()
        if p.returncode:
            self.log(f"--alert-exec exited with {p.returncode}")


def _run_step(rank: int, r: dict[str, Any]) -> RunStep:
    from gpudiag.analysis.model.diagnosis import RunStep

    return RunStep(
        rank,
        r["step"],
        r["start_ns"],
        r["end_ns"] - r["start_ns"],
        r.get("data_wait_ns"),
        r.get("comm_wait_ns"),
        r.get("backward_ns"),
        bool(r.get("profiled", False)),
        _opt(r.get("pre_forward_ns")),
        _opt(r.get("forward_ns")),
        _opt(r.get("optimizer_ns")),
        cpu_ns=r.get("cpu_ns"),
    )


def _opt(v: Any) -> int | None:
    """A phase as written (a non-negative integer), else not seen."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
