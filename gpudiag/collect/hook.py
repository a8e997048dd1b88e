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

Outside the profiled window a step costs two clock reads, a dict and one buffered,
flushed ``write``. Every hook runs in try/except and disables the whole hook on its
first error; nothing here calls a collective.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from gpudiag import rundir

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
    """Per-rank state: the current step, its waits, the telemetry file and the profiler."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        local_rank: int,
        world_size: int,
        node_rank: int = 0,
        window: tuple[int, int] | None = (5, 10),
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.node_rank = node_rank
        self.window = window
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
        self._file: IO[str] | None = None
        self._dist_initialized: Callable[[], bool] | None = None

    # -- file ----------------------------------------------------------------------

    def _write(self, rec: dict[str, Any]) -> None:
        if self._file is None:
            path = rundir.steps_path(self.run_dir, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            self._file.write(json.dumps(self._header(), separators=(",", ":")) + "\n")
        self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._file.flush()

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
            "profile_steps": f"{self.window[0]}:{self.window[1]}" if self.window else None,
            "comm_wait": COMM_WAIT_MEANING,
        }

    def record_error(self, where: str, message: str) -> None:
        """Append an error record (the job's or the hook's own); never raises."""
        with contextlib.suppress(Exception):
            self._write(
                {"type": "error", "where": where, "time_ns": time.time_ns(), "message": message}
            )

    def disable(self, exc: BaseException) -> None:
        """Turn every hook into a pass-through after the first failure, saying so once."""
        if not self.enabled:
            return
        self.enabled = False
        msg = f"{type(exc).__name__}: {exc}"
        print(
            f"gpudiag: rank {self.rank} instrumentation disabled after an error ({msg}); "
            "the job continues",
            file=sys.stderr,
        )
        self.record_error("gpudiag", msg)

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
            }
        )
        if self.nvtx is not None:
            if self.step_range is not None:
                self.nvtx.end_range(self.step_range)
            self.step_range = self.nvtx.start_range(f"gpudiag.step#{self.step + 1}")
        self.step += 1
        self.step_start_ns = now
        self.data_wait_ns = self.comm_wait_ns = self.data_fetches = self.backward_ns = 0
        self._poll_control()
        self._profiler_tick()

    def add_data_wait(self, ns: int) -> None:
        """Account one DataLoader fetch to the current step."""
        self.data_wait_ns += ns
        self.data_fetches += 1

    # -- profiler ------------------------------------------------------------------

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
            self.prof.step()
            assert self.prof_window is not None
            if s >= self.prof_window[1]:
                prof, self.prof = self.prof, None
                prof.stop()
                self._cuda_profiler(False)
            return
        w = self.window
        if w is not None and w[0] - 1 <= s < w[1]:
            self.window = None  # a window runs once
            self._start_profiler(w)

    def _start_profiler(self, w: tuple[int, int]) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        self.prof_window = w
        prof = profile(activities=acts, schedule=self._action, on_trace_ready=self._save)
        prof.step_num = self.step  # so ProfilerStep#N carries gpudiag's step number
        prof.start()
        self.prof = prof
        self._cuda_profiler(True)

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
        path = rundir.trace_path(self.run_dir, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{self.pid}.tmp.json.gz")
        prof.export_chrome_trace(str(tmp))  # one writer per window; .gz makes torch gzip it
        if path.exists():
            # On-demand windows replace the rank's trace; the older one moves aside so the
            # analysis never sees two traces of one rank.
            prev = rundir.previous_traces_dir(self.run_dir)
            prev.mkdir(parents=True, exist_ok=True)
            lw = self.last_saved_window
            tag = f"steps-{lw[0]}-{lw[1]}" if lw else f"old-{time.time_ns()}"
            os.replace(path, prev / f"rank-{self.rank}.{tag}.pt.trace.json.gz")
        os.replace(tmp, path)
        self.windows_saved += 1
        w = self.prof_window or (self.step, self.step)
        self.last_saved_window = (w[0], min(w[1], self.step + 1))
        self._write(
            {
                "type": "profile",
                "time_ns": time.time_ns(),
                "start_step": self.last_saved_window[0],
                "end_step": self.last_saved_window[1],
                "path": str(path.relative_to(self.run_dir)),
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
        except FileNotFoundError:
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

    # -- shutdown ------------------------------------------------------------------

    def at_exit(self) -> None:
        """Save a partly recorded window and close the file."""
        try:
            if self.prof is not None and self.enabled:
                prof, self.prof = self.prof, None
                prof.stop()  # RECORD → stop saves what was recorded through on_trace_ready
                self._cuda_profiler(False)
            if self._file is not None:
                self._write({"type": "exit", "time_ns": time.time_ns(), "steps": self.step})
                self._file.close()
                self._file = None
        except Exception as e:
            print(f"gpudiag: rank {self.rank}: at exit: {e}", file=sys.stderr)


# -- installation into torch -----------------------------------------------------------


def _wrap_data(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __next__(it: Any) -> Any:
        if not hook.enabled:
            return orig(it)
        if hook.step_start_ns is None:
            hook.step_start_ns = time.time_ns()
        rng = hook.nvtx.start_range("gpudiag.data") if hook.nvtx is not None else None
        t0 = time.perf_counter_ns()
        try:
            return orig(it)
        finally:
            hook.add_data_wait(time.perf_counter_ns() - t0)
            if rng is not None:
                hook.nvtx.end_range(rng)

    return __next__


def _wrap_comm(hook: RankHook, orig: Callable[..., Any], is_wait: bool) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hook.enabled or hook.comm_depth or (not is_wait and kwargs.get("async_op")):
            return orig(*args, **kwargs)
        hook.comm_depth += 1
        rng = hook.nvtx.start_range("gpudiag.comm") if hook.nvtx is not None else None
        t0 = time.perf_counter_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            hook.comm_wait_ns += time.perf_counter_ns() - t0
            hook.comm_depth -= 1
            if rng is not None:
                hook.nvtx.end_range(rng)

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
            hook.backward_ns += time.perf_counter_ns() - t0
            hook.backward_depth -= 1

    return backward


def install(torch: ModuleType, hook: RankHook) -> None:
    """Register the optimizer hook and patch DataLoader and collectives (each optional)."""
    global _HOOK
    hook.torch = torch
    _HOOK = hook
    if os.environ.get("GPUDIAG_NVTX", "1") != "0":
        try:
            import nvtx

            hook.nvtx = nvtx
        except Exception:
            hook.nvtx = None
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
