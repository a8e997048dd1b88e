"""Runs inside each rank: profiler schedule, optimizer step hook, NVTX ranges, the rank's trace.

Installed by :mod:`gpudiag.collect.bootstrap` right after the training job imports torch.
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

Outside the profiled window a step costs two clock reads, a dict and one ``write``.

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

``GPUDIAG_FAULT`` (tests only) injects failures; see :func:`parse_faults`.
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

from gpudiag import rundir
from gpudiag.collect.bootstrap import ENV_EXEC_STATE

STEPS_FORMAT = "gpudiag.steps"
STEPS_VERSION = 1
CONTROL_POLL_NS = 500_000_000
COMM_WAIT_MEANING = (
    "host wall time blocked in synchronous torch.distributed collectives called from "
    "Python and in Work.wait(); excludes DDP's C++ reducer"
)
_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
)
FAULT_SITES = (
    "hook:install",
    "hook:data",
    "hook:backward",
    "hook:comm",
    "hook:step",
    "hook:profiler",
    "hook:save",
    "hook:job_profiler",
    "hook:exec",
    "hook:exit",
    "write:enospc",
)

_HOOK: RankHook | None = None


class InjectedFault(RuntimeError):
    """A failure injected through ``GPUDIAG_FAULT`` (tests only)."""


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


def parse_faults(text: str | None) -> dict[str, tuple[int, int | None]]:
    """``GPUDIAG_FAULT`` → {site: (first step, last step or None)}; other prefixes ignored.

    The value is a comma-separated list of ``SITE[@A[-B]]``: ``hook:data`` fails at every
    step, ``hook:step@3`` at step 3 only, ``write:enospc@3-5`` during steps 3..5 and
    ``hook:comm@4-`` from step 4 on. Sites are :data:`FAULT_SITES`; ``hook:*`` raise
    :class:`InjectedFault` inside gpudiag's part of that hook, ``write:enospc`` makes
    telemetry writes stop half-way with ``ENOSPC``. Entries for other components
    (``nvml:``, ``conditions:``) are read by them.
    """
    out: dict[str, tuple[int, int | None]] = {}
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item.startswith(("hook:", "write:")):
            continue
        site, _, span = item.partition("@")
        if site not in FAULT_SITES:
            raise ValueError(f"GPUDIAG_FAULT: unknown site {site!r} (known: {FAULT_SITES})")
        lo, hi = 0, None
        if span:
            a, dash, b = span.partition("-")
            lo = int(a)
            hi = (int(b) if b else None) if dash else lo
        out[site] = (lo, hi)
    return out


class RankHook:
    """Per-rank state: the current step, its waits, the telemetry file and the profiler."""

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
        self.window = window
        self.first_window = window
        self.faults = parse_faults(faults)
        self.pid = os.getpid()
        self.enabled = True
        self.manual = False
        self.step = 0
        self.step_start_ns: int | None = None
        self.installed_ns = time.time_ns()
        self.data_wait_ns = 0
        self.data_fetches = 0
        self.comm_wait_ns = 0
        self.comm_depth = 0
        self.backward_ns = 0
        self.backward_depth = 0
        self.lead_opt: int | None = None
        self.torch: Any = None
        self.nvtx: Any = None
        self.step_range: Any = None
        self.prof: Any = None
        self.prof_window: tuple[int, int] | None = None
        self.windows_saved = 0
        self.last_saved_window: tuple[int, int] | None = None
        self.last_poll_ns = 0
        self.control_mtime: int | None = None
        self.control_seen: set[str] = set()
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
        # telemetry file: raw O_APPEND fd, size after the last complete record
        self._fd: int | None = None
        self._size = 0
        self._header_written = False
        self._lost: dict[str, Any] | None = None
        self._lost_logged = False
        self._dist_initialized: Callable[[], bool] | None = None

    # -- faults (tests) ------------------------------------------------------------

    def _fault_on(self, site: str) -> bool:
        span = self.faults.get(site)
        if span is None:
            return False
        lo, hi = span
        return self.step >= lo and (hi is None or self.step <= hi)

    def _fault(self, site: str) -> None:
        if self._fault_on(site):
            raise InjectedFault(f"{site} at step {self.step} (GPUDIAG_FAULT)")

    # -- file ----------------------------------------------------------------------

    def _open(self) -> int:
        path = rundir.steps_path(self.run_dir, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._fd = fd
        self._size = os.fstat(fd).st_size
        if not self._header_written:
            self._append(fd, _line(self._header()))
            self._header_written = True
        return fd

    def _append(self, fd: int, data: bytes) -> None:
        """One ``write`` per record; a failed or short write is undone, never left half."""
        try:
            if self.faults and self._fault_on("write:enospc"):
                os.write(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device (GPUDIAG_FAULT)")
            n = os.write(fd, data)
            if n != len(data):
                raise OSError(errno.ENOSPC, f"short write ({n} of {len(data)} bytes)")
        except OSError:
            with suppress(OSError):
                os.ftruncate(fd, self._size)
            raise
        self._size += n

    def _write(self, rec: dict[str, Any]) -> None:
        """Append one record; when it cannot be written it is counted as lost, never raised."""
        if os.getpid() != self.pid:
            return
        try:
            fd = self._fd if self._fd is not None else self._open()
            if self._lost is not None:
                self._append(fd, _line(self._lost))
                self._lost = None
            self._append(fd, _line(rec))
        except OSError as e:
            self._note_lost(rec, e)

    def _note_lost(self, rec: dict[str, Any], e: OSError) -> None:
        step = rec.get("step", self.step)
        if self._lost is None:
            self._lost = {
                "type": "lost",
                "time_ns": time.time_ns(),
                "records": 0,
                "first_step": step,
                "last_step": step,
                "message": f"{type(e).__name__}: {e}",
            }
        self._lost["records"] += 1
        self._lost["last_step"] = step
        if not self._lost_logged:
            self._lost_logged = True
            _stderr(
                f"gpudiag: rank {self.rank}: telemetry write failed ({type(e).__name__}: {e}); "
                "records are dropped until writes succeed again; the job continues"
            )

    def _close_file(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)

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
        w = self.first_window
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
            self._write(
                {"type": "error", "where": where, "time_ns": time.time_ns(), "message": message}
            )

    def _fail(self, message: str) -> None:
        """A gpudiag failure that leaves the hook running: stderr once, and an error record."""
        _stderr(f"gpudiag: rank {self.rank}: {message}; the job continues")
        self.record_error("gpudiag", message)

    def disable(self, exc: BaseException) -> None:
        """Turn every hook into a pass-through after the first failure, saying so once."""
        if not self.enabled:
            return
        self.enabled = False
        with suppress(Exception):
            msg = f"{type(exc).__name__}: {exc}"
            _stderr(
                f"gpudiag: rank {self.rank} instrumentation disabled after an error ({msg}); "
                "the job continues"
            )
            self.record_error("gpudiag", msg)
            why = f"gpudiag's instrumentation failed ({msg})"
            self._close_own_profiler(save=False, status="failed", why=why)

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

    def end_step(self) -> None:
        """Close the current step: write its record, advance the profiler, poll control."""
        if self.faults:
            self._fault("hook:step")
        now = time.time_ns()
        start = self.step_start_ns if self.step_start_ns is not None else self.installed_ns
        dist_on = self._dist_initialized is not None and self._dist_initialized()
        w = self.prof_window
        self._write(
            {
                "type": "step",
                "step": self.step,
                "start_ns": start,
                "end_ns": now,
                "data_wait_ns": self.data_wait_ns,
                "comm_wait_ns": self.comm_wait_ns if dist_on else None,
                "data_fetches": self.data_fetches,
                "backward_ns": self.backward_ns,
                "profiled": self.prof is not None and w is not None and w[0] <= self.step < w[1],
                "job_profiler": self.job_in_step or bool(self.job_sessions),
            }
        )
        if self.nvtx is not None:
            if self.step_range is not None:
                self.nvtx.end_range(self.step_range)
            self.step_range = self.nvtx.start_range(f"gpudiag.step#{self.step + 1}")
        self.step += 1
        self.step_start_ns = now
        self.data_wait_ns = self.comm_wait_ns = self.data_fetches = self.backward_ns = 0
        self.job_in_step = False
        self._poll_control()
        self._profiler_tick()

    def add_data_wait(self, ns: int) -> None:
        """Account one DataLoader fetch to the current step."""
        self.data_wait_ns += ns
        self.data_fetches += 1

    # -- gpudiag's profiler --------------------------------------------------------

    @contextmanager
    def _own(self) -> Iterator[None]:
        """Mark calls into gpudiag's own profiler, so the job-profiler guards ignore them."""
        self.own_depth += 1
        try:
            yield
        finally:
            self.own_depth -= 1

    def _action(self, _profiler_step: int) -> Any:
        from torch.profiler import ProfilerAction

        s, w = self.step, self.prof_window
        if w is None or s < w[0] - 1 or s >= w[1]:
            return ProfilerAction.NONE
        if s == w[0] - 1:
            return ProfilerAction.WARMUP
        if s == w[1] - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.RECORD

    def _profiler_tick(self) -> None:
        s = self.step  # the step about to start
        if self.prof is not None:
            assert self.prof_window is not None
            with self._own():
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
                self._window_record(w, "stood_down", busy)
                return
            self._start_profiler(w)

    def _start_profiler(self, w: tuple[int, int]) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        self.prof_window = w
        prof = profile(activities=acts, schedule=self._action, on_trace_ready=self._save)
        prof.step_num = self.step  # so ProfilerStep#N carries gpudiag's step number
        with self._own():
            prof.start()
        self.prof = prof
        self._cuda_profiler(True)
        if self.faults:
            self._fault("hook:profiler")

    def _close_own_profiler(self, save: bool, status: str, why: str) -> None:
        """Stop gpudiag's session now; with ``save`` keep its complete steps if there are any."""
        prof, self.prof = self.prof, None
        if prof is None:
            return
        w = self.prof_window or (self.step, self.step)
        usable = save and self.step > w[0]
        before = self.windows_saved
        self._skip_save, self._save_until = not usable, self.step
        try:
            with self._own():
                prof.stop()  # RECORD: stop_trace, then on_trace_ready (_save); WARMUP: no save
        except Exception as e:
            self.record_error("gpudiag", f"stopping gpudiag's profiler: {type(e).__name__}: {e}")
        finally:
            self._skip_save, self._save_until = False, None
            self._cuda_profiler(False)
        kept = [w[0], self.step] if self.windows_saved > before else None
        self._window_record(w, status, {"reason": why, "kept": kept})

    def _cuda_profiler(self, on: bool) -> None:
        """Open/close `nsys profile --capture-range=cudaProfilerApi` around the window."""
        if os.environ.get("GPUDIAG_NSYS_RANGE") != "window":
            return
        try:
            if self.torch.cuda.is_available():
                (self.torch.cuda.profiler.start if on else self.torch.cuda.profiler.stop)()
        except Exception as e:  # the profiler API must never break the job
            self.record_error("gpudiag", f"cudaProfiler{'Start' if on else 'Stop'}: {e}")

    def _save(self, prof: Any) -> None:
        """``on_trace_ready``: export the window; a failure loses the trace, not the job."""
        if self._skip_save:
            return
        w = self.prof_window or (self.step, self.step)
        end = min(w[1], self.step + 1) if self._save_until is None else self._save_until
        path = rundir.trace_path(self.run_dir, self.rank)
        tmp = path.with_name(f".{path.name}.{self.pid}.tmp.json.gz")
        try:
            if self.faults:
                self._fault("hook:save")
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(tmp))  # one writer per window; .gz makes torch gzip it
            if path.exists():
                # On-demand windows replace the rank's trace; the older one moves aside so
                # the analysis never sees two traces of one rank.
                prev = rundir.previous_traces_dir(self.run_dir)
                prev.mkdir(parents=True, exist_ok=True)
                lw = self.last_saved_window
                tag = f"steps-{lw[0]}-{lw[1]}" if lw else f"old-{time.time_ns()}"
                os.replace(path, prev / f"rank-{self.rank}.{tag}.pt.trace.json.gz")
            os.replace(tmp, path)
        except Exception as e:
            with suppress(OSError):
                tmp.unlink()
            why = f"trace of steps {w[0]}-{end - 1} not saved ({type(e).__name__}: {e})"
            self._fail(why)
            self._window_record(w, "not_saved", {"reason": why})
            return
        self.windows_saved += 1
        self.last_saved_window = (w[0], end)
        rec: dict[str, Any] = {
            "type": "profile",
            "time_ns": time.time_ns(),
            "start_step": w[0],
            "end_step": end,
            "path": str(path.relative_to(self.run_dir)),
        }
        if self._save_until is not None:
            rec["cut_at_step"] = self.step  # its ProfilerStep#N in the trace is partial
        self._write(rec)

    def _window_record(self, w: tuple[int, int], status: str, info: Mapping[str, Any]) -> None:
        self._write(
            {
                "type": "window",
                "time_ns": time.time_ns(),
                "step": self.step,
                "window": [w[0], w[1]],
                "status": status,
                **info,
            }
        )

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
        if self.prof is not None:
            self.record_error("gpudiag", f"profile request {rid} ignored: a window is active")
            return
        self.window = (self.step + 1, self.step + 1 + n)

    # -- the job's own profiler ----------------------------------------------------

    def _torch_profiler_enabled(self) -> bool:
        try:
            ap = self.torch.autograd.profiler
            if getattr(ap, "_is_profiler_enabled", False):
                return True
            fn = getattr(self.torch.autograd, "_profiler_enabled", None)
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
                return {
                    "reason": "the job's own torch.profiler.profile schedule records during "
                    "gpudiag's window",
                    "job_api": "torch.profiler.profile",
                }
        return None

    def on_job_profiler_start(self, obj: Any, api: str) -> None:
        """A job profiler session is about to start: close gpudiag's first, then note it."""
        key = id(obj)
        if key in self.job_sessions:
            return
        self.job_sessions[key] = {"api": api, "step": self.step, "time_ns": time.time_ns()}
        self.job_in_step = True
        self._write(
            {"type": "job_profiler", "event": "start", "api": api, "step": self.step,
             "time_ns": time.time_ns()}
        )  # fmt: skip
        if self.prof is not None:
            self._close_own_profiler(
                save=True, status="cut", why=f"the job started its own profiler ({api})"
            )

    def on_job_profiler_stop(self, obj: Any) -> None:
        """A job profiler session ended."""
        s = self.job_sessions.pop(id(obj), None)
        if s is not None:
            self._write(
                {"type": "job_profiler", "event": "stop", "api": s["api"], "step": self.step,
                 "time_ns": time.time_ns()}
            )  # fmt: skip

    def on_job_trace(self, path: Any, api: str) -> None:
        """The job exported a trace to ``path``."""
        p = os.path.abspath(os.fspath(path))
        self._write(
            {"type": "job_trace", "time_ns": time.time_ns(), "step": self.step, "path": p,
             "api": api, "exists": os.path.exists(p)}
        )  # fmt: skip

    # -- processes -----------------------------------------------------------------

    def after_fork_in_child(self) -> None:
        """A forked child (DataLoader worker, ``os.fork``) is not this rank: go quiet."""
        if os.getpid() == self.pid:
            return
        self.enabled = False
        self.prof = None  # the parent's session; the child must not stop or export it
        self._close_file()

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
                self._fault("hook:exec")
            if self.prof is not None:
                self._close_own_profiler(save=True, status="cut", why=f"the job exec'd {path}")
            argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in list(args)[:16]]
            if self._header_written:
                self._write(
                    {"type": "exec", "time_ns": time.time_ns(), "step": self.step,
                     "path": os.fsdecode(path) if isinstance(path, bytes) else str(path),
                     "argv": argv}
                )  # fmt: skip
            self._close_file()
            w = self.window
            state = json.dumps(
                {
                    "pid": self.pid,
                    "step": self.step,
                    "step_start_ns": self.step_start_ns,
                    "window": [w[0], w[1]] if w else None,
                    "first_window": list(self.first_window) if self.first_window else None,
                    "header_written": self._header_written,
                }
            )
            if env is None:
                os.environ[ENV_EXEC_STATE] = state
                return None
            out = dict(env)
            out[ENV_EXEC_STATE] = state
            return out
        except Exception as e:
            self.disable(e)
            return env

    def continue_after_exec(self, state: Mapping[str, Any]) -> None:
        """This image was exec'd by an instrumented rank: carry on its step count and file."""
        self.step = int(state.get("step") or 0)
        self.step_start_ns = state.get("step_start_ns")
        self._header_written = bool(state.get("header_written"))
        w, fw = state.get("window"), state.get("first_window")
        self.window = (int(w[0]), int(w[1])) if w else None
        self.first_window = (int(fw[0]), int(fw[1])) if fw else None

    # -- shutdown ------------------------------------------------------------------

    def at_exit(self) -> None:
        """Save a partly recorded window, say whether the window was reached, close the file."""
        if os.getpid() != self.pid:
            return
        try:
            if self.faults:
                self._fault("hook:exit")
            if self.prof is not None:
                w = self.prof_window or (self.step, self.step)
                if self.step > w[0]:  # complete steps were recorded: keep them
                    why = "the job ended in the window"
                    self._close_own_profiler(save=True, status="cut_by_exit", why=why)
                else:
                    why = f"the job ended after {self.step} steps, before a complete window step"
                    self._close_own_profiler(save=False, status="not_reached", why=why)
            elif self.window is not None and self._header_written:
                w = self.window
                if self.enabled:
                    why = f"the job ended after {self.step} steps"
                    self._window_record(w, "not_reached", {"reason": why})
                else:
                    why = "gpudiag's instrumentation was disabled by an error before the window"
                    self._window_record(w, "failed", {"reason": why})
        except Exception as e:
            with suppress(Exception):
                self._fail(f"at exit: {type(e).__name__}: {e}")
        with suppress(Exception):
            if self._header_written:
                self._write({"type": "exit", "time_ns": time.time_ns(), "steps": self.step})
        self._close_file()


def _line(rec: Mapping[str, Any]) -> bytes:
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def _stderr(msg: str) -> None:
    with suppress(Exception):
        print(msg, file=sys.stderr, flush=True)


# -- installation into torch -----------------------------------------------------------


def _wrap_data(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __next__(it: Any) -> Any:
        if not hook.enabled:
            return orig(it)
        rng = None
        try:
            if hook.step_start_ns is None:
                hook.step_start_ns = time.time_ns()
            rng = hook.nvtx.start_range("gpudiag.data") if hook.nvtx is not None else None
        except Exception as e:
            hook.disable(e)
        t0 = time.perf_counter_ns()
        try:
            return orig(it)
        finally:
            try:
                hook.add_data_wait(time.perf_counter_ns() - t0)
                if rng is not None:
                    hook.nvtx.end_range(rng)
                if hook.faults:
                    hook._fault("hook:data")
            except Exception as e:
                hook.disable(e)

    return __next__


def _wrap_comm(hook: RankHook, orig: Callable[..., Any], is_wait: bool) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hook.enabled or hook.comm_depth or (not is_wait and kwargs.get("async_op")):
            return orig(*args, **kwargs)
        hook.comm_depth += 1
        rng = None
        try:
            rng = hook.nvtx.start_range("gpudiag.comm") if hook.nvtx is not None else None
        except Exception as e:
            hook.disable(e)
        t0 = time.perf_counter_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            hook.comm_depth -= 1
            try:
                hook.comm_wait_ns += time.perf_counter_ns() - t0
                if rng is not None:
                    hook.nvtx.end_range(rng)
                if hook.faults:
                    hook._fault("hook:comm")
            except Exception as e:
                hook.disable(e)

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_backward(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not hook.enabled or hook.backward_depth:
            return orig(*args, **kwargs)
        hook.backward_depth += 1
        t0 = time.perf_counter_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            hook.backward_depth -= 1
            try:
                hook.backward_ns += time.perf_counter_ns() - t0
                if hook.faults:
                    hook._fault("hook:backward")
            except Exception as e:
                hook.disable(e)

    return backward


def _wrap_session_start(hook: RankHook, orig: Callable[..., Any], api: str) -> Callable[..., Any]:
    """Before a job profiler session starts: gpudiag closes its own, then notes the job's."""

    @functools.wraps(orig)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if hook.enabled and not hook.own_depth and not hook.job_depth:
            try:
                if os.getpid() == hook.pid:
                    if hook.faults:
                        hook._fault("hook:job_profiler")
                    hook.on_job_profiler_start(obj, api)
            except Exception as e:
                hook.disable(e)  # closes gpudiag's session too: the job's can start
        hook.job_depth += 1
        try:
            return orig(obj, *args, **kwargs)
        finally:
            hook.job_depth -= 1

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_session_stop(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        outer = not hook.own_depth and not hook.job_depth
        hook.job_depth += 1
        try:
            return orig(obj, *args, **kwargs)
        finally:
            hook.job_depth -= 1
            if outer and hook.job_sessions:
                try:
                    hook.on_job_profiler_stop(obj)
                except Exception as e:
                    hook.disable(e)

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_schedule(hook: RankHook, orig: Callable[..., Any], start: bool) -> Callable[..., Any]:
    """``torch.profiler.profile.start``/``stop``: which scheduled job profilers are live."""

    @functools.wraps(orig)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if not hook.own_depth:
            try:
                if start:
                    hook.job_schedules[id(obj)] = weakref.ref(obj)
                else:
                    hook.job_schedules.pop(id(obj), None)
            except Exception as e:
                hook.disable(e)
        return orig(obj, *args, **kwargs)

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_export(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``export_chrome_trace`` of the job's profilers: remember where its trace went."""

    @functools.wraps(orig)
    def wrapper(obj: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        outer = not hook.own_depth and not hook.export_depth
        hook.export_depth += 1
        try:
            result = orig(obj, path, *args, **kwargs)
        finally:
            hook.export_depth -= 1
        if outer and hook.enabled:
            try:
                hook.on_job_trace(path, hook.job_export_api or "export_chrome_trace")
            except Exception as e:
                hook.disable(e)
        return result

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_tb_handler(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``tensorboard_trace_handler``: its exports are labelled with the handler's name."""

    @functools.wraps(orig)
    def factory(*args: Any, **kwargs: Any) -> Any:
        handler = orig(*args, **kwargs)

        @functools.wraps(handler)
        def handler_fn(prof: Any) -> Any:
            hook.job_export_api = "tensorboard_trace_handler"
            try:
                return handler(prof)
            finally:
                hook.job_export_api = None

        return handler_fn

    factory.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return factory


def _wrap_exec(hook: RankHook, orig: Callable[..., Any], with_env: bool) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(path: Any, args: Any, *rest: Any) -> Any:
        if with_env and rest:
            rest = (hook.before_exec(path, args, rest[0]), *rest[1:])
        else:
            hook.before_exec(path, args, None)
        try:
            return orig(path, args, *rest)
        except BaseException:
            os.environ.pop(ENV_EXEC_STATE, None)  # still this image: the file reopens on use
            raise

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _patch(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` (a class attribute or module function) by ``make(original)``."""
    orig = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if orig is None or hasattr(orig, "__gpudiag_wrapped__"):
        return
    setattr(owner, name, make(orig))


def install_profiler_guards(torch: ModuleType, hook: RankHook) -> None:
    """Wrap every way a job starts a profiler session or exports its trace."""
    import torch.autograd.profiler as ap
    import torch.profiler as tp
    from torch.profiler import profiler as tpp

    def start(api: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return lambda orig: _wrap_session_start(hook, orig, api)

    def stop(orig: Callable[..., Any]) -> Callable[..., Any]:
        return _wrap_session_stop(hook, orig)

    kineto = tpp._KinetoProfile
    for name in ("prepare_trace", "start_trace"):
        _patch(kineto, name, start("torch.profiler.profile"))
    _patch(kineto, "stop_trace", stop)
    for name in ("_prepare_trace", "_start_trace"):
        _patch(ap.profile, name, start("torch.autograd.profiler.profile"))
    _patch(ap.profile, "__exit__", stop)
    for cls, api in (("emit_nvtx", "emit_nvtx"), ("emit_itt", "emit_itt")):
        c = getattr(ap, cls, None)
        if c is not None:
            _patch(c, "__enter__", start(f"torch.autograd.profiler.{api}"))
            _patch(c, "__exit__", stop)
    with suppress(ImportError):
        import torch.autograd.profiler_legacy as legacy

        _patch(legacy.profile, "_start_trace", start("torch.autograd.profiler_legacy.profile"))
        _patch(legacy.profile, "__exit__", stop)
    _patch(tpp.profile, "start", lambda o: _wrap_schedule(hook, o, True))
    _patch(tpp.profile, "stop", lambda o: _wrap_schedule(hook, o, False))
    _patch(kineto, "export_chrome_trace", lambda o: _wrap_export(hook, o))
    _patch(ap.profile, "export_chrome_trace", lambda o: _wrap_export(hook, o))
    tb = tpp.tensorboard_trace_handler
    wrapped = _wrap_tb_handler(hook, tb)
    for mod in (tp, tpp):
        if getattr(mod, "tensorboard_trace_handler", None) is tb:
            setattr(mod, "tensorboard_trace_handler", wrapped)  # noqa: B010


def install(torch: ModuleType, hook: RankHook) -> None:
    """Register the optimizer hook and patch DataLoader, collectives and profilers."""
    global _HOOK
    try:
        _install(torch, hook)
    except BaseException:
        hook.enabled = False  # whatever got patched before the failure passes through
        raise
    _HOOK = hook


def _install(torch: ModuleType, hook: RankHook) -> None:
    hook.torch = torch
    if hook.faults:
        hook._fault("hook:install")
    if os.environ.get("GPUDIAG_NVTX", "1") != "0":
        try:
            import nvtx

            hook.nvtx = nvtx
        except Exception:
            hook.nvtx = None
    try:
        install_profiler_guards(torch, hook)
    except Exception as e:
        # Without the guards a job that profiles itself could crash: gpudiag does not profile.
        hook.window = None
        hook._fail(f"profiler guards not installed ({type(e).__name__}: {e}); no gpudiag window")
    import torch.optim.optimizer as topt

    topt.register_optimizer_step_post_hook(hook.on_optimizer_step)
    try:
        from torch.utils.data import dataloader

        it_cls = dataloader._BaseDataLoaderIter
        it_cls.__next__ = _wrap_data(hook, it_cls.__next__)  # type: ignore[method-assign]
    except Exception as e:
        hook.record_error("gpudiag", f"DataLoader not instrumented: {e}")
    try:
        import torch.autograd

        torch.autograd.backward = _wrap_backward(hook, torch.autograd.backward)
    except Exception as e:
        hook.record_error("gpudiag", f"backward not instrumented: {e}")
    try:
        _install_comm(torch, hook)
    except Exception as e:
        hook.record_error("gpudiag", f"collectives not instrumented: {e}")
    _patch(os, "execv", lambda o: _wrap_exec(hook, o, with_env=False))
    _patch(os, "execve", lambda o: _wrap_exec(hook, o, with_env=True))
    os.register_at_fork(after_in_child=hook.after_fork_in_child)
    atexit.register(hook.at_exit)
    _chain_excepthook(hook)


def _install_comm(torch: ModuleType, hook: RankHook) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    hook._dist_initialized = dist.is_initialized
    for name in _COLLECTIVES:
        orig = getattr(c10d, name, None)
        if orig is None or hasattr(orig, "__gpudiag_wrapped__"):
            continue
        w = _wrap_comm(hook, orig, is_wait=False)
        setattr(c10d, name, w)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, w)
    work = getattr(torch._C._distributed_c10d, "Work", None)
    if work is not None:
        work.wait = _wrap_comm(hook, work.wait, is_wait=True)


def _chain_excepthook(hook: RankHook) -> None:
    prev = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        with suppress(Exception):
            if os.getpid() == hook.pid:
                hook.record_error("job", f"{tp.__name__}: {value}")
        prev(tp, value, tb)

    sys.excepthook = excepthook


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
