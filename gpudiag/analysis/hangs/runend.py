"""Findings for a run that hung, disagreed on a collective, failed or was interrupted.

The rules are in ``analysis/hang.py`` (who never entered which collective),
``analysis/hang_cases.py`` (each case, with where its culprits are) and
``analysis/failure.py`` (which rank failed first); this module turns
their results into findings: ``hang``, ``collective_mismatch`` and ``job_failed``, each
with the numbers docs/definitions.md lists. The verdict leads with them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypedDict

from gpudiag import __version__
from gpudiag.analysis.model.diagnosis import Diagnosis, Finding, RunSummary, Shares
from gpudiag.analysis.model.kinds import FindingKind, HangEvidence, Mode, Severity
from gpudiag.analysis.model.metrics import (
    CollectiveMismatchMetrics,
    HangEffect,
    HangFrame,
    HangMetrics,
    JobFailedMetrics,
)
from gpudiag.analysis.rank.analyse import RankResult
from gpudiag.analysis.verdict import verdict
from gpudiag.config import Thresholds
from gpudiag.traces.schema import RunTimeline

if TYPE_CHECKING:  # the hang and failure rules are imported only for a run that ended badly
    from gpudiag.analysis.hangs.cases import HangCase
    from gpudiag.analysis.hangs.failure import RankFailure
    from gpudiag.traces.runfiles.runend import RunEnd

LEADS = (FindingKind.HANG, FindingKind.COLLECTIVE_MISMATCH, FindingKind.JOB_FAILED)


class _HangFields(TypedDict):
    """The fields a hang and a collective mismatch share (``HangMetrics``, in its order)."""

    op: str
    process_group: dict[str, str]
    seq: int | None
    sizes: list[list[int]]
    dtypes: list[str] | None
    waiting_ranks: list[int]
    waited_ns: int | None
    waited_ns_per_rank: dict[str, int | None]
    never_entered: list[int]
    unknown_ranks: list[int]
    members: list[int]
    where: dict[str, list[HangFrame]]
    step: int | None
    explained_by: str | None
    incomplete: bool
    evidence: HangEvidence
    effects: list[HangEffect]  # the stalls it explains


def _frames_json(case: HangCase) -> dict[str, list[HangFrame]]:
    return {
        str(r): [HangFrame(name=f.name, filename=f.filename, line=f.line) for f in frames]
        for r, frames in sorted(case.where_frames.items())
    }


def _case_finding(case: HangCase, stall_members: dict[tuple[str, int | None], Any]) -> Finding:
    st = stall_members.get((case.pg_name, case.seq))
    common = _HangFields(
        op=case.op,
        process_group={"name": case.pg_name, "desc": case.pg_desc},
        seq=case.seq,
        sizes=[list(x) for x in st.input_sizes] if st is not None else [],
        dtypes=list(st.input_dtypes) if st is not None and st.input_dtypes else None,
        waiting_ranks=list(case.waiting),
        waited_ns=case.waited_ns,
        waited_ns_per_rank=({str(w.rank): w.waited_ns for w in st.stuck} if st is not None else {}),
        never_entered=list(st.never_entered) if st is not None else list(case.culprits),
        unknown_ranks=list(st.unknown) if st is not None else [],
        members=list(st.members) if st is not None else [],
        where=_frames_json(case),
        step=case.step,
        explained_by=case.explained_by,
        incomplete=case.incomplete,
        evidence=case.evidence,
        effects=[HangEffect(op=label, waiting_ranks=list(w)) for label, w in case.effects],
    )
    metrics: HangMetrics
    if case.kind == "collective_mismatch":
        kind = FindingKind.COLLECTIVE_MISMATCH
        metrics = CollectiveMismatchMetrics(
            **common,
            mismatches=[
                {"rank": m.rank, "field": m.what, "expected": m.expected, "found": m.found}
                for m in case.mismatch
            ],
        )
    else:
        kind = FindingKind.HANG
        metrics = HangMetrics(**common)
    severity = Severity.ERROR if case.explained_by is None else Severity.WARNING
    return Finding(
        kind,
        severity,
        case.message,
        ranks=list(case.culprits),
        steps=[case.step] if case.step is not None else [],
        metrics=metrics,
    )


def run_end_findings(end: RunEnd | None, notes: list[str] | None = None) -> list[Finding]:
    """``hang``, ``collective_mismatch`` and ``job_failed`` findings of ``end``, roots first.

    What the flight-recorder analysis could not know (missing or empty dumps, groups whose
    ranks the dumps do not list) is appended to ``notes``.
    """
    if end is None:
        return []
    from gpudiag.analysis.hangs.cases import hang_cases
    from gpudiag.analysis.hangs.failure import failures
    from gpudiag.analysis.hangs.stuck import analyze_dumps

    out: list[Finding] = []
    analysis = analyze_dumps(end.dumps, end.world_size) if end.dumps else None
    if analysis is not None and notes is not None:
        notes += analysis.notes
    cases = hang_cases(analysis, end.stacks, end.world_size)
    stalls: dict[tuple[str, int | None], Any] = {}
    if analysis is not None:
        for s in (*analysis.mismatches, *analysis.stalls):
            stalls[(s.pg_name, s.seq)] = s
    out += [_case_finding(c, stalls) for c in cases]
    failed = failures(end.ends)
    if end.exit_code not in (None, 0) or end.interrupted or failed:
        out.append(_failure_finding(end, failed, cases))
    return out


def waited_for(
    end: RunEnd, first: RankFailure, cases: list[HangCase]
) -> tuple[list[int], str, str]:
    """Whom ``first`` (a timeout or a lost peer) waited for, and the evidence that says so.

    A rank whose collective timed out waited for a peer that never arrived: the roots of the
    hang evidence (ranks that never entered the collective, ``analysis/hang.py``), else the
    ranks *behind*: that finished fewer steps than the step ``first`` was in. Returns (the
    ranks, the evidence: ``flight recorder``, ``stacks`` or ``steps``, why in words); none:
    ([], "", "").
    """
    from gpudiag.analysis.hangs.failure import CONSEQUENCES

    if first.how not in CONSEQUENCES:
        return [], "", ""
    roots = [c for c in cases if c.explained_by is None and c.culprits]
    named = sorted({r for c in roots for r in c.culprits} - {first.rank})
    if named:
        c = roots[0]
        seq = f" #{c.seq}" if c.seq is not None else ""
        verb = "never entered" if c.kind == "hang" else "disagreed on"
        return named, c.evidence, f"{_who(named)} {verb} {c.op}{seq} ({c.evidence})"
    steps = {e.rank: e.steps for e in end.ends}
    behind = sorted(r for r, n in steps.items() if r != first.rank and n < first.step)
    if not behind:
        return [], "", ""
    done = "/".join(str(steps[r]) for r in behind)
    return behind, "steps", f"{_who(behind)} never reached step {first.step} (finished {done})"


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _consequence_words(first: RankFailure, culprits: list[int], why: str) -> str:
    """``rank 1 never entered all_reduce #14 (…): rank 0's all_reduce timed out waiting for it``."""
    from gpudiag.analysis.hangs.failure import short

    what = "timed out waiting for" if first.how == "timeout" else "lost"
    them = "it" if len(culprits) == 1 else "them"
    coll = first.collective or "collective"
    line = short(first.line)
    return f"{why}: rank {first.rank}'s {coll} {what} {them} in step {first.step}: {line}"


def _failure_message(
    end: RunEnd, failed: list[RankFailure], interrupted: bool, culprits: list[int], why: str
) -> str:
    """The job_failed finding's sentence (see :func:`_failure_finding`)."""
    from gpudiag.analysis.hangs.failure import CONSEQUENCES, describe

    first = failed[0] if failed else None
    code = f" (the job exited with code {end.exit_code})" if end.exit_code not in (None, 0) else ""
    if interrupted:
        head = "interrupted (Ctrl-C)"
        if first is not None:
            head += f" in step {first.step}"
        return f"the run was {head}; the diagnosis covers the steps the ranks finished"
    if first is not None and culprits:
        return _consequence_words(first, culprits, why) + code
    if first is not None and first.mismatch:
        # the line names what differs: that is the verdict (the raw line is in metrics.error)
        return f"{first.mismatch}, in step {first.step} (rank {first.rank} raised it){code}"
    if first is not None:
        msg = describe(first, first=True)
        if first.how in CONSEQUENCES:
            msg += " (a peer never arrived; the run does not record which)"
        others = [f for f in failed[1:] if f.how != "killed"]
        if others:
            msg += "; then " + describe(others[0])
        return msg + code
    return (
        f"the training job exited with code {end.exit_code}; no rank recorded an error: "
        "the diagnosis covers the steps it completed"
    )


def _failure_finding(end: RunEnd, failed: list[Any], cases: list[HangCase]) -> Finding:
    first = failed[0] if failed else None
    killed_by_watchdog = bool((end.hang or {}).get("killed"))
    if killed_by_watchdog:
        msg = (
            "gpudiag's hang watchdog ended the job (--on-hang kill) after the stall above"
            f"; the job's exit code {end.exit_code}"
        )
        return Finding(
            FindingKind.JOB_FAILED,
            Severity.WARNING,
            msg,
            metrics=JobFailedMetrics(exit_code=end.exit_code, how="killed by gpudiag"),
        )
    interrupted = end.interrupted or (
        any(f.how == "interrupt" for f in failed)
        and all(f.how in ("interrupt", "killed") for f in failed)
    )
    culprits, basis, why = waited_for(end, first, cases) if first else ([], "", "")
    msg = _failure_message(end, failed, interrupted, culprits, why)
    severity = Severity.ERROR if first is not None and not interrupted else Severity.WARNING
    metrics = JobFailedMetrics(
        exit_code=end.exit_code,
        interrupted=interrupted,
        first_rank=first.rank if first is not None else None,
        step=first.step if first is not None else None,
        how=first.how if first is not None else None,
        error=first.line if first is not None else None,
        where=first.where if first is not None else None,
        collective=first.collective if first is not None else None,
        others=[
            {"rank": f.rank, "how": f.how, "error": f.line, "step": f.step} for f in failed[1:]
        ],
        waited_for=culprits or None,
        waited_for_evidence=basis or None,
        mismatch=first.mismatch if first is not None else None,
    )
    return Finding(
        FindingKind.JOB_FAILED,
        severity,
        msg,
        ranks=culprits or ([first.rank] if first is not None else []),
        steps=[first.step] if first is not None else [],
        metrics=metrics,
    )


def evidence_only(
    run: RunTimeline, findings: list[Finding], th: Thresholds, notes: list[str]
) -> Diagnosis:
    """A Diagnosis of flight-recorder dumps (or a run stopped before its first step) alone."""
    end = run.run_end
    ranks = (
        sorted(
            {d.rank for d in end.dumps} | {s.rank for s in end.stacks} | {e.rank for e in end.ends}
        )
        if end
        else []
    )
    zero = Shares(0.0, 0.0, 0.0, 0.0)
    summary = RunSummary(
        ranks=len(ranks),
        world_size=end.world_size if end else None,
        steps=0,
        step_time_ns_median=0,
        step_time_ns_p90=0,
        shares=zero,
        comm_overlapped_ratio=0.0,
        idle_ratio=0.0,
        mode=Mode.TELEMETRY,
    )
    why = (
        "no step to measure: the diagnosis rests on the flight recorder, the ranks' stacks "
        "and how each rank ended"
    )
    return Diagnosis(
        run=summary,
        ranks=[],
        steps=[],
        findings=findings,
        inputs=list(run.inputs),
        thresholds=th.as_dict(),
        notes=[*notes, why],
        gpudiag_version=__version__,
        verdict=verdict(summary, findings, rules=th.verdict),
    )


def without_unfinished(
    results: list[RankResult], end: RunEnd | None, notes: list[str]
) -> list[RankResult]:
    """Trace steps a rank never finished (the job died in them) out of a run that ended badly.

    A window cut by the job's end is saved with the partial step it ended in; the rank's
    telemetry names it (``cut_at_step`` of its ``profile`` record). That step must not feed
    shares or remedies. Only gpudiag's own traces (``ranks/rank-R.pt.trace.json.gz``) are
    checked: their ``ProfilerStep#N`` carry gpudiag's step numbers.
    """
    if end is None:
        return results
    cut = {e.rank: e.cut_step for e in end.ends if e.cut_step is not None}
    out = []
    for r in results:
        c = cut.get(r.rank)
        own = r.source.replace("\\", "/").endswith(f"ranks/rank-{r.rank}.pt.trace.json.gz")
        if c is None or not own or all(s.step < c for s in r.steps):
            out.append(r)
            continue
        notes.append(
            f"rank {r.rank}: trace step {c} never finished (the job ended inside it): left out "
            "of every share and remedy"
        )
        out.append(dataclasses.replace(r, steps=[s for s in r.steps if s.step < c]))
    return out
