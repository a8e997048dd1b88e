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

from gpudiag._support.records import dataclass
from gpudiag.analysis.hangs.stack_frames import collective_of, user_frames, where_text
from gpudiag.traces.runfiles.flightrec import ThreadStack
from gpudiag.traces.runfiles.runend import RankEnd

_MISMATCH = re.compile(r"doesn't match expected size|collective mismatch|mismatch", re.I)
_TIMEOUT = re.compile(r"timed out|timeout", re.I)
_CONNECTION = re.compile(
    r"connection (reset|closed|refused)|broken pipe|peer|socket closed|remote worker", re.I
)
CONSEQUENCES = ("timeout", "connection")
# torch's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL; gloo and NCCL alike):
# "Detected mismatch between collectives on ranks. Rank 0 is running collective:
# CollectiveFingerPrint(SequenceNumber=7, OpType=ALLREDUCE, TensorShape=[1000], …), but
# Rank 1 is running collective: CollectiveFingerPrint(…)" (c10d/ProcessGroupWrapper.cpp).
_FINGERPRINTS = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\((.*?)\), but Rank (\d+) is "
    r"running collective: CollectiveFingerPrint\((.*)"
)
_OP_TYPE = re.compile(r"OpType=(\w+)")
_SHAPE = re.compile(r"TensorShape=\[(.*?)\](?:, |\)|$)")
_DTYPES = re.compile(r"TensorDtypes=\[?([\w, ]*?)\]?(?:, TensorDeviceTypes|\)|$)")
# gloo's tcp pair (pair.cc): "op.preamble.length <= op.nbytes. 1000 vs 500. Received data
# size doesn't match expected size. Is there a distributed collective mismatch in your code?"
_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "_allgather_base": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
}
_GLOO_SIZES = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")


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
    mismatch: str | None = None  # what differs, read from a mismatch line (see mismatch_words)


def mismatch_words(line: str) -> str | None:
    """What a collective-mismatch error line says differs, in words; None when it says not.

    torch's fingerprint check: ``all_reduce sizes [1000] vs [500] (rank 0 vs rank 1)`` (or
    the operations, or the dtypes, whichever differ); gloo's size check, on the rank that
    received: ``received 1000 bytes where 500 were expected``.
    """
    m = _FINGERPRINTS.search(line)
    if m:
        a, b = _fingerprint(m.group(2)), _fingerprint(m.group(4))
        ranks = f"(rank {m.group(1)} vs rank {m.group(3)})"
        if a[0] != b[0]:
            return f"{a[0]} vs {b[0]} {ranks}"
        if a[1] != b[1]:
            return f"{a[0]} sizes [{a[1]}] vs [{b[1]}] {ranks}"
        if a[2] != b[2]:
            return f"{a[0]} dtypes {a[2]} vs {b[2]} {ranks}"
        return f"{a[0]} {ranks}"
    g = _GLOO_SIZES.search(line)
    if g:
        return f"received {g.group(1)} bytes where {g.group(2)} were expected"
    return None


def _fingerprint(text: str) -> tuple[str, str, str]:
    """(operation, shape, dtypes) of one ``CollectiveFingerPrint(…)``'s text."""
    op = _OP_TYPE.search(text)
    shape = _SHAPE.search(text)
    dt = _DTYPES.search(text)
    name = op.group(1).lower() if op else "?"
    name = _OPS.get(name, name)
    return name, shape.group(1) if shape else "?", dt.group(1).strip() if dt else "?"


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
        detail = mismatch_words(line) if how == "mismatch" else None
        return RankFailure(
            end.rank, end.steps, how, line, end.error_ns or end.last_ns, mismatch=detail
        )
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
    if f.how == "mismatch" and f.mismatch:
        msg += f": {f.mismatch}"
        return msg
    if f.how == "signal":
        msg += f" ({f.line})"
    elif f.how != "killed":
        msg += f": {short(f.line)}"
    if f.collective:
        msg += f" inside {f.collective}"
    if f.where:
        msg += f", called from {f.where}" if f.collective else f" in {f.where}"
    if f.how == "signal" and f.collective and "Abort" in f.line:
        msg += (
            " (gloo aborts a rank this way when a collective's sizes differ across ranks: "
            "a possible collective mismatch; the sizes are on the rank's stderr)"
        )
    return msg
