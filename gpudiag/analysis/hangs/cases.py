"""The hang and mismatch cases of a run as the verdict states them, with where the culprits are.

From the flight-recorder analysis (:func:`gpudiag.analysis.hangs.stuck.analyze_dumps`) when there
are dumps; from the stacks alone otherwise: ranks whose main thread is inside a
torch.distributed call wait, the others are culprits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpudiag._support.records import dataclass
from gpudiag.analysis.hangs.stack_frames import collective_of, user_frames, where_text
from gpudiag.analysis.hangs.stuck import GroupStall, HangAnalysis, Mismatch
from gpudiag.traces.runfiles.flightrec import Frame, RankStacks


@dataclass(frozen=True)
class HangCase:
    """One stuck (or mismatched) collective as the verdict states it."""

    kind: str  # "hang" or "collective_mismatch"
    op: str
    seq: int | None
    pg_name: str
    pg_desc: str
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    waited_ns: int | None
    step: int | None  # the step the waiting ranks were in
    where: dict[int, str]  # culprit rank → innermost frames of its own code
    where_frames: dict[int, tuple[Frame, ...]]
    explained_by: str | None
    incomplete: bool
    message: str
    evidence: str  # "flight recorder" / "stacks"
    mismatch: tuple[Mismatch, ...] = ()


def _group_words(desc: str, name: str) -> str:
    if desc in ("default_pg", "") and name in ("0", ""):
        return "default group"
    return f"group {desc or name}"


def _ranks_words(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _for(ns: int | None) -> str:
    return f" for {_secs(ns)}" if ns is not None else ""


def _secs(ns: int) -> str:
    s = ns / 1e9
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


class _Ranks:
    """Where each rank is and which step it was in, from the stacks files."""

    def __init__(self, stacks: Sequence[RankStacks]) -> None:
        self.by_rank = {s.rank: s for s in stacks}

    def where(self, ranks: Sequence[int]) -> tuple[dict[int, str], dict[int, tuple[Frame, ...]]]:
        texts, frames = {}, {}
        for r in ranks:
            st = self.by_rank.get(r)
            main = st.main if st is not None else None
            fr = user_frames(main) if main is not None else ()
            if fr:
                frames[r] = fr
                texts[r] = where_text(fr)
        return texts, frames

    def step_of(self, ranks: Sequence[int]) -> int | None:
        steps = [
            s.step for r in ranks if (s := self.by_rank.get(r)) is not None and s.step is not None
        ]
        return min(steps) if steps else None


def hang_cases(
    analysis: HangAnalysis | None, stacks: Sequence[RankStacks], world: int | None = None
) -> list[HangCase]:
    """The hang and mismatch cases of a run, roots first, each with where its culprits are.

    From the flight recorder when there are dumps; from the stacks alone otherwise (ranks
    whose main thread is inside a torch.distributed call wait; the others are culprits).
    """
    ranks = _Ranks(stacks)
    if analysis is not None and (analysis.stalls or analysis.mismatches):
        return _dump_cases(analysis, ranks)
    return _stack_cases(stacks, world, ranks)


def _dump_cases(analysis: HangAnalysis, ranks: _Ranks) -> list[HangCase]:
    out: list[HangCase] = []
    for st in analysis.stalls:
        waiting = tuple(w.rank for w in st.stuck)
        texts, frames = ranks.where(st.culprits)
        step = ranks.step_of(waiting)
        out.append(
            HangCase(
                kind="collective_mismatch" if not st.never_entered and st.mismatches else "hang",
                op=st.op,
                seq=st.seq,
                pg_name=st.pg_name,
                pg_desc=st.pg_desc,
                culprits=st.culprits,
                waiting=waiting,
                waited_ns=st.waited_ns,
                step=step,
                where=texts,
                where_frames=frames,
                explained_by=st.explained_by,
                incomplete=analysis.incomplete and bool(st.unknown),
                message=_stall_message(st, texts, step, analysis),
                evidence="flight recorder",
                mismatch=st.mismatches,
            )
        )
    stalled = {(s.pg_name, s.seq) for s in analysis.stalls}
    for m in analysis.mismatches:
        if (m.pg_name, m.seq) in stalled:
            continue
        texts, frames = ranks.where(m.culprits)
        out.append(
            HangCase(
                kind="collective_mismatch",
                op=m.op,
                seq=m.seq,
                pg_name=m.pg_name,
                pg_desc=m.pg_desc,
                culprits=m.culprits,
                waiting=(),
                waited_ns=None,
                step=None,
                where=texts,
                where_frames=frames,
                explained_by=None,
                incomplete=False,
                message=_mismatch_message(m),
                evidence="flight recorder",
                mismatch=m.mismatches,
            )
        )
    return out


def _stack_cases(stacks: Sequence[RankStacks], world: int | None, ranks: _Ranks) -> list[HangCase]:
    """No usable flight recorder: the ranks inside a collective wait, the others are culprits."""
    w_ranks: list[int] = []
    c_ranks: list[int] = []
    ops: set[str] = set()
    for s in stacks:
        op = collective_of(s.main) if s.main is not None else None
        if op is not None:
            w_ranks.append(s.rank)
            ops.add(op)
        else:
            c_ranks.append(s.rank)
    if not w_ranks or not c_ranks:
        return []
    waiting, culprits = tuple(w_ranks), tuple(c_ranks)
    missing = sorted(set(range(world)) - set(ranks.by_rank)) if world else []
    texts, frames = ranks.where(culprits)
    op = ops.pop() if len(ops) == 1 else "/".join(sorted(ops))
    msg = (
        f"{_ranks_words(culprits)} never entered {op} that {_ranks_words(waiting)} "
        f"{'is' if len(waiting) == 1 else 'are'} waiting in"
    )
    step = ranks.step_of(waiting)
    if step is not None:
        msg += f" since step {step}"
    msg += _where_words(texts) + " (from the ranks' stacks: no flight recorder)"
    if missing:
        msg += f"; no answer from {_ranks_words(missing)}"
    return [
        HangCase(
            kind="hang",
            op=op,
            seq=None,
            pg_name="",
            pg_desc="",
            culprits=culprits,
            waiting=waiting,
            waited_ns=None,
            step=step,
            where=texts,
            where_frames=frames,
            explained_by=None,
            incomplete=bool(missing),
            message=msg,
            evidence="stacks",
        )
    ]


def _where_words(texts: Mapping[int, str]) -> str:
    return "".join(f"; rank {r} is in {t}" for r, t in sorted(texts.items()))


def _stall_message(
    st: GroupStall, texts: Mapping[int, str], step: int | None, a: HangAnalysis
) -> str:
    group = _group_words(st.pg_desc, st.pg_name)
    what = f"{st.op} #{st.seq} ({group})"
    if st.p2p:
        what = f"its side of {st.op} (point-to-point #{st.seq}, {group})"
    waiting = [w.rank for w in st.stuck]
    if st.never_entered:
        msg = f"{_ranks_words(st.never_entered)} never entered {what}"
        if waiting:
            msg += (
                f" that {_ranks_words(waiting)} {'has' if len(waiting) == 1 else 'have'} "
                f"waited in{_for(st.waited_ns)}"
            )
    elif st.mismatches:
        msg = _disagree(st.culprits, st.op, st.seq, group, st.mismatches[0])
        if waiting:
            msg += f"; {_ranks_words(waiting)} wait in it{_for(st.waited_ns)}"
    else:
        msg = (
            f"{_ranks_words(waiting)} {'has' if len(waiting) == 1 else 'have'} waited in {what}"
            f"{_for(st.waited_ns)}"
        )
    if step is not None:
        msg += f" since step {step}"
    for r, label in st.blocked_in:
        msg += f"; rank {r} is itself stuck in {label}"
    if st.explained_by is not None:
        msg += f" (explained by the stall in {st.explained_by})"
    msg += _where_words(texts)
    if st.unknown:
        msg += (
            f"; no dump from {_ranks_words(st.unknown)}: "
            "whether they entered it is unknown (result incomplete)"
        )
    del a
    return msg


def _disagree(culprits: Sequence[int], op: str, seq: int, group: str, m: Mismatch) -> str:
    who = _ranks_words(culprits)
    if m.what == "op":
        return (
            f"{who} called {m.found} as collective #{seq} ({group}) where the others "
            f"called {m.expected}: a skipped or reordered collective"
        )
    return (
        f"{who} called {op} #{seq} ({group}) with {m.what.replace('_', ' ')} {m.found} "
        f"where the others use {m.expected}"
    )


def _mismatch_message(m: GroupStall) -> str:
    group = _group_words(m.pg_desc, m.pg_name)
    return _disagree(m.culprits, m.op, m.seq, group, m.mismatches[0])
