"""A background sampler: a thread that appends one JSONL record per tick at a fixed cadence.

The NVML sampler (:mod:`gpudiag.collect.samplers.nvml`) and the run-conditions sampler
(:mod:`gpudiag.collect.samplers.conditions`) are both one; they say what a tick reads and writes.
``clock`` returns epoch nanoseconds and ``wait(seconds)`` sleeps and returns True when the
sampler should stop; both are injected so tests run with fake time. Failures never reach
the job (it runs in other processes): they are kept in :attr:`PeriodicSampler.errors`
(the manifest's ``diagnosis_incomplete``) and printed once on stderr.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

Clock = Callable[[], int]
Wait = Callable[[float], bool]


class PeriodicSampler:
    """The thread, the cadence loop and the sample file; subclasses define a tick."""

    thread_name = "gpudiag-sampler"
    #: what :meth:`stop` says when the thread is still blocked after 5 s
    blocked_message = "sampler still blocked 5 s after the job ended; left behind"
    #: a round longer than ``max(1 s, 10 intervals)`` is reported once (:meth:`_slow_round`)
    watch_slow_rounds = False
    #: after ``wait`` says stop, take one last tick (the tail of the run)
    tick_at_stop = False

    def __init__(self, path: Path, interval_s: float, clock: Clock, wait: Wait | None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.path = path
        self.interval_s = interval_s
        self.clock = clock
        self._stop = threading.Event()
        self.wait: Wait = wait if wait is not None else self._stop.wait
        self.errors: list[str] = []
        self.written_header: dict[str, Any] | None = None  # the file's header, once written
        self._file: IO[str] | None = None
        self._thread: threading.Thread | None = None

    # -- to define ---------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The file's first record."""
        raise NotImplementedError

    def _tick(self) -> bool:
        """One round of sampling; False when the sampler must stop."""
        raise NotImplementedError

    def _slow_round(self, took_ns: int) -> None:
        """A round took longer than ``max(1 s, 10 intervals)`` (with ``watch_slow_rounds``)."""

    # -- file ----------------------------------------------------------------------

    def _open(self) -> IO[str]:
        """The sample file, opened (append) with its header on first use."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            self.written_header = self.header()
            self._write_line(self.written_header)
        return self._file

    def _write_line(self, record: dict[str, Any]) -> None:
        """Append one record as a compact JSON line, flushed."""
        f = self._open()
        f.write(json.dumps(record, separators=(",", ":")) + "\n")
        f.flush()

    # -- thread --------------------------------------------------------------------

    def run(self) -> None:
        """The sampling loop: keeps a fixed cadence, never bursts to catch up."""
        next_t = self.clock()
        slow_ns = int(max(1.0, 10 * self.interval_s) * 1e9)
        while True:
            t0 = self.clock() if self.watch_slow_rounds else 0
            if not self._tick():
                return
            next_t += int(self.interval_s * 1e9)
            now = self.clock()
            if self.watch_slow_rounds and now - t0 > slow_ns:
                self._slow_round(now - t0)
            if next_t < now:  # fell behind (suspended, a slow call): do not burst to catch up
                next_t = now
            if self.wait((next_t - now) / 1e9):
                if self.tick_at_stop:
                    self._tick()  # the tail of the run, on this thread: a call may block
                return

    def _fail(self, msg: str) -> None:
        self.errors.append(msg)
        with suppress(Exception):  # a closed stderr must not stop sampling
            print(f"gpudiag: {msg}", file=sys.stderr, flush=True)

    def start(self) -> None:
        """Start the background thread."""
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close the file; waits at most 5 s for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                self._fail(self.blocked_message)
                return  # the thread may still write: the file stays open, lines stay whole
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                self._fail(f"closing {self.path}: {e}")
            self._file = None


def nvml_call(nvml: Any, name: str, *args: Any) -> Any:
    """One NVML call; None when the function is missing or fails."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


def clock_reasons_fn(nvml: Any) -> str | None:
    """The NVML function that reads clocks-event (throttle) reasons, newest name first."""
    for name in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        if hasattr(nvml, name):
            return name
    return None
