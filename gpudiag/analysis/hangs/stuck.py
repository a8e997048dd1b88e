"""Stuck and mismatched collectives from flight-recorder dumps: who never arrived, who waits.

Metric (per process group, :mod:`gpudiag.analysis.hangs.wavefront`): the *wavefront*, the
first operation (by ``collective_seq_id``; point-to-point by ``p2p_seq_id`` or per pair)
some members entered and others did not. For each member: it finished it, it is *stuck*
in it (entered, not finished; waited = the dump's time − the entry's ``time_created_ns``),
it *never entered* it (its position in the group is below it), or it is *unknown* (no
dump, or its buffer no longer reaches that far). A group whose members all entered the
same operations stalls at its first unfinished one, with no never-entered rank.

Mismatch: only where the operation requires agreement (wavefront.AGREEMENT_OPS); a
different operation at one sequence id is a desync.

Which stall explains the others. A rank that never entered A but is stuck in B (the
earliest stall it entered) holds A up: A → B. A stall whose never-entered ranks are all
never-entered in a stall entered earlier is the same absence seen later: A → B. Stalls
with no outgoing edge are the roots (a cycle keeps its earliest); a group where every
member entered and waits is an effect of the roots. The verdict is the first root: the
collective everyone ultimately waits for and the ranks that never reached it.

Nothing is guessed: ranks without a dump are named, and any result they could change is
marked incomplete. No I/O: the dumps arrive parsed (``gpudiag.traces.runfiles.flightrec``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import field, replace
from typing import Any

from gpudiag._support.records import dataclass
from gpudiag.analysis.hangs.stack_frames import user_frames, where_text
from gpudiag.analysis.hangs.wavefront import (
    Group,
    GroupStall,
    Mismatch,
    RankWait,
    collective_stall,
    completed_seq,
    p2p_stall,
)
from gpudiag.traces.runfiles.flightrec import FrDump, ThreadStack

__all__ = ["GroupStall", "HangAnalysis", "Mismatch", "RankWait", "analyze_dumps"]


@dataclass(frozen=True)
class HangAnalysis:
    """Every stalled or mismatched operation found in a set of dumps."""

    stalls: tuple[GroupStall, ...]
    mismatches: tuple[GroupStall, ...]  # collectives whose ranks disagree (finished or not)
    dump_ranks: tuple[int, ...]
    missing_dumps: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def incomplete(self) -> bool:
        """Some member's dump is missing, so a result may be missing too."""
        return bool(self.missing_dumps)

    @property
    def roots(self) -> tuple[GroupStall, ...]:
        """The stalls that explain the others (not themselves explained by another)."""
        return tuple(s for s in self.stalls if s.explained_by is None)


def _members(
    name: str, desc: str, dumps: Sequence[FrDump], world: int | None, users: set[int]
) -> tuple[tuple[int, ...], bool]:
    found: set[int] = set()
    for d in dumps:
        g = d.groups.get(name)
        if g is not None and g.ranks:
            found.update(g.ranks)
    if found:
        return tuple(sorted(found)), False
    # gloo in torch 2.13 writes an empty pg_config: the default group is the whole world,
    # any other group is known only by the ranks that recorded it.
    if desc == "default_pg" or name == "0":
        n = world if world is not None else max(d.rank for d in dumps) + 1
        return tuple(range(n)), world is None
    return tuple(sorted(users)), True


def analyze_dumps(dumps: Sequence[FrDump], world: int | None = None) -> HangAnalysis:
    """Stalls and mismatches of every process group in ``dumps`` (one per rank)."""
    by_rank = {d.rank: d for d in dumps}
    groups: dict[str, str] = {}
    users: dict[str, set[int]] = defaultdict(set)
    for d in dumps:
        for e in d.entries:
            groups.setdefault(e.pg_name, e.pg_desc)
            users[e.pg_name].add(d.rank)
    all_members: set[int] = set(by_rank)
    stalls: list[GroupStall] = []
    mismatches: list[GroupStall] = []
    notes: list[str] = []
    for name in sorted(groups, key=lambda n: (len(n), n)):
        desc = groups[name]
        members, inferred = _members(name, desc, dumps, world, users[name])
        all_members.update(members)
        if inferred:
            notes.append(
                f"process group {desc or name}: the dumps do not list its ranks (gloo writes an "
                f"empty pg_config); taken as {list(members)}"
            )
        g = Group(name, desc, members, inferred)
        stall, mismatch = collective_stall(g, by_rank)
        if stall is not None:
            stalls.append(stall)
        if mismatch is not None:
            mismatches.append(mismatch)
        p2p = p2p_stall(g, by_rank)
        if p2p is not None:
            stalls.append(p2p)
    missing = tuple(sorted(all_members - set(by_rank)))
    if missing:
        notes.append(_missing_note(missing, stalls))
    versions: dict[str, list[int]] = defaultdict(list)
    for d in dumps:
        versions[d.version].append(d.rank)
    if len(versions) > 1:
        each = "; ".join(f"{v} on {_ranks_words(rs)}" for v, rs in sorted(versions.items()))
        notes.append(
            f"the dumps come from different flight-recorder versions ({each}): compared on "
            "the fields each carries (sizes, dtypes or pg_status may be missing on some)"
        )
    empty = sorted(d.rank for d in dumps if not d.entries)
    if empty:
        notes.append(
            f"the dumps of {_ranks_words(empty)} hold no entry: where they were is unknown"
        )
    last_seen = {d.rank: max(e.created_ns for e in d.entries) for d in dumps if d.entries}
    explained = [_last_done(st, by_rank) for st in _explain(stalls, last_seen)]
    return HangAnalysis(
        stalls=tuple(explained),
        mismatches=tuple(mismatches),
        dump_ranks=tuple(sorted(by_rank)),
        missing_dumps=missing,
        notes=tuple(notes),
    )


def _ranks_words(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _missing_note(missing: Sequence[int], stalls: Sequence[GroupStall]) -> str:
    touched = sorted({s.pg_desc or s.pg_name for s in stalls if set(s.unknown) & set(missing)})
    what = (
        f"whether they entered the stuck operations of {', '.join(touched)} is unknown, so a "
        "root among them cannot be ruled out"
        if touched
        else "what they were doing is unknown"
    )
    return f"no dump from {_ranks_words(missing)}: {what}"


def _last_done(st: GroupStall, by_rank: dict[int, FrDump]) -> GroupStall:
    """Where each never-entered rank was: its last finished and last entered operation."""
    out = []
    for r in st.never_entered:
        d = by_rank.get(r)
        if d is None or not d.entries:
            continue
        own = [e for e in d.entries if e.pg_name == st.pg_name]
        done = [e for e in own if e.done]
        last = max(d.entries, key=lambda e: (e.created_ns, e.record_id))
        state = "finished" if last.done else "not finished"
        words = [
            f"'s last operation: {last.op} #{last.p2p_seq if last.is_p2p else last.seq} "
            f"({last.pg_desc or last.pg_name}, {state})"
        ]
        status = completed_seq(d, st.pg_name)
        if done:
            e = max(done, key=lambda e: e.record_id)
            words.append(f" last finished here: {e.op} #{e.p2p_seq if e.is_p2p else e.seq}")
        elif status is not None and not st.p2p:
            words.append(f" last finished here: #{status} (its pg_status)")
        frames = user_frames(ThreadStack("", True, last.frames))
        if frames:
            words.append(f" called from {where_text(frames)}")
        out.append((r, ",".join(words)))
    return replace(st, last_done=tuple(out))


def _explain(stalls: list[GroupStall], last_seen: dict[int, int]) -> list[GroupStall]:
    """Link each stall to the one that holds its absent ranks (see the module docstring)."""

    def key(s: GroupStall) -> tuple[bool, int, int, str]:
        # entered after its absent ranks recorded their last operation: where they stopped;
        # entered while they still ran: they were on their way (later in their own program)
        t = s.entered_ns or 0
        after = all(last_seen.get(r, -1) < t for r in s.never_entered)
        return (not after, t, -len(s.never_entered), s.pg_name)

    first_in: dict[int, tuple[int, GroupStall]] = {}  # rank → the stall it entered first
    for st in stalls:
        for w in st.stuck:
            t = st.entered_ns or 0
            if w.rank not in first_in or t < first_in[w.rank][0]:
                first_in[w.rank] = (t, st)
    out: list[GroupStall] = []
    for st in stalls:
        blocked = tuple(
            (r, first_in[r][1].label)
            for r in st.never_entered
            if r in first_in and first_in[r][1] is not st
        )
        explained = None
        for _, label in blocked:
            b = next(x for x in stalls if x.label == label)
            held = {w.rank for w in b.stuck} | set(b.never_entered)
            if set(st.never_entered) <= held:
                explained = label
                break
        if explained is None and st.never_entered:
            explained = _same_absence(st, stalls, key)
        out.append(replace(st, blocked_in=blocked, explained_by=explained))
    out = _break_cycles(out)
    roots = [s for s in out if s.explained_by is None and s.never_entered]
    if roots:
        # every member entered and waits: an effect of the root, not a cause
        root = min(roots, key=key)
        out = [
            replace(s, explained_by=root.label)
            if s.explained_by is None and not s.never_entered and not s.mismatches
            else s
            for s in out
        ]
    out.sort(key=lambda s: (s.explained_by is not None, not s.never_entered, key(s)))
    return out


def _same_absence(
    st: GroupStall, stalls: Sequence[GroupStall], key: Callable[[GroupStall], Any]
) -> str | None:
    """A stall before ``st`` (by ``key``) every never-entered rank of ``st`` is absent from."""
    mine = set(st.never_entered)
    before = [
        b for b in stalls if b is not st and mine <= set(b.never_entered) and key(b) < key(st)
    ]
    return min(before, key=key).label if before else None


def _break_cycles(out: list[GroupStall]) -> list[GroupStall]:
    """A chain of explanations that comes back to itself keeps its earliest stall as a root."""
    by_label = {s.label: i for i, s in enumerate(out)}
    for i in range(len(out)):
        seen: list[int] = []
        j: int | None = i
        while j is not None and j not in seen:
            seen.append(j)
            nxt = out[j].explained_by
            j = by_label.get(nxt) if nxt is not None else None
        if j is not None:  # a cycle through j
            cycle = seen[seen.index(j) :]
            keep = min(cycle, key=lambda k: (out[k].entered_ns or 0, out[k].pg_name))
            out[keep] = replace(out[keep], explained_by=None)
    return out
