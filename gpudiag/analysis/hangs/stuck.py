"""Stuck and mismatched collectives from flight-recorder dumps: who never arrived, who waits.

Metric. Per process group, the first collective (by ``collective_seq_id``) that not every
member with a dump has finished. For each member: it finished it, it is *stuck* in it
(entered, not finished; waited = the dump's time − the entry's ``time_created_ns``), it
*never entered* it (its last entry in the group is older), or it is *unknown* (no dump,
or its ring buffer no longer reaches that far). Point-to-point operations are matched
per (sender, receiver) pair in order: the k-th ``send a->b`` with the k-th ``recv b<-a``.
Entries sharing a sequence id on one rank are one coalesced collective.

Mismatch. Each collective present on several ranks is compared (operation, input and
output sizes, dtypes) with the value most ranks have (the lowest rank breaks ties);
ranks that differ are the culprits, the earliest such collective per group is reported.

Which stall explains the others. A rank that never entered a collective of group A but
is stuck in group B does not cause A's stall: B's does. Stalls form a graph (A → B);
those with no outgoing edge are the roots, the culprits their never-entered ranks.

Nothing is guessed: ranks without a dump are named, and any result they could change is
marked incomplete. No I/O: the dumps arrive parsed (``gpudiag.traces.runfiles.flightrec``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import field, replace

from gpudiag._support.records import dataclass
from gpudiag.traces.runfiles.flightrec import FrDump, FrEntry


@dataclass(frozen=True)
class RankWait:
    """A rank inside the stuck operation, and for how long (up to its dump)."""

    rank: int
    waited_ns: int | None  # None: the dump's time is unknown
    state: str


@dataclass(frozen=True)
class Mismatch:
    """A rank whose operation differs from what most members called."""

    rank: int
    what: str  # "op", "input_sizes", "output_sizes", "dtypes"
    expected: str
    found: str


@dataclass(frozen=True)
class GroupStall:
    """The first operation of a process group that not every member finished."""

    pg_name: str
    pg_desc: str
    members: tuple[int, ...]
    members_inferred: bool  # the dumps did not list the group's ranks
    backend: str
    op: str
    seq: int  # collective_seq_id (p2p_seq_id of the sender for a send/recv)
    p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...] | None
    stuck: tuple[RankWait, ...]
    never_entered: tuple[int, ...]
    finished: tuple[int, ...]
    unknown: tuple[int, ...]  # no dump, or the dump no longer reaches this operation
    mismatches: tuple[Mismatch, ...] = ()
    blocked_in: tuple[tuple[int, str], ...] = ()  # (never-entered rank, label of its stall)
    explained_by: str | None = None
    record_id: int | None = None

    @property
    def label(self) -> str:
        """``all_reduce #12 (default_pg)``."""
        group = self.pg_desc or self.pg_name
        return f"{self.op} #{self.seq} ({group})"

    @property
    def waited_ns(self) -> int | None:
        """The longest known wait of a stuck rank (None when none is known)."""
        return max((w.waited_ns for w in self.stuck if w.waited_ns is not None), default=None)

    @property
    def culprits(self) -> tuple[int, ...]:
        """Ranks that never entered, else the ranks that disagree."""
        if self.never_entered:
            return self.never_entered
        return tuple(sorted({m.rank for m in self.mismatches}))


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


def _unit_done(unit: Sequence[FrEntry]) -> bool:
    return all(e.done for e in unit)


def _unit_op(unit: Sequence[FrEntry]) -> str:
    ops = [e.op for e in unit if e.op != "coalesced"]
    if len(unit) > 1 or (unit and unit[0].op == "coalesced"):
        return "coalesced[" + ",".join(ops) + "]" if ops else "coalesced"
    return unit[0].op


def _sizes(unit: Sequence[FrEntry], which: str) -> str:
    per = [[list(s) for s in getattr(e, which)] for e in unit if e.op != "coalesced"]
    return str(per[0] if len(per) == 1 else per)


def _dtypes(unit: Sequence[FrEntry]) -> str | None:
    if any(e.input_dtypes is None for e in unit):
        return None
    per = [
        "/".join(e.input_dtypes or ()) + (" → " + "/".join(e.output_dtypes or ()))
        for e in unit
        if e.op != "coalesced"
    ]
    return per[0] if len(per) == 1 else str(per)


def _compare(units: Mapping[int, Sequence[FrEntry]]) -> tuple[Mismatch, ...]:
    """Ranks whose unit differs from the majority, field by field (first differing field)."""
    if len(units) < 2:
        return ()
    keys: dict[str, dict[int, str | None]] = {
        "op": {r: _unit_op(u) for r, u in units.items()},
        "input_sizes": {r: _sizes(u, "input_sizes") for r, u in units.items()},
        "output_sizes": {r: _sizes(u, "output_sizes") for r, u in units.items()},
        "dtypes": {r: _dtypes(u) for r, u in units.items()},
    }
    out: list[Mismatch] = []
    seen: set[int] = set()
    for what, values in keys.items():
        known = {r: v for r, v in values.items() if v is not None}
        if len(set(known.values())) <= 1:
            continue
        counts = Counter(known.values())
        top = max(counts.values())
        expected = next(v for r, v in sorted(known.items()) if counts[v] == top)
        for r, v in sorted(known.items()):
            if v != expected and r not in seen:
                out.append(Mismatch(r, what, expected, v))
                seen.add(r)
    return tuple(out)


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
        stall, mismatch = _collective_stall(name, desc, members, inferred, by_rank)
        if stall is not None:
            stalls.append(stall)
        if mismatch is not None:
            mismatches.append(mismatch)
        p2p = _p2p_stall(name, desc, members, inferred, by_rank)
        if p2p is not None:
            stalls.append(p2p)
    missing = tuple(sorted(all_members - set(by_rank)))
    return HangAnalysis(
        stalls=tuple(_explain(stalls)),
        mismatches=tuple(mismatches),
        dump_ranks=tuple(sorted(by_rank)),
        missing_dumps=missing,
        notes=tuple(notes),
    )


def _waited(d: FrDump, created_ns: int) -> int | None:
    return None if d.dumped_ns is None else max(0, d.dumped_ns - created_ns)


def _collective_stall(
    name: str, desc: str, members: tuple[int, ...], inferred: bool, by_rank: Mapping[int, FrDump]
) -> tuple[GroupStall | None, GroupStall | None]:
    units: dict[int, dict[int, list[FrEntry]]] = {}
    for r in members:
        d = by_rank.get(r)
        if d is None:
            continue
        per_seq: dict[int, list[FrEntry]] = defaultdict(list)
        for e in d.entries:
            if e.pg_name == name and not e.is_p2p:
                per_seq[e.seq].append(e)
        units[r] = dict(per_seq)
    if not units:
        return None, None
    # The frontier: the lowest sequence id some rank has not finished.
    nxt: dict[int, int] = {}
    for r, u in units.items():
        pending = [s for s, unit in u.items() if not _unit_done(unit)]
        nxt[r] = min(pending) if pending else (max(u) + 1 if u else 1)
    s = min(nxt.values())
    last_seen = max((max(u) for u in units.values() if u), default=0)
    mismatch = _first_mismatch(name, desc, members, inferred, units, s)
    if s > last_seen:
        return None, mismatch
    ref_rank = min(r for r, u in units.items() if s in u)
    ref = units[ref_rank][s]
    stuck: list[RankWait] = []
    never: list[int] = []
    finished: list[int] = []
    unknown: list[int] = []
    for r in members:
        if r not in units:
            unknown.append(r)
            continue
        u = units[r]
        if s in u:
            if _unit_done(u[s]):
                finished.append(r)
            else:
                waited = _waited(by_rank[r], min(e.created_ns for e in u[s]))
                stuck.append(RankWait(r, waited, u[s][0].state))
        elif u and min(u) > s:
            unknown.append(r)  # its ring buffer starts after s
        else:
            never.append(r)
    if not stuck and not never:
        return None, mismatch
    at_s = {r: u[s] for r, u in units.items() if s in u}
    return GroupStall(
        pg_name=name,
        pg_desc=desc,
        members=members,
        members_inferred=inferred,
        backend=ref[0].backend,
        op=_unit_op(ref),
        seq=s,
        p2p=False,
        input_sizes=tuple(sz for e in ref for sz in e.input_sizes),
        input_dtypes=ref[0].input_dtypes,
        stuck=tuple(stuck),
        never_entered=tuple(never),
        finished=tuple(finished),
        unknown=tuple(unknown),
        mismatches=_compare(at_s),
        record_id=ref[0].record_id,
    ), mismatch


def _first_mismatch(
    name: str,
    desc: str,
    members: tuple[int, ...],
    inferred: bool,
    units: Mapping[int, Mapping[int, list[FrEntry]]],
    frontier: int,
) -> GroupStall | None:
    seqs = sorted({s for u in units.values() for s in u if s <= frontier})
    for s in seqs:
        at_s = {r: u[s] for r, u in units.items() if s in u}
        found = _compare(at_s)
        if not found:
            continue
        ref_rank = min(at_s)
        ref = at_s[ref_rank]
        return GroupStall(
            pg_name=name,
            pg_desc=desc,
            members=members,
            members_inferred=inferred,
            backend=ref[0].backend,
            op=_unit_op(ref),
            seq=s,
            p2p=False,
            input_sizes=tuple(sz for e in ref for sz in e.input_sizes),
            input_dtypes=ref[0].input_dtypes,
            stuck=tuple(
                RankWait(r, 0, u[0].state) for r, u in sorted(at_s.items()) if not _unit_done(u)
            ),
            never_entered=(),
            finished=tuple(r for r, u in sorted(at_s.items()) if _unit_done(u)),
            unknown=tuple(r for r in members if r not in units),
            mismatches=found,
            record_id=ref[0].record_id,
        )
    return None


def _p2p_stall(
    name: str, desc: str, members: tuple[int, ...], inferred: bool, by_rank: Mapping[int, FrDump]
) -> GroupStall | None:
    ordered = sorted(members)

    def glob(local: int | None) -> int | None:
        return ordered[local] if local is not None and 0 <= local < len(ordered) else None

    # (src, dst) → that pair's sends on src and receives on dst, in order.
    sends: dict[tuple[int, int], list[FrEntry]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[FrEntry]] = defaultdict(list)
    for d in by_rank.values():
        for e in d.entries:
            if e.pg_name != name or e.op not in ("send", "recv"):
                continue
            src, dst = glob(e.src), glob(e.dst)
            if src is None or dst is None:
                continue
            (sends if e.op == "send" else recvs)[(src, dst)].append(e)
    best: tuple[int, GroupStall] | None = None
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        s_list, r_list = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(s_list), len(r_list))):
            snd = s_list[k] if k < len(s_list) else None
            rcv = r_list[k] if k < len(r_list) else None
            if (snd is None or snd.done) and (rcv is None or rcv.done):
                continue
            stall = _pair_stall(name, desc, members, inferred, by_rank, src, dst, snd, rcv)
            if stall is not None:
                created = min(e.created_ns for e in (snd, rcv) if e is not None)
                if best is None or created < best[0]:
                    best = (created, stall)
            break
    return best[1] if best else None


def _pair_stall(
    name: str,
    desc: str,
    members: tuple[int, ...],
    inferred: bool,
    by_rank: Mapping[int, FrDump],
    src: int,
    dst: int,
    snd: FrEntry | None,
    rcv: FrEntry | None,
) -> GroupStall | None:
    stuck: list[RankWait] = []
    never: list[int] = []
    unknown: list[int] = []
    finished: list[int] = []
    for rank, e in ((src, snd), (dst, rcv)):
        if e is None:
            (never if rank in by_rank else unknown).append(rank)
        elif e.done:
            finished.append(rank)
        else:
            stuck.append(RankWait(rank, _waited(by_rank[rank], e.created_ns), e.state))
    if not stuck:
        return None
    ref = snd if snd is not None else rcv
    assert ref is not None
    mism: tuple[Mismatch, ...] = ()
    if snd is not None and rcv is not None and snd.input_sizes != rcv.output_sizes:
        mism = (
            Mismatch(
                dst,
                "output_sizes",
                str([list(x) for x in snd.input_sizes]),
                str([list(x) for x in rcv.output_sizes]),
            ),
        )
    return GroupStall(
        pg_name=name,
        pg_desc=desc,
        members=members,
        members_inferred=inferred,
        backend=ref.backend,
        op=f"send {src}->{dst}",
        seq=ref.p2p_seq,
        p2p=True,
        input_sizes=ref.input_sizes if ref is snd else ref.output_sizes,
        input_dtypes=ref.input_dtypes,
        stuck=tuple(stuck),
        never_entered=tuple(never),
        finished=tuple(finished),
        unknown=tuple(unknown),
        mismatches=mism,
        record_id=ref.record_id,
    )


def _explain(stalls: list[GroupStall]) -> list[GroupStall]:
    """Link each stall to the one its absent ranks are held in.

    A is explained by B when a rank that never entered A is stuck in B, and every other
    rank that never entered A is stuck in B or never entered B either (B's culprits).
    """
    stuck_in: dict[int, GroupStall] = {}
    for st in sorted(stalls, key=lambda s: -(s.waited_ns or 0)):
        for w in st.stuck:
            stuck_in.setdefault(w.rank, st)
    out: list[GroupStall] = []
    for st in stalls:
        blocked = tuple(
            (r, stuck_in[r].label)
            for r in st.never_entered
            if r in stuck_in and stuck_in[r] is not st
        )
        explained = None
        for _, label in blocked:
            b = next(x for x in stalls if x.label == label)
            held = {w.rank for w in b.stuck} | set(b.never_entered)
            if set(st.never_entered) <= held:
                explained = label
                break
        out.append(replace(st, blocked_in=blocked, explained_by=explained))
    # A cycle (A waits for B, B for A) has no root: keep the longest wait as the root.
    if out and all(s.explained_by is not None for s in out):
        oldest = max(range(len(out)), key=lambda i: out[i].waited_ns or 0)
        out[oldest] = replace(out[oldest], explained_by=None)
    # Roots first, then by the longest wait.
    out.sort(key=lambda s: (s.explained_by is not None, -(s.waited_ns or 0), s.pg_name))
    return out
