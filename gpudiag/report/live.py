"""Progress on the terminal while gpudiag works: ``gpudiag run``'s status line and a bar.

Renderers like the others in report/, for the state of work in progress rather than a
result: :func:`progress_line` draws a running job's ranks, GPUs and alerts as one line,
kept on a terminal's last row by :class:`StatusLine` (``gpudiag run``'s status, which never
covers a line the job prints) or printed every ~10 s for logs, and
:func:`analysis_progress` the bar of ``gpudiag analyze`` over the rank traces.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported when a terminal shows progress (~20 ms, 3 MB otherwise)
    from rich.progress import Progress

LINE_INTERVAL_S = 10.0  # plain progress lines at most this often
MIN_STATUS_ROWS = 3  # a shorter terminal gets no status line


def progress_line(p: Any) -> str:
    """The snapshot as one line: elapsed time, each rank's steps, each GPU's use, alerts now.

    ``p`` is the launcher's progress snapshot (``run_dir``, ``elapsed_s``, ``gpus`` as
    dicts with ``index`` and ``util_ratio``, ``ranks`` mapping rank → ``steps`` and
    ``steps_per_s``, ``alerts`` the live alerts raised now, one line each).
    """
    ranks = " ".join(f"r{r}:{rp.steps}" for r, rp in sorted(p.ranks.items()))
    utils = " ".join(
        "n/a" if g.get("util_ratio") is None else f"{g['util_ratio']:.0%}" for g in p.gpus
    )
    line = f"gpudiag: {p.elapsed_s:.0f}s steps {ranks or '-'} gpu util {utils or 'n/a'}"
    alerts = [a.removeprefix("alert: ") for a in getattr(p, "alerts", [])]
    if alerts:
        more = f" (+{len(alerts) - 1} more)" if len(alerts) > 1 else ""
        line += f" · alert: {alerts[-1]}{more}"
    return line


class StatusLine:
    """gpudiag's one-line status on a terminal's last row, below the job's scrolling region.

    The job keeps writing to the terminal itself (no relay: it can never block on gpudiag,
    and a gpudiag killed outright leaves its output path whole); the terminal scrolls the
    job's lines within rows 1..N-1 (DECSTBM), so the status on row N never covers one. Each
    redraw is one ``write`` (a tty serialises writers per call), saving and restoring the
    cursor, so it lands between the job's writes and leaves the job's cursor where it was.
    A resize (SIGWINCH, or a changed size at a redraw) reserves the last row again.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.rows = 0  # the rows reserved for (0: not started)
        self.text = ""
        self._old_winch: Any = None

    def _size(self) -> tuple[int, int]:
        try:
            size = os.get_terminal_size(self.fd)
        except OSError:
            return 0, 0
        return size.lines, size.columns

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, text.encode("utf-8", "replace"))

    def start(self) -> None:
        """Reserve the last row: a new line at the cursor (the cursor is at a line's start)."""
        rows, _ = self._size()
        if rows < MIN_STATUS_ROWS:
            return
        self._write(f"\n\x1b[A\x1b7\x1b[1;{rows - 1}r\x1b8")
        self.rows = rows
        import signal  # here: an analysis without a terminal never needs them (~1 ms)
        import threading

        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGWINCH"):
            self._old_winch = signal.signal(signal.SIGWINCH, self._on_winch)

    def _on_winch(self, _signum: int, _frame: Any) -> None:
        if self.rows:
            self.show(self.text)

    def _reserve_again(self, rows: int) -> None:
        """After a resize: erase the old status, keep the cursor off the last row, reserve it.

        Erases below the job's cursor (the old status, wherever the resize left it), then
        scrolls the job's lines up one with the cursor, so the cursor is above the last row.
        """
        self._write(f"\x1b7\x1b[r\x1b8\x1b[J\x1b[S\x1b[A\x1b7\x1b[1;{rows - 1}r\x1b8")
        self.rows = rows

    def show(self, text: str) -> None:
        """Draw ``text`` (cut to the width) on the reserved row."""
        rows, cols = self._size()
        if self.rows == 0 or rows < MIN_STATUS_ROWS:
            return
        if rows != self.rows:
            self._reserve_again(rows)
        self.text = text
        self._write(f"\x1b7\x1b[{rows};1H\x1b[2K{text[: max(cols - 1, 0)]}\x1b8")

    def stop(self) -> None:
        """Erase the status and give the whole screen back to scrolling."""
        if self._old_winch is not None:
            import signal

            signal.signal(signal.SIGWINCH, self._old_winch)
            self._old_winch = None
        if self.rows:
            rows, _ = self._size()
            self._write(f"\x1b7\x1b[{rows or self.rows};1H\x1b[2K\x1b[r\x1b8")
            self.rows = 0


def run_progress(quiet: bool) -> tuple[Callable[[Any], None] | None, StatusLine | None]:
    """(show, status): a status line on a terminal, plain lines on stderr every ~10 s otherwise.

    ``show`` takes each progress snapshot; ``status``, when not None, is stopped by the
    caller. A terminal that moves no cursor (``TERM=dumb``) gets the plain lines.
    """
    if quiet:
        return None, None
    if sys.stdout.isatty() and sys.stderr.isatty() and os.environ.get("TERM") != "dumb":
        status = StatusLine(sys.stderr.fileno())
        sys.stderr.flush()
        status.start()

        def draw(p: Any) -> None:
            status.show(progress_line(p))

        return draw, status
    last = [0.0]

    def line(p: Any) -> None:
        if p.elapsed_s - last[0] < LINE_INTERVAL_S:
            return
        last[0] = p.elapsed_s
        print(progress_line(p), file=sys.stderr, flush=True)

    return line, None


def analysis_progress() -> tuple[Callable[[int, int, int], None] | None, Progress | None]:
    """A rich progress bar on stderr when it is a terminal (trace files done, events/s)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("analysing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rank traces"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task: list[Any] = []
    t0 = time.monotonic()

    def hook(done: int, total: int, events: int) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task("analyse", total=total, rate=""))
        elapsed = time.monotonic() - t0
        rate = f"{events / elapsed / 1e3:,.0f}k events/s" if events and elapsed > 0 else ""
        bar.update(task[0], completed=done, rate=rate)

    return hook, bar
