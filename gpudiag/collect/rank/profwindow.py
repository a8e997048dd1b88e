"""gpudiag's profiler window in a rank, and its coexistence with the job's own profiler.

The window is a state machine driven by the step counter (:mod:`gpudiag.collect.rank.hook`):
*pending* (``window`` set) → *recording* (``prof`` set, torch's schedule WARMUP → RECORD →
RECORD_AND_SAVE) → *saved*, or ``stood_down`` / ``cut`` / ``not_saved`` / ``not_reached`` /
``failed``, each written as a ``window`` record.

torch allows one profiler session per process; a second one breaks the first (empty
traces, SIGSEGV at export). gpudiag does not open its window while a job session is
active or the job's ``torch.profiler`` schedule will record during it, and it closes its
own session (saving the complete steps) before a job session starts inside its window.
The patches in :mod:`gpudiag.collect.rank.patches` report the job's sessions here.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

from gpudiag.collect.rank.faults import Faults
from gpudiag.rundir import layout as rundir


class WindowHost(Protocol):
    """What the window needs from the step counter that drives it."""

    run_dir: Path
    rank: int
    pid: int
    step: int
    torch: Any
    faults: Faults

    def write(self, rec: dict[str, Any]) -> None:
        """Append a telemetry record."""

    def record_error(self, where: str, message: str) -> None:
        """Append an error record."""

    def fail(self, message: str) -> None:
        """A gpudiag failure that leaves the hook running."""


class ProfilerWindow:
    """gpudiag's torch profiler session over steps [A, B), and the job's sessions it sees."""

    def __init__(self, host: WindowHost, window: tuple[int, int] | None) -> None:
        self.host = host
        self.window = window  # the window still to open (None once opened)
        self.first_window = window
        self.prof: Any = None
        self.prof_window: tuple[int, int] | None = None
        self.windows_saved = 0
        self.last_saved_window: tuple[int, int] | None = None
        # the job's own profiler: sessions it has open, scheduled profilers it started
        self.own_depth = 0  # > 0 while gpudiag drives its own profiler
        self.job_depth = 0  # > 0 inside a job profiler call already accounted for
        self.job_sessions: dict[int, dict[str, Any]] = {}
        self.job_schedules: dict[int, weakref.ref[Any]] = {}
        self.job_in_step = False
        self.job_export_api: str | None = None
        self.export_depth = 0
        self._skip_save = False
        self._save_until: int | None = None

    # -- gpudiag's session ---------------------------------------------------------

    def recording(self, step: int) -> bool:
        """Whether gpudiag's session records ``step``."""
        w = self.prof_window
        return self.prof is not None and w is not None and w[0] <= step < w[1]

    @contextmanager
    def own(self) -> Iterator[None]:
        """Mark calls into gpudiag's own profiler, so the job-profiler guards ignore them."""
        self.own_depth += 1
        try:
            yield
        finally:
            self.own_depth -= 1

    def _action(self, _profiler_step: int) -> Any:
        from torch.profiler import ProfilerAction

        s, w = self.host.step, self.prof_window
        if w is None or s < w[0] - 1 or s >= w[1]:
            return ProfilerAction.NONE
        if s == w[0] - 1:
            return ProfilerAction.WARMUP
        if s == w[1] - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.RECORD

    def tick(self) -> None:
        """A step ended: advance the session, stop it past the window, or open the window."""
        s = self.host.step  # the step about to start
        if self.prof is not None:
            assert self.prof_window is not None
            with self.own():
                self.prof.step()
                if s >= self.prof_window[1]:
                    prof, self.prof = self.prof, None
                    prof.stop()
                    self._cuda_profiler(False)
            return
        w = self.window
        if w is not None and w[0] - 1 <= s < w[1]:
            self.window = None  # a window runs once
            busy = self._job_profiler_busy(w)
            if busy is not None:
                self.record(w, "stood_down", busy)
                return
            self._start(w)

    def _start(self, w: tuple[int, int]) -> None:
        from torch.profiler import ProfilerActivity, profile

        host = self.host
        acts = [ProfilerActivity.CPU]
        if host.torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        self.prof_window = w
        # record_shapes: the operators' input shapes give gloo/CPU collectives their sizes
        # (their annotations carry none) and the compute efficiency its FLOPs; the cost, more
        # profiler work per operator, stays in the window's few steps (docs/capture.md)
        prof = profile(
            activities=acts,
            schedule=self._action,
            on_trace_ready=self._save,
            record_shapes=True,
        )
        prof.step_num = host.step  # so ProfilerStep#N carries gpudiag's step number
        with self.own():
            prof.start()
        self.prof = prof
        self._cuda_profiler(True)
        if host.faults:
            host.faults.fire("hook:profiler", host.step)

    def close(self, save: bool, status: str, why: str) -> None:
        """Stop gpudiag's session now; with ``save`` keep its complete steps if there are any."""
        prof, self.prof = self.prof, None
        if prof is None:
            return
        step = self.host.step
        w = self.prof_window or (step, step)
        usable = save and step > w[0]
        before = self.windows_saved
        self._skip_save, self._save_until = not usable, step
        try:
            with self.own():
                prof.stop()  # RECORD: stop_trace, then on_trace_ready (_save); WARMUP: no save
        except Exception as e:
            msg = f"stopping gpudiag's profiler: {type(e).__name__}: {e}"
            self.host.record_error("gpudiag", msg)
        finally:
            self._skip_save, self._save_until = False, None
            self._cuda_profiler(False)
        kept = [w[0], step] if self.windows_saved > before else None
        self.record(w, status, {"reason": why, "kept": kept})

    def _cuda_profiler(self, on: bool) -> None:
        """Open/close `nsys profile --capture-range=cudaProfilerApi` around the window."""
        if os.environ.get("GPUDIAG_NSYS_RANGE") != "window":
            return
        torch = self.host.torch
        try:
            if torch.cuda.is_available():
                (torch.cuda.profiler.start if on else torch.cuda.profiler.stop)()
        except Exception as e:  # the profiler API must never break the job
            self.host.record_error("gpudiag", f"cudaProfiler{'Start' if on else 'Stop'}: {e}")

    def _save(self, prof: Any) -> None:
        """``on_trace_ready``: export the window; a failure loses the trace, not the job."""
        if self._skip_save:
            return
        host = self.host
        w = self.prof_window or (host.step, host.step)
        end = min(w[1], host.step + 1) if self._save_until is None else self._save_until
        path = rundir.trace_path(host.run_dir, host.rank)
        tmp = path.with_name(f".{path.name}.{host.pid}.tmp.json.gz")
        try:
            if host.faults:
                host.faults.fire("hook:save", host.step)
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(tmp))  # one writer per window; .gz makes torch gzip it
            if path.exists():
                self._move_aside(path)
            os.replace(tmp, path)
        except Exception as e:
            with suppress(OSError):
                tmp.unlink()
            why = f"trace of steps {w[0]}-{end - 1} not saved ({type(e).__name__}: {e})"
            host.fail(why)
            self.record(w, "not_saved", {"reason": why})
            return
        self.windows_saved += 1
        self.last_saved_window = (w[0], end)
        rec: dict[str, Any] = {
            "type": "profile",
            "time_ns": time.time_ns(),
            "start_step": w[0],
            "end_step": end,
            "path": str(path.relative_to(host.run_dir)),
        }
        if self._save_until is not None:
            rec["cut_at_step"] = host.step  # its ProfilerStep#N in the trace is partial
        host.write(rec)

    def _move_aside(self, path: Path) -> None:
        """Move the rank's previous trace aside: the analysis never sees two of one rank."""
        prev = rundir.previous_traces_dir(self.host.run_dir)
        prev.mkdir(parents=True, exist_ok=True)
        lw = self.last_saved_window
        tag = f"steps-{lw[0]}-{lw[1]}" if lw else f"old-{time.time_ns()}"
        os.replace(path, prev / f"rank-{self.host.rank}.{tag}.pt.trace.json.gz")

    def record(self, w: tuple[int, int], status: str, info: Mapping[str, Any]) -> None:
        """Write a ``window`` record: what became of window ``w``."""
        self.host.write(
            {
                "type": "window",
                "time_ns": time.time_ns(),
                "step": self.host.step,
                "window": [w[0], w[1]],
                "status": status,
                **info,
            }
        )

    def request(self, rid: str, n: int) -> None:
        """An on-demand request (control file): profile the next ``n`` steps."""
        if self.prof is not None:
            self.host.record_error("gpudiag", f"profile request {rid} ignored: a window is active")
            return
        step = self.host.step
        self.window = (step + 1, step + 1 + n)

    def at_exit(self, enabled: bool, header_written: bool) -> None:
        """The job ends: save a partly recorded window, or say the window was not reached."""
        step = self.host.step
        if self.prof is not None:
            w = self.prof_window or (step, step)
            if step > w[0]:  # complete steps were recorded: keep them
                self.close(save=True, status="cut_by_exit", why="the job ended in the window")
            else:
                why = f"the job ended after {step} steps, before a complete window step"
                self.close(save=False, status="not_reached", why=why)
        elif self.window is not None and header_written:
            w = self.window
            if enabled:
                why = f"the job ended after {step} steps"
                self.record(w, "not_reached", {"reason": why})
            else:
                why = "gpudiag's instrumentation was disabled by an error before the window"
                self.record(w, "failed", {"reason": why})

    # -- the job's own profiler ----------------------------------------------------

    def _torch_profiler_enabled(self) -> bool:
        try:
            ap = self.host.torch.autograd.profiler
            if getattr(ap, "_is_profiler_enabled", False):
                return True
            fn = getattr(self.host.torch.autograd, "_profiler_enabled", None)
            return bool(fn()) if fn is not None else False
        except Exception:
            return False

    def _job_profiler_busy(self, w: tuple[int, int]) -> dict[str, Any] | None:
        """Why gpudiag must not open window ``w`` now (the job profiles), or None."""
        if self.job_sessions:
            s = next(iter(self.job_sessions.values()))
            since = "from step 0" if s["step"] == 0 else f"since step {s['step']}"
            return {
                "reason": f"the job's own {s['api']} records {since}",
                "job_api": s["api"],
                "job_since_step": s["step"],
            }
        if self._torch_profiler_enabled():
            return {"reason": "a profiler session that gpudiag did not see start is active"}
        if self._job_schedule_records(w):
            return {
                "reason": "the job's own torch.profiler.profile schedule records during "
                "gpudiag's window",
                "job_api": "torch.profiler.profile",
            }
        return None

    def _job_schedule_records(self, w: tuple[int, int]) -> bool:
        from torch.profiler import ProfilerAction

        for ref in list(self.job_schedules.values()):
            p = ref()
            sched = getattr(p, "schedule", None)
            if p is None or sched is None:
                continue
            try:
                n = int(p.step_num)
                ahead = [sched(n + k) for k in range(w[1] - w[0] + 2)]
            except Exception:  # a schedule that cannot be asked: the cut handles it
                continue
            if any(a != ProfilerAction.NONE for a in ahead):
                return True
        return False

    def on_job_profiler_start(self, obj: Any, api: str) -> None:
        """A job profiler session is about to start: close gpudiag's first, then note it."""
        key = id(obj)
        if key in self.job_sessions:
            return
        step = self.host.step
        self.job_sessions[key] = {"api": api, "step": step, "time_ns": time.time_ns()}
        self.job_in_step = True
        self.host.write(
            {
                "type": "job_profiler",
                "event": "start",
                "api": api,
                "step": step,
                "time_ns": time.time_ns(),
            }
        )
        if self.prof is not None:
            self.close(save=True, status="cut", why=f"the job started its own profiler ({api})")

    def on_job_profiler_stop(self, obj: Any) -> None:
        """A job profiler session ended."""
        s = self.job_sessions.pop(id(obj), None)
        if s is not None:
            self.host.write(
                {
                    "type": "job_profiler",
                    "event": "stop",
                    "api": s["api"],
                    "step": self.host.step,
                    "time_ns": time.time_ns(),
                }
            )

    def on_job_trace(self, path: Any, api: str) -> None:
        """The job exported a trace to ``path``."""
        p = os.path.abspath(os.fspath(path))
        self.host.write(
            {
                "type": "job_trace",
                "time_ns": time.time_ns(),
                "step": self.host.step,
                "path": p,
                "api": api,
                "exists": os.path.exists(p),
            }
        )
