"""Runs inside each rank: profiler schedule, optimizer step hook, NVTX ranges, the rank's trace.

Installed by :mod:`gpudiag.collect.rank.bootstrap` right after the training job imports torch.
What it measures, per step, always on:

- **step boundaries**: the end of a step is the return of the first optimizer's
  ``step()`` seen in the process (``register_optimizer_step_post_hook``); other
  optimizers' steps in the same iteration are ignored. Step N starts where step N-1
  ended; step 0 starts at the first DataLoader fetch (or at hook installation).
  Jobs that bypass ``torch.optim`` call :func:`step` themselves.
- **data_wait_ns**: wall time the training thread spent inside
  ``DataLoader.__next__`` (``_BaseDataLoaderIter.__next__``).
- **comm_wait_ns**: wall time the calling thread was blocked inside torch.distributed
  collectives called from Python without ``async_op`` plus ``Work.wait()``. With gloo
  those calls block until the collective is done; with NCCL they return once the
  kernel is enqueued, so this is host-blocked time, not GPU communication time.
  DDP's gradient all-reduce runs inside the C++ reducer during ``backward`` and is NOT
  counted. ``null`` while no process group is initialised.
- **backward_ns**: wall time inside ``torch.autograd.backward`` (so ``loss.backward()``).
  Under DDP it includes waiting for the gradient all-reduce, so the rank that arrives
  last at the all-reduce (the straggler) shows the *shortest* backward.
- **cpu_ns**: CPU time of the thread that ends the steps (the training thread) during
  the step, from ``time.thread_time_ns()`` read at each step boundary: the job's own
  work, which a busy host stretches far less than the wall clock (the gate's
  ``cpu_time_regression``). ``null`` for the first step after an ``exec`` (a new image,
  a new thread clock) and when a step ends on another thread than the one before.
- **phases** (``pre_forward_ns``, ``forward_ns``, ``optimizer_ns``; null when the step did
  not show the mark): from the step's start to its first module call (a global module
  forward pre-hook that removes itself when it fires and is registered again at the end
  of the step, so modules run on PyTorch's fast path for the rest of the step) — the
  input and host work before the forward pass, whatever produces the batch; from there to
  the first ``torch.autograd.backward``; and from the lead optimizer's ``step()`` (a global
  optimizer step pre-hook) to the end of the step.

Outside the profiled window a step costs three clock reads, a dict and one ``write``.

**The job is never hurt.** Every wrapper calls the job's function exactly once and
returns its result or raises its exception unchanged; gpudiag's own work around it runs
in try/except, and its first error turns the whole hook into a pass-through (printed
once, written as an ``error`` record). A telemetry write that fails (disk full,
directory gone) drops that record, truncates any half-written line and is counted; the
next successful write says what was lost (a ``lost`` record). Nothing here calls a
collective.

**Coexisting with the job's own profiler.** torch allows one profiler session per
process; a second one breaks the first (empty traces, SIGSEGV at export). The hook wraps
every way a session starts (``torch.profiler``'s ``prepare_trace``/``start_trace``, which
``profile.start``/``__enter__`` and schedules go through, ``torch.autograd.profiler``'s
``profile``, ``emit_nvtx`` and ``emit_itt``, the legacy profiler) and stops: it does not
open its window while a job session is active or the job's ``torch.profiler`` schedule
will record during it, and it closes its own session (saving the complete steps) before
a job session starts inside its window. The job's ``export_chrome_trace`` and
``tensorboard_trace_handler`` outputs are recorded as ``job_trace`` records.

``GPUDIAG_FAULT`` (tests only) injects failures; see
:func:`gpudiag.collect.rank.faults.parse_faults`.

The pieces: :class:`RankHook` here is the step counter that composes the telemetry
writer (:mod:`gpudiag.collect.rank.telemetry`), the profiler window
(:mod:`gpudiag.collect.rank.profwindow`) and the patches (:mod:`gpudiag.collect.rank.patches`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from types import ModuleType
from typing import Any

from gpudiag.collect.rank import patches
from gpudiag.collect.rank.bootstrap import ENV_EXEC_STATE
from gpudiag.collect.rank.faults import Faults
from gpudiag.collect.rank.profwindow import ProfilerWindow
from gpudiag.collect.rank.telemetry import TelemetryWriter, stderr
from gpudiag.rundir import layout as rundir

STEPS_FORMAT = "gpudiag.steps"
STEPS_VERSION = 1
CONTROL_POLL_NS = 500_000_000
COMM_WAIT_MEANING = (
    "host wall time blocked in synchronous torch.distributed collectives called from "
    "Python and in Work.wait(); excludes DDP's C++ reducer"
)

_HOOK: RankHook | None = None


def parse_window(text: str | None) -> tuple[int, int] | None:
    """``"A:B"`` → steps A..B-1 (B exclusive, like a Python slice); ``off``/empty → None."""
    if not text or text.strip().lower() in ("off", "none", "0"):
        return None
    a_s, sep, b_s = text.partition(":")
    if not sep:
        raise ValueError(f"profile window {text!r} is not A:B")
    a, b = int(a_s), int(b_s)
    if a < 1 or b <= a:
        raise ValueError(f"profile window {text!r} needs 1 <= A < B")
    return a, b


class RankHook:
    """Per-rank step counter: the current step and its waits; composes file and profiler."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        local_rank: int,
        world_size: int,
        node_rank: int = 0,
        window: tuple[int, int] | None = (5, 10),
        faults: str | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.node_rank = node_rank
        self.faults = Faults(faults)
        self.pid = os.getpid()
        self.enabled = True
        self.manual = False
        self.step = 0
        self.step_start_ns: int | None = None
        self.installed_ns = time.time_ns()
        self.step_cpu_ns: int | None = time.thread_time_ns()  # thread CPU at the step's start
        self.step_thread = threading.get_ident()
        self.data_wait_ns = 0
        self.data_fetches = 0
        self.comm_wait_ns = 0
        self.comm_depth = 0
        self.backward_ns = 0
        self.backward_depth = 0
        self.forward_at: int | None = None  # the step's first module call (time.time_ns)
        self.backward_at: int | None = None  # its first backward
        self.optimizer_at: int | None = None  # the lead optimizer's step() began
        self.arm_forward: Callable[[], None] | None = None  # registers the pre-hook again
        self.lead_opt: int | None = None
        self.torch: Any = None
        self.nvtx: Any = None
        self.step_range: Any = None
        self.last_poll_ns = 0
        self.control_mtime: int | None = None
        self.control_seen: set[str] = set()
        self.dist_initialized: Callable[[], bool] | None = None
        self.file = TelemetryWriter(run_dir, rank, self.pid, self._header, self._step, self.faults)
        self.profiler = ProfilerWindow(self, window)

    def _step(self) -> int:
        return self.step

    def fault(self, site: str) -> None:
        """Raise the fault injected at ``site`` for the current step, if any (tests)."""
        self.faults.fire(site, self.step)

    # -- records -------------------------------------------------------------------

    def write(self, rec: dict[str, Any]) -> None:
        """Append one telemetry record; a failed write is counted as lost, never raised."""
        self.file.write(rec)

    def _header(self) -> dict[str, Any]:
        torch = self.torch
        gpu_uuid = None
        device = "cpu"
        try:
            if torch is not None and torch.cuda.is_initialized():
                idx = torch.cuda.current_device()
                device = f"cuda:{idx}"
                u = str(torch.cuda.get_device_properties(idx).uuid)
                gpu_uuid = u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"
        except Exception:  # a broken CUDA setup must not stop the header
            gpu_uuid = None
        w = self.profiler.first_window
        return {
            "type": "header",
            "format": STEPS_FORMAT,
            "version": STEPS_VERSION,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node_rank": self.node_rank,
            "host": socket.gethostname(),
            "pid": self.pid,
            "gpu_uuid": gpu_uuid,
            "device": device,
            "clock": "time.time_ns",
            "torch_version": getattr(torch, "__version__", None),
            "installed_ns": self.installed_ns,
            "profile_steps": f"{w[0]}:{w[1]}" if w else None,
            "comm_wait": COMM_WAIT_MEANING,
        }

    def record_error(self, where: str, message: str) -> None:
        """Append an error record (the job's or the hook's own); never raises."""
        with suppress(Exception):
            self.write(
                {"type": "error", "where": where, "time_ns": time.time_ns(), "message": message}
            )

    def fail(self, message: str) -> None:
        """A gpudiag failure that leaves the hook running: stderr once, and an error record."""
        stderr(f"gpudiag: rank {self.rank}: {message}; the job continues")
        self.record_error("gpudiag", message)

    def disable(self, exc: BaseException) -> None:
        """Turn every hook into a pass-through after the first failure, saying so once."""
        if not self.enabled:
            return
        self.enabled = False
        with suppress(Exception):
            msg = f"{type(exc).__name__}: {exc}"
            stderr(
                f"gpudiag: rank {self.rank} instrumentation disabled after an error ({msg}); "
                "the job continues"
            )
            self.record_error("gpudiag", msg)
            why = f"gpudiag's instrumentation failed ({msg})"
            self.profiler.close(save=False, status="failed", why=why)

    # -- steps ---------------------------------------------------------------------

    def on_optimizer_step(self, opt: Any, _args: Any, _kwargs: Any) -> None:
        """``register_optimizer_step_post_hook`` callback."""
        if not self.enabled or self.manual:
            return
        try:
            if os.getpid() != self.pid:  # a forked child inherited the patched torch
                self.enabled = False
                return
            if self.lead_opt is None:
                self.lead_opt = id(opt)
            elif id(opt) != self.lead_opt:
                return
            self.end_step()
        except Exception as e:
            self.disable(e)

    def on_forward_pre(self, _module: Any, _args: Any) -> None:
        """The global module forward pre-hook: the step's first module call (then removed)."""
        if self.forward_at is None and self.enabled and os.getpid() == self.pid:
            self.forward_at = time.time_ns()

    def on_optimizer_pre(self, opt: Any, _args: Any, _kwargs: Any) -> None:
        """``register_optimizer_step_pre_hook`` callback: the lead optimizer's step begins."""
        if not self.enabled or self.optimizer_at is not None:
            return
        if self.lead_opt is None or id(opt) == self.lead_opt:
            self.optimizer_at = time.time_ns()

    def _phases(self, start: int, end: int) -> dict[str, int | None]:
        """The step's phases (ns): before the forward pass, forward, optimizer; None: unseen."""
        fwd, bwd, opt = self.forward_at, self.backward_at, self.optimizer_at
        fwd = fwd if fwd is not None and start <= fwd <= end else None
        bwd = bwd if bwd is not None and fwd is not None and fwd <= bwd <= end else None
        opt = opt if opt is not None and start <= opt <= end else None
        return {
            "pre_forward_ns": fwd - start if fwd is not None else None,
            "forward_ns": bwd - fwd if bwd is not None and fwd is not None else None,
            "optimizer_ns": end - opt if opt is not None else None,
        }

    def end_step(self) -> None:
        """Close the current step: write its record, advance the profiler, poll control."""
        if self.faults:
            self.fault("hook:step")
        now = time.time_ns()
        cpu_now = time.thread_time_ns()
        thread = threading.get_ident()
        cpu_start, self.step_cpu_ns = self.step_cpu_ns, cpu_now
        same = thread == self.step_thread
        self.step_thread = thread
        start = self.step_start_ns if self.step_start_ns is not None else self.installed_ns
        dist_on = self.dist_initialized is not None and self.dist_initialized()
        prof = self.profiler
        self.write(
            {
                "type": "step",
                "step": self.step,
                "start_ns": start,
                "end_ns": now,
                "data_wait_ns": self.data_wait_ns,
                "comm_wait_ns": self.comm_wait_ns if dist_on else None,
                "data_fetches": self.data_fetches,
                "backward_ns": self.backward_ns,
                "cpu_ns": cpu_now - cpu_start if cpu_start is not None and same else None,
                **self._phases(start, now),
                "profiled": prof.recording(self.step),
                "job_profiler": prof.job_in_step or bool(prof.job_sessions),
            }
        )
        if self.nvtx is not None:
            if self.step_range is not None:
                self.nvtx.end_range(self.step_range)
            self.step_range = self.nvtx.start_range(f"gpudiag.step#{self.step + 1}")
        self.step += 1
        self.step_start_ns = now
        self.data_wait_ns = self.comm_wait_ns = self.data_fetches = self.backward_ns = 0
        if self.forward_at is not None and self.arm_forward is not None:
            self.arm_forward()  # it removed itself when it fired
        self.forward_at = self.backward_at = self.optimizer_at = None
        prof.job_in_step = False
        self._poll_control()
        prof.tick()

    def add_data_wait(self, ns: int) -> None:
        """Account one DataLoader fetch to the current step."""
        self.data_wait_ns += ns
        self.data_fetches += 1

    def _poll_control(self) -> None:
        now = time.perf_counter_ns()
        if now - self.last_poll_ns < CONTROL_POLL_NS:
            return
        self.last_poll_ns = now
        path = rundir.control_path(self.run_dir)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == self.control_mtime:
            return
        self.control_mtime = mtime
        try:
            req = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # being written; the next poll reads it
        rid = str(req.get("id", mtime))
        n = int(req.get("profile_next", 0))
        if rid in self.control_seen or n <= 0:
            return
        self.control_seen.add(rid)
        self.profiler.request(rid, n)

    # -- processes -----------------------------------------------------------------

    def after_fork_in_child(self) -> None:
        """A forked child (DataLoader worker, ``os.fork``) is not this rank: go quiet."""
        if os.getpid() == self.pid:
            return
        self.enabled = False
        self.profiler.prof = None  # the parent's session; the child must not stop or export it
        self.file.close()

    def before_exec(self, path: Any, args: Any, env: Mapping[Any, Any] | None) -> Any:
        """The rank replaces its image: close the window and the file, hand the state on.

        Returns the environment for ``execve`` (``None`` for ``execv``, whose image
        inherits ``os.environ``). A Python image that imports torch continues this rank's
        telemetry file (no new header) from the same step; see bootstrap.
        """
        if os.getpid() != self.pid or not self.enabled:
            return env
        try:
            if self.faults:
                self.fault("hook:exec")
            if self.profiler.prof is not None:
                self.profiler.close(save=True, status="cut", why=f"the job exec'd {path}")
            argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in list(args)[:16]]
            if self.file.header_written:
                self.write(
                    {
                        "type": "exec",
                        "time_ns": time.time_ns(),
                        "step": self.step,
                        "path": os.fsdecode(path) if isinstance(path, bytes) else str(path),
                        "argv": argv,
                    }
                )
            self.file.close()
            state = json.dumps(self._exec_state())
            if env is None:
                os.environ[ENV_EXEC_STATE] = state
                return None
            out = dict(env)
            out[ENV_EXEC_STATE] = state
            return out
        except Exception as e:
            self.disable(e)
            return env

    def _exec_state(self) -> dict[str, Any]:
        w, fw = self.profiler.window, self.profiler.first_window
        return {
            "pid": self.pid,
            "step": self.step,
            "step_start_ns": self.step_start_ns,
            "window": [w[0], w[1]] if w else None,
            "first_window": list(fw) if fw else None,
            "header_written": self.file.header_written,
        }

    def continue_after_exec(self, state: Mapping[str, Any]) -> None:
        """This image was exec'd by an instrumented rank: carry on its step count and file."""
        self.step = int(state.get("step") or 0)
        self.step_start_ns = state.get("step_start_ns")
        self.step_cpu_ns = None  # the thread clock of the image before is gone
        self.file.header_written = bool(state.get("header_written"))
        w, fw = state.get("window"), state.get("first_window")
        self.profiler.window = (int(w[0]), int(w[1])) if w else None
        self.profiler.first_window = (int(fw[0]), int(fw[1])) if fw else None

    # -- shutdown ------------------------------------------------------------------

    def at_exit(self) -> None:
        """Save a partly recorded window, say whether the window was reached, close the file."""
        if os.getpid() != self.pid:
            return
        try:
            if self.faults:
                self.fault("hook:exit")
            self.profiler.at_exit(self.enabled, self.file.header_written)
        except Exception as e:
            with suppress(Exception):
                self.fail(f"at exit: {type(e).__name__}: {e}")
        with suppress(Exception):
            if self.file.header_written:
                self.write({"type": "exit", "time_ns": time.time_ns(), "steps": self.step})
        self.file.close()


def install(torch: ModuleType, hook: RankHook) -> None:
    """Register the optimizer hook and patch DataLoader, collectives and profilers."""
    global _HOOK
    try:
        patches.install_all(torch, hook)
    except BaseException:
        hook.enabled = False  # whatever got patched before the failure passes through
        raise
    _HOOK = hook


def step() -> None:
    """Mark the end of a training step, for loops that do not call ``torch.optim`` steps.

    Once called, optimizer steps no longer advance gpudiag's step counter.
    """
    hook = _HOOK
    if hook is None or not hook.enabled:
        return
    try:
        hook.manual = True
        hook.end_step()
    except Exception as e:
        hook.disable(e)
