"""The remedies for a run that hung, disagreed on a collective, failed or was interrupted.

They recover no step time (no gain is estimated) but come first: until the culprit is
fixed the job does not run. A hang root names the ranks that never entered the collective
and where their own code was; a mismatch names the collective and what differs, from the
flight recorder or from the ranks' error lines (``analysis/failure.py``); any other failure
names the rank, step and error line that ended the run; an interrupted run says that its
speed-ups are those of the steps it finished.
"""

import os
from typing import TypedDict

from gpudiag.analysis.model.diagnosis import Finding
from gpudiag.analysis.model.kinds import HangEvidence, Severity
from gpudiag.analysis.model.metrics import HangMetrics, JobFailedMetrics
from gpudiag.analysis.remedies.remedy import Context, Remedy

HANG_DIR_WORDS = "ranks/hang/ of the run directory"


def _where(m: HangMetrics, rank: int) -> str:
    frames = m.where.get(str(rank)) or []
    return " ← ".join(
        f"{f['name']} ({os.path.basename(str(f['filename']))}:{f['line']})" for f in frames[:3]
    )


def _what(m: HangMetrics) -> str:
    return f"{m.op} #{m.seq}" if m.seq is not None else m.op


def _hang_detail(f: Finding, _c: Context) -> str:
    m = f.metrics_as(HangMetrics)
    r = f.ranks[0]
    where = _where(m, r)
    at = f"was in {where}" if where else "was elsewhere"
    w = m.waiting_ranks
    waiting = (
        (f"rank {w[0]}" if len(w) == 1 else "ranks " + ", ".join(map(str, w)))
        if w
        else ("the others")
    )
    return (
        f"Rank {r} {at} while {waiting} waited in {_what(m)}: look there for a "
        "path that skips or delays the collective on some ranks (a rank-dependent "
        "condition, an early exit or swallowed exception, a blocking call or I/O). "
        f"Every rank's stack and flight record are in {HANG_DIR_WORDS}."
    )


class HangRemedyEvidence(TypedDict):
    """The hang remedy's evidence: the collective, who waited, and on what evidence."""

    ranks: list[int]
    op: str
    seq: int | None
    waiting_ranks: list[int]
    step: int | None
    evidence: HangEvidence


class FailureEvidence(TypedDict):
    """The failure remedy's evidence: the job's exit code, and the first failure's step."""

    ranks: list[int]
    exit_code: int | None
    step: int | None
    error: str | None


def _hang_evidence(f: Finding, _c: Context) -> HangRemedyEvidence:
    m = f.metrics_as(HangMetrics)
    return HangRemedyEvidence(
        ranks=f.ranks,
        op=m.op,
        seq=m.seq,
        waiting_ranks=m.waiting_ranks,
        step=m.step,
        evidence=m.evidence,
    )


HANG = Remedy(
    id=lambda f, c: f"hang-rank-{f.ranks[0]}",
    title=lambda f, c: (
        f"Find why rank {f.ranks[0]} never entered {_what(f.metrics_as(HangMetrics))}"
    ),
    detail=_hang_detail,
    gain=lambda f, c: None,
    evidence=_hang_evidence,
    applies=lambda f, c: (
        bool(f.ranks) and f.severity == Severity.ERROR and isinstance(f.metrics, HangMetrics)
    ),
)

_MATCH_WORDS = (
    "Every rank of a group must issue the same collectives in the same order with the same "
    "sizes and dtypes: look for tensor sizes or branches that depend on the rank (uneven "
    "last batches, rank-only logging or metrics). TORCH_DISTRIBUTED_DEBUG=DETAIL checks "
    "each collective's fingerprint and names the first that differs."
)


def _mismatch_text(f: Finding) -> str:
    m = f.metrics
    if isinstance(m, JobFailedMetrics):
        return m.mismatch or ""
    return f.message


MISMATCH = Remedy(
    id=lambda f, c: "collective-mismatch",
    title=lambda f, c: (
        "Make every rank call the collective with the same operation, sizes and dtypes"
    ),
    detail=lambda f, c: f"{_mismatch_text(f)}. {_MATCH_WORDS}",
    gain=lambda f, c: None,
    evidence=lambda f, c: {"ranks": f.ranks, "mismatch": _mismatch_text(f)},
    applies=lambda f, c: f.severity == Severity.ERROR and bool(_mismatch_text(f)),
)


def _failed(f: Finding) -> JobFailedMetrics | None:
    m = f.metrics
    return m if isinstance(m, JobFailedMetrics) else None


def _failure_title(f: Finding, _c: Context) -> str:
    m = f.metrics_as(JobFailedMetrics)
    if m.interrupted:
        return "Let the run finish before acting on its speed-ups"
    who = f"rank {m.first_rank}" if m.first_rank is not None else "the job"
    at = f" in step {m.step}" if m.step is not None else ""
    return f"Fix the error that ended {who}{at}"


def _failure_detail(f: Finding, _c: Context) -> str:
    m = f.metrics_as(JobFailedMetrics)
    if m.interrupted:
        return (
            "The run was interrupted: the figures and gains below are those of the steps "
            "it finished, before any later phase of the job (evaluation, checkpoints, a "
            "changed learning rate) ran."
        )
    line = f" ({m.error})" if m.error else ""
    where = f" at {m.where}" if m.where else ""
    return (
        f"{f.message}{line}{where}. A run that fails is not sped up by any remedy below: "
        "fix the failure, re-run, and act on the new diagnosis."
    )


def _failure_evidence(f: Finding, _c: Context) -> FailureEvidence:
    m = f.metrics_as(JobFailedMetrics)
    return FailureEvidence(ranks=f.ranks, exit_code=m.exit_code, step=m.step, error=m.error)


def _failure_applies(f: Finding, _c: Context) -> bool:
    """A failure a rank recorded, or an interrupt; a mismatch has its own remedy.

    Ranks that were killed (after a hang, by the watchdog or the launcher) failed of
    something else: the hang's remedy, if any, is the fix.
    """
    m = _failed(f)
    if m is None or m.mismatch or (m.how or "").startswith("killed"):
        return False
    return bool(m.interrupted) or m.first_rank is not None


FAILURE = Remedy(
    id=lambda f, c: "interrupted" if f.metrics_as(JobFailedMetrics).interrupted else "job-failed",
    title=_failure_title,
    detail=_failure_detail,
    gain=lambda f, c: None,
    evidence=_failure_evidence,
    applies=_failure_applies,
)
