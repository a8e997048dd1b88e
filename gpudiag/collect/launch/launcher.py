"""Builds and supervises the child command, forwards signals, records its exit in the manifest.

The child runs in its own session (``start_new_session=True``), so terminal signals reach
gpudiag only and are forwarded exactly once to the child's process group: SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2. A new session, rather than only a new
process group, keeps a job that reads the terminal from being stopped by SIGTTIN. The
child inherits stdin, stdout and stderr (no pipes, so it can never block on gpudiag).
gpudiag's exit code is the child's (128 + N when it died by signal N); failures of the
capture are logged once to stderr and listed in ``manifest.diagnosis_incomplete``.

Nothing the launcher does can stop the job: the samplers (NVML, run conditions) are
threads of this process, every file the job needs is its own, and a ``gpudiag`` killed
outright (SIGKILL) leaves the job running in its session, with the manifest written at
launch (``ended_ns`` null, ``extra.child_pid`` set) and every telemetry line whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import gpudiag
from gpudiag.collect.launch import nsys as nsys_capture
from gpudiag.collect.launch import outcome, watchdog
from gpudiag.collect.launch.captures import (
    collect_nsys,
    finish_conditions,
    start_conditions,
    start_nvml,
    start_watchers,
    stop_watchers,
)
from gpudiag.collect.launch.log import log
from gpudiag.collect.launch.progress import Progress, StepsTail
from gpudiag.collect.launch.run_manifest import finish_manifest
from gpudiag.collect.launch.run_setup import (
    RunOptions,
    RunResult,
    child_env,
    layout,
    python_flags_problem,
)
from gpudiag.collect.samplers.nvml import NvmlSampler
from gpudiag.rundir import layout as rundir

FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


class Forwarding:
    """The job-control signals gpudiag received, forwarded to the job's process group.

    A signal that arrives before the job exists (its start takes a moment on a loaded host)
    is kept and forwarded as soon as :meth:`attach` names the job: a Ctrl-C at any moment
    of the run reaches the job, which runs in a session of its own.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._pid: int | None = None

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        """The signal handler: remember the signal, forward it when the job exists."""
        self.received.append(signum)
        if self._pid is not None:
            _send(self._pid, signum)

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        """The job has started: forward what came before, and everything from now on."""
        self._pid = child.pid
        for signum in list(self.received):
            _send(child.pid, signum)


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


@contextlib.contextmanager
def forward_signals() -> Iterator[Forwarding]:
    """Catch the job-control signals while the block runs (:class:`Forwarding`)."""
    fw = Forwarding()
    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in FORWARDED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                old[sig] = signal.signal(sig, fw.handler)
    try:
        yield fw
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def exit_status(returncode: int) -> int:
    """The shell convention: the code itself, or 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run(
    opts: RunOptions,
    progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 1.0,
) -> RunResult:
    """Launch the command, capture while it runs, write the manifest; never raises after launch."""
    env0 = dict(os.environ)
    # --nsys without nsys fails before anything is created or launched
    nsys_bin, nsys_ver = nsys_capture.resolve() if opts.nsys else ("", "")
    out, run_dir, node_rank = layout(opts, env0)
    _make_run_dir(run_dir)
    host = socket.gethostname()
    m = _new_manifest(opts, run_dir, host, node_rank)
    command = list(opts.command)
    if nsys_bin:
        (run_dir / rundir.NSYS_DIR).mkdir(parents=True, exist_ok=True)
        base = nsys_capture.report_base(run_dir, node_rank)
        command = nsys_capture.profile_command(nsys_bin, base, command, opts.nsys_range)
        m.extra["nsys"] = {"binary": nsys_bin, "version": nsys_ver, "range": opts.nsys_range}
    sampler, nvml_mod = start_nvml(opts, run_dir, host, m)
    _safe_write_manifest(run_dir, m)
    # from before the job starts: a signal during the start-up below reaches the job too
    with forward_signals() as fw:
        child = _spawn(opts, command, run_dir, node_rank, sampler)
        fw.attach(child)
        m.extra["child_pid"] = child.pid
        conditions = start_conditions(opts, run_dir, host, child.pid, nvml_mod, m)
        _safe_write_manifest(run_dir, m)  # a gpudiag killed now leaves the child's pid behind
        watchers = start_watchers(opts.watchers, run_dir, child.pid, m)
        wd = watchdog.start(opts.hang, run_dir, m)
        rc = _wait(child, run_dir, sampler, progress, progress_interval_s, wd, m)
    received = fw.received
    stop_watchers(watchers, m)
    code = exit_status(rc)
    m.ended_ns = time.time_ns()
    m.exit_code = code
    if wd is not None:
        code = watchdog.finish(wd, m, code)
    code = outcome.interrupted(received, m, code)
    if received:
        m.extra["signals_forwarded"] = [signal.Signals(s).name for s in received]
    if conditions is not None:
        finish_conditions(conditions, run_dir, m)
    if sampler is not None:
        sampler.stop()
        m.sources["nvml"].files = [str(sampler.path.relative_to(run_dir))]
        if sampler.errors:
            m.diagnosis_incomplete.extend(sampler.errors)
    if nsys_bin:
        collect_nsys(nsys_bin, run_dir, node_rank, m)
    try:
        finish_manifest(run_dir, m)
    except Exception as e:
        msg = f"reading rank telemetry failed: {type(e).__name__}: {e}"
        log(msg)
        m.diagnosis_incomplete.append(msg)
    _safe_write_manifest(run_dir, m)
    return RunResult(out, run_dir, code, m)


def _make_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from gpudiag.errors import GpudiagError

        raise GpudiagError(
            f"cannot create the run directory {run_dir} ({e}); the job was not started",
            "pass --out DIR on a writable filesystem",
            exit_code=3,
        ) from e


def _new_manifest(opts: RunOptions, run_dir: Path, host: str, node_rank: int) -> rundir.RunManifest:
    m = rundir.RunManifest(
        gpudiag_version=gpudiag.__version__,
        argv=list(opts.command),
        started_ns=time.time_ns(),
        hosts=[host],
        node_rank=node_rank,
        profile_steps=opts.profile_steps,
        extra={"gpudiag_argv": list(sys.argv), "run_dir": str(run_dir)},
    )
    problem = python_flags_problem(opts.command)
    if problem:
        log(problem)
        m.diagnosis_incomplete.append(problem)
    return m


def _spawn(
    opts: RunOptions,
    command: list[str],
    run_dir: Path,
    node_rank: int,
    sampler: NvmlSampler | None,
) -> subprocess.Popen[bytes]:
    """Start the job in its own session; a command that cannot start stops the sampler."""
    try:
        return subprocess.Popen(
            command, env=child_env(run_dir, node_rank, opts), start_new_session=True
        )
    except OSError as e:
        if sampler is not None:
            sampler.stop()
        from gpudiag.errors import GpudiagError

        # What a shell would exit with: 127 not found, 126 not executable.
        code = 127 if isinstance(e, FileNotFoundError) else 126
        raise GpudiagError(
            f"cannot start {opts.command[0]!r}: {e}", "check the command after `--`", exit_code=code
        ) from e


def _wait(
    child: subprocess.Popen[bytes],
    run_dir: Path,
    sampler: NvmlSampler | None,
    progress: Callable[[Progress], None] | None,
    interval_s: float,
    wd: watchdog.Running | None = None,
    m: rundir.RunManifest | None = None,
) -> int:
    """Wait for the job, showing progress every ``interval_s``; its return code.

    With a hang watchdog it looks at least once a second, and returns once it ended the job.
    """
    tail = StepsTail(run_dir)
    t0 = time.monotonic()
    if wd is not None:
        interval_s = min(interval_s, 1.0)
    while True:
        try:
            return child.wait(timeout=interval_s)
        except subprocess.TimeoutExpired:
            pass
        if wd is not None and m is not None and watchdog.tick(wd, child, m):
            return child.wait()
        if progress is not None:
            try:
                snap = Progress(run_dir, time.monotonic() - t0, ranks=dict(tail.poll()))
                if sampler is not None:
                    snap.gpus = list(sampler.latest.values())
                progress(snap)
            except Exception as e:
                log(f"live display stopped ({e})")
                progress = None


def _safe_write_manifest(run_dir: Path, m: rundir.RunManifest) -> None:
    try:
        rundir.write_manifest(run_dir, m)
    except Exception as e:
        log(f"cannot write the manifest in {run_dir}: {e}")
