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
from gpudiag.analysis.model.kinds import HangEvidence
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
    evidence: HangEvidence
    mismatch: tuple[Mismatch, ...] = ()
    # the stalls this root explains: (label, the ranks waiting in it)
    effects: tuple[tuple[str, tuple[int, ...]], ...] = ()


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


def _effects(analysis: HangAnalysis) -> dict[str, list[GroupStall]]:
    """Root label → every stall it explains, directly or through others."""
    by_label = {s.label: s for s in analysis.stalls}
    out: dict[str, list[GroupStall]] = {}
    for st in analysis.stalls:
        root, seen = st, {st.label}
        while root.explained_by is not None and root.explained_by in by_label:
            root = by_label[root.explained_by]
            if root.label in seen:
                break
            seen.add(root.label)
        if root is not st:
            out.setdefault(root.label, []).append(st)
    return out


def _dump_cases(analysis: HangAnalysis, ranks: _Ranks) -> list[HangCase]:
    out: list[HangCase] = []
    effects = _effects(analysis)
    for st in analysis.stalls:
        if st.explained_by is not None:
            continue  # an effect: listed under its root
        waiting = tuple(w.rank for w in st.stuck)
        texts, frames = ranks.where(st.culprits)
        step = ranks.step_of(waiting)
        eff = tuple(
            (e.label, tuple(w.rank for w in e.stuck))
            for e in sorted(effects.get(st.label, []), key=lambda e: e.entered_ns or 0)
        )
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
                message=_stall_message(st, texts, step, eff, analysis.missing_dumps),
                evidence="flight recorder",
                mismatch=st.mismatches,
                effects=eff,
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


def _shape(st: GroupStall) -> str:
    """``2048x5120 BFloat16`` (the sizes and dtype of the lowest rank that entered it)."""
    sizes = ", ".join("x".join(str(n) for n in sz) for sz in st.input_sizes[:3])
    if len(st.input_sizes) > 3:
        sizes += ", …"
    dt = "/".join(dict.fromkeys(st.input_dtypes or ()))
    return " ".join(x for x in (sizes, dt) if x)


def _on(st: GroupStall) -> str:
    """``EXPERT_MODEL_PARALLEL_GROUP (pg 72, 8 ranks, 2048x5120 BFloat16)``."""
    default = st.pg_desc in ("default_pg", "") and st.pg_name in ("0", "")
    name = "the default group" if default else (st.pg_desc or f"group {st.pg_name}")
    facts = [f"pg {st.pg_name}" if st.pg_name else "", f"{len(st.members)} ranks", _shape(st)]
    return f"{name} ({', '.join(f for f in facts if f)})"


def _have(ranks: Sequence[int]) -> str:
    return "has" if len(ranks) == 1 else "have"


def _stall_message(
    st: GroupStall,
    texts: Mapping[int, str],
    step: int | None,
    effects: Sequence[tuple[str, tuple[int, ...]]] = (),
    missing: Sequence[int] | None = None,
) -> str:
    """The root's sentence; ``missing``: ranks without a dump (None: every unknown rank)."""
    missing = st.unknown if missing is None else missing
    waiting = [w.rank for w in st.stuck]
    what = f"{st.op} #{st.seq}" if not st.p2p else f"{st.op} (point-to-point #{st.seq})"
    what += f" on {_on(st)}"
    if st.never_entered:
        msg = f"{what}: {_ranks_words(st.never_entered)} never entered it"
        if waiting:
            msg += f"; {_ranks_words(waiting)} {_have(waiting)} waited in it{_for(st.waited_ns)}"
    elif st.mismatches:
        group = _group_words(st.pg_desc, st.pg_name)
        msg = _disagree(st.culprits, st.op, st.seq, group, st.mismatches[0])
        if waiting:
            msg += f"; {_ranks_words(waiting)} wait in it{_for(st.waited_ns)}"
    else:
        msg = f"{_ranks_words(waiting)} {_have(waiting)} waited in {what}{_for(st.waited_ns)}"
    if step is not None:
        msg += f" since step {step}"
    for r, label in st.blocked_in:
        msg += f"; rank {r} is itself stuck in {label}"
    if st.explained_by is not None:
        msg += f" (explained by the stall in {st.explained_by})"
    msg += _where_words(texts)
    for r, words in st.last_done:
        if r not in texts:
            msg += f"; rank {r}{words}"
    absent = [r for r in st.unknown if r in missing]
    wrapped = [r for r in st.unknown if r not in missing]
    if absent:
        msg += (
            f"; no dump from {_ranks_words(absent)}: "
            "whether they entered it is unknown (result incomplete)"
        )
    if wrapped:
        msg += (
            f"; the dumps of {_ranks_words(wrapped)} no longer reach it (their buffer wrapped "
            "or holds nothing): whether they entered it is unknown (result incomplete)"
        )
    if effects:
        held = sorted({r for _, rs in effects for r in rs} - set(waiting) - set(st.culprits))
        if held:
            msg += (
                f"; because of it {_ranks_words(held)} {'waits' if len(held) == 1 else 'wait'} "
                f"in {len(effects)} other "
                f"operation{'s' if len(effects) != 1 else ''}"
            )
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
