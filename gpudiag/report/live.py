"""Progress on the terminal while gpudiag works: the live panel of ``gpudiag run`` and bar.

Renderers like the others in report/, for the state of work in progress rather than a
result: :func:`progress_table` draws a running job's GPUs and ranks (``gpudiag run``'s
live panel), :func:`progress_line` the same as one plain line for logs, and
:func:`analysis_progress` the bar of ``gpudiag analyze`` over the rank traces.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported when a terminal shows progress (~20 ms, 3 MB otherwise)
    from rich.live import Live
    from rich.progress import Progress
    from rich.table import Table

LINE_INTERVAL_S = 10.0  # plain progress lines at most this often


def progress_table(p: Any) -> Table:
    """The live panel: the run directory and elapsed time, each GPU's use, each rank's steps.

    ``p`` is the launcher's progress snapshot (``run_dir``, ``elapsed_s``, ``gpus`` as
    dicts with ``index`` and ``util_ratio``, ``ranks`` mapping rank → ``steps`` and
    ``steps_per_s``, ``alerts`` the live alerts raised now, one line each).
    """
    from rich.table import Table

    t = Table(title=f"gpudiag · {p.run_dir} · {p.elapsed_s:.0f}s", box=None)
    t.add_column("GPU / rank")
    t.add_column("util / steps", justify="right")
    for g in p.gpus:
        u = g.get("util_ratio")
        t.add_row(f"gpu {g.get('index')}", "n/a" if u is None else f"{u:.0%}")
    for r, rp in sorted(p.ranks.items()):
        rate = "" if rp.steps_per_s is None else f" ({rp.steps_per_s:.2f}/s)"
        t.add_row(f"rank {r}", f"{rp.steps}{rate}")
    for line in getattr(p, "alerts", []):
        t.add_row("[bold red]alert[/]", line.removeprefix("alert: "))
    return t


def progress_line(p: Any) -> str:
    """The same snapshot as one line for stderr when it is not a terminal."""
    ranks = " ".join(f"r{r}:{rp.steps}" for r, rp in sorted(p.ranks.items()))
    utils = " ".join(
        "n/a" if g.get("util_ratio") is None else f"{g['util_ratio']:.0%}" for g in p.gpus
    )
    return f"gpudiag: {p.elapsed_s:.0f}s steps {ranks or '-'} gpu util {utils or 'n/a'}"


def run_progress(quiet: bool) -> tuple[Callable[[Any], None] | None, Live | None]:
    """(show, live): the live panel on a terminal, plain lines on stderr every ~10 s otherwise.

    ``show`` takes each progress snapshot; ``live``, when not None, is stopped by the caller.
    """
    if quiet:
        return None, None
    if sys.stdout.isatty() and sys.stderr.isatty():
        from rich.console import Console
        from rich.live import Live

        live = Live(console=Console(stderr=True), refresh_per_second=1, transient=True)

        def show(p: Any) -> None:
            t = progress_table(p)
            if not live.is_started:
                live.start()
            live.update(t)

        return show, live
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
