"""How a ``gpudiag run`` ended when it did not end well: interrupted, or its window lost.

- Ctrl-C (SIGINT) on ``gpudiag run`` is forwarded to the job's process group, as
  torchrun forwards it to its workers; what was recorded is kept and diagnosed, the
  manifest says ``extra.interrupted``, and ``gpudiag run`` exits 130 (128 + SIGINT)
  whatever the job's own code (kept in ``exit_code``).
- A profiler window the ranks were inside when the job died (a crash, a kill, an
  abort) and whose trace was never written is *lost*, not "not reached".
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpudiag.rundir import layout as rundir

EXIT_INTERRUPTED = 128 + signal.SIGINT


def interrupted(received: Sequence[int], m: rundir.RunManifest, code: int) -> int:
    """``gpudiag run``'s exit code after the job ended: 130 when the user pressed Ctrl-C."""
    if signal.SIGINT not in received:
        return code
    m.extra["interrupted"] = {"signal": "SIGINT", "job_exit_code": m.exit_code}
    return EXIT_INTERRUPTED


def lost_window(
    profile_steps: str | None,
    steps_per_rank: Mapping[str, int],
    per_rank: Mapping[int, Sequence[Mapping[str, Any]]],
    exit_code: int | None,
) -> str | None:
    """Why no trace exists when the ranks were inside the window as the job died, else None."""
    if not profile_steps or ":" not in profile_steps:
        return None
    try:
        a, b = (int(x) for x in profile_steps.split(":", 1))
    except ValueError:
        return None
    most = max(steps_per_rank.values(), default=0)
    # The window opens at the end of step a-1 (its warm-up) and records steps a … b-1.
    if most < a - 1 or most >= b:
        return None
    died = [
        r for r, evs in per_rank.items() if not any(e.get("type") in ("exit", "exec") for e in evs)
    ]
    if not died and exit_code in (None, 0):
        return None
    who = f"ranks {sorted(died)}" if died else "the job"
    return (
        f"window {profile_steps} lost: {who} ended in step {most} inside the window, before "
        "its trace was written (a crash, a kill or an interrupt); no profiler trace"
    )


def lost_traces(
    profile_steps: str | None,
    traces: Sequence[Path],
    per_rank: Mapping[int, Sequence[Mapping[str, Any]]],
    extra: Mapping[str, Any],
) -> str:
    """Ranks without a trace that died inside the window while others saved theirs."""
    have = set()
    for p in traces:
        try:
            have.add(int(p.name.split(".")[0].split("-")[1]))
        except (IndexError, ValueError):
            continue
    steps = extra.get("steps_per_rank", {})
    lost = {}
    for r, evs in per_rank.items():
        if r in have:
            continue
        why = lost_window(profile_steps, {str(r): int(steps.get(str(r), 0))}, {r: evs}, None)
        if why:
            lost[r] = int(steps.get(str(r), 0))
    if not lost:
        return ""
    parts = ", ".join(f"rank {r} in step {s}" for r, s in sorted(lost.items()))
    return f"trace lost: {parts} died inside the window before writing it"
