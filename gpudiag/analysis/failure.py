"""Which rank failed first, in which step, and how: the verdict of a job that died.

Each rank's end is classified from its own files (``traces/runend.py``):

- *fatal signal*: faulthandler wrote ``Fatal Python error: Aborted`` (or a segfault …);
  gloo aborts the process this way on a collective whose sizes differ;
- *killed*: no exit record, no error, no fault log: the process vanished (SIGKILL, or
  SIGTERM from torchrun after another rank failed);
- *error*: the job's exception; ``collective mismatch`` when its line says the sizes or
  types differ, ``timeout`` when a collective timed out, ``connection`` when a peer went
  away (reset, closed, broken pipe), ``interrupt`` for KeyboardInterrupt.

A timeout or a lost connection is a *consequence*: the rank waited for, or lost, a peer.
The first failure is the earliest cause (a fatal signal, a mismatch, any other error,
ranks that vanished first), by time, where the times exist; a rank that died of a signal
has no record of its death, so its time is its last record, which is never later than
the moment its peers lost it. Only consequences: the earliest of them, and the culprit
is whoever the hang evidence names (``analysis/hang.py``). Steps never finished by a
rank are not in its telemetry, so they feed no share or remedy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpudiag.analysis.hang import collective_of, user_frames, where_text
from gpudiag.records import dataclass
from gpudiag.traces.flightrec import ThreadStack
from gpudiag.traces.runend import RankEnd

_MISMATCH = re.compile(r"doesn't match expected size|collective mismatch|mismatch", re.I)
_TIMEOUT = re.compile(r"timed out|timeout", re.I)
_CONNECTION = re.compile(
    r"connection (reset|closed|refused)|broken pipe|peer|socket closed|remote worker", re.I
)
CONSEQUENCES = ("timeout", "connection")


@dataclass(frozen=True)
class RankFailure:
    """How one rank ended, when it did not end well."""

    rank: int
    step: int  # the step it was in (it had finished steps 0 … step-1)
    how: str  # "signal", "killed", "mismatch", "timeout", "connection", "interrupt", "error"
    line: str  # the error line, or the fatal error
    time_ns: int | None
    where: str = ""  # innermost frames of the job's own code (fault log)
    collective: str | None = None  # the torch.distributed call it died in (fault log)


def _fault_where(threads: Sequence[ThreadStack]) -> tuple[str, str | None]:
    """Where the job's own code was when the rank died, and the collective it was in."""
    # faulthandler's "Current thread" (kept as ``main``) first, then the others.
    for t in sorted(threads, key=lambda t: not t.main):
        own = user_frames(t)
        if own:
            return where_text(own), collective_of(t)
    return "", None


def classify(end: RankEnd) -> RankFailure | None:
    """How ``end``'s rank failed; None when it ended normally."""
    if end.fault:
        where, coll = _fault_where(end.fault_threads)
        line = f"Fatal Python error: {end.fault}"
        return RankFailure(end.rank, end.steps, "signal", line, end.last_ns, where, coll)
    if end.error:
        line = end.error
        if line.startswith("KeyboardInterrupt"):
            how = "interrupt"
        elif _MISMATCH.search(line):
            how = "mismatch"
        elif _TIMEOUT.search(line):
            how = "timeout"
        elif _CONNECTION.search(line):
            how = "connection"
        else:
            how = "error"
        return RankFailure(end.rank, end.steps, how, line, end.error_ns or end.last_ns)
    if not end.exited:
        line = "ended without an exit record or error (killed)"
        return RankFailure(end.rank, end.steps, "killed", line, end.last_ns)
    return None


def _t(f: RankFailure) -> tuple[int, int]:
    return (f.time_ns if f.time_ns is not None else 1 << 62, f.rank)


def failures(ends: Sequence[RankEnd]) -> list[RankFailure]:
    """Every rank that failed, the first failure first (see the module's rule).

    1. A fatal signal, a mismatch or another error of the job's own, earliest first;
    2. else ranks that vanished (no record of their death) when the others lost a peer
       (the connection errors point at them);
    3. else the earliest timeout or lost connection: ranks that vanished beside a timeout
       were ended after it (torchrun stops the others when one fails).
    Interrupts come last: they are the user's, not a failure.
    """
    out = [f for f in (classify(e) for e in ends) if f is not None]
    own = sorted((f for f in out if f.how in ("signal", "mismatch", "error")), key=_t)
    killed = sorted((f for f in out if f.how == "killed"), key=_t)
    conn = sorted((f for f in out if f.how == "connection"), key=_t)
    timeout = sorted((f for f in out if f.how == "timeout"), key=_t)
    stopped = sorted((f for f in out if f.how == "interrupt"), key=_t)
    if own:
        rest = sorted(killed + conn + timeout, key=_t)
        return own + rest + stopped
    if killed and conn and not timeout:
        return killed + conn + stopped
    return sorted(timeout + conn, key=_t) + killed + stopped


LINE_CHARS = 160


def short(line: str) -> str:
    """An error line cut to ``LINE_CHARS`` for a message (the finding keeps it whole)."""
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"


def describe(f: RankFailure, first: bool = False) -> str:
    """``rank 1 failed first, in step 7: it died of a fatal signal (…) inside all_reduce …``."""
    what = {
        "signal": "it died of a fatal signal",
        "killed": "it was killed",
        "mismatch": "a collective mismatch",
        "timeout": "a collective timed out",
        "connection": "it lost a peer",
        "interrupt": "it was interrupted",
        "error": "it raised",
    }[f.how]
    msg = f"rank {f.rank} failed first, in step {f.step}: " if first else f"rank {f.rank}: "
    msg += what
    if f.how == "signal":
        msg += f" ({f.line})"
    elif f.how != "killed":
        msg += f": {short(f.line)}"
    if f.collective:
        msg += f" inside {f.collective}"
    if f.where:
        msg += f", called from {f.where}" if f.collective else f" in {f.where}"
    return msg
