"""Per process group, the wavefront of a stuck job: the first operation only some members entered.

Collectives are matched by ``collective_seq_id``. A rank's *position* in a group is the
highest sequence id it entered: its entries, or ``pg_status.last_enqueued_collective``
(keyed by the rank's own ``pg_id``) where the group carries no point-to-point work on that
rank (the recorder counts both kinds in that one counter). When positions differ, the
wavefront is the lowest position + 1: the members at the lowest position never entered
it, the others did (finished, or stuck in it). When every member is at the same position,
the group's stall is its first operation some member entered and has not finished (every
member entered it: they all wait, for something outside the group).

Point-to-point operations are matched by ``p2p_seq_id`` where every rank of the group
talks to one peer only (then both sides count the same operations), else the k-th
``send a->b`` with the k-th ``recv b<-a``; a side whose position is below the other's
pending operation never entered it.

Mismatch: only where the operation requires the ranks to agree. Sizes and dtypes are
compared for the reducing, broadcasting and gathering collectives (:data:`AGREEMENT_OPS`);
the per-rank splits of ``all_to_all`` legitimately differ (expert parallelism) and are
never compared, nor are gather/scatter's root-only buffers. A different operation or a
different number of operations at one sequence id is a desync, for every operation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from gpudiag._support.records import dataclass
from gpudiag.traces.runfiles.flightrec import FrDump, FrEntry

# Collectives whose ranks must pass the same sizes and dtypes.
AGREEMENT_OPS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "allreduce_coalesced",
        "all_reduce_coalesced",
        "reduce",
        "broadcast",
        "all_gather",
        "allgather",
        "_all_gather_base",
        "all_gather_into_tensor",
        "allgather_into_tensor_coalesced",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
    }
)
# Collectives whose ranks must agree on dtypes but not on sizes (per-rank splits).
SPLIT_OPS = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single"})


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
    entered_ns: int | None = None  # when the first rank entered it (its time_created_ns)
    last_done: tuple[tuple[int, str], ...] = ()  # never-entered rank → its last finished op

    @property
    def label(self) -> str:
        """``all_reduce #12 (default_pg, pg 0)``: unique in a job (groups share descs)."""
        if self.pg_desc and self.pg_desc != self.pg_name:
            return f"{self.op} #{self.seq} ({self.pg_desc}, pg {self.pg_name})"
        return f"{self.op} #{self.seq} (pg {self.pg_name})"

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
class Group:
    """A process group as the analysis sees it: name, desc, members."""

    name: str
    desc: str
    members: tuple[int, ...]
    inferred: bool


Units = dict[int, list[FrEntry]]  # sequence id → the rank's entries with that id


def _units(d: FrDump, name: str) -> Units:
    per_seq: Units = defaultdict(list)
    for e in d.entries:
        if e.pg_name == name and not e.is_p2p:
            per_seq[e.seq].append(e)
    return dict(per_seq)


def _status(d: FrDump, name: str) -> Mapping[str, int]:
    """The rank's ``pg_status`` counters of the group, when they count collectives only."""
    own = [e for e in d.entries if e.pg_name == name]
    ids = {e.pg_id for e in own}
    if len(ids) != 1 or any(e.is_p2p for e in own):
        return {}
    (pid,) = ids
    return d.pg_status.get(str(pid), {}) if pid is not None else {}


def _position(d: FrDump, name: str, units: Units) -> int | None:
    enq = max(units) if units else None
    last = _status(d, name).get("last_enqueued_collective")
    if last is not None and last >= 0 and units:
        enq = last if enq is None else max(enq, last)
    return enq


def _completed(d: FrDump, name: str) -> int:
    return _status(d, name).get("last_completed_collective", -1)


def completed_seq(d: FrDump, name: str) -> int | None:
    """The last collective of the group the rank's ``pg_status`` says it finished."""
    n = _completed(d, name)
    return n if n >= 0 else None


def _done(unit: Sequence[FrEntry]) -> bool:
    return all(e.done for e in unit)


def unit_op(unit: Sequence[FrEntry]) -> str:
    """The operation of a unit (``coalesced[all_reduce,all_reduce]`` for a coalesced one)."""
    ops = [e.op for e in unit if e.op != "coalesced"]
    if len(unit) > 1 or (unit and unit[0].op == "coalesced"):
        return "coalesced[" + ",".join(ops) + "]" if ops else "coalesced"
    return unit[0].op if unit else "collective"


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


def _agree(unit: Sequence[FrEntry], ops: frozenset[str]) -> bool:
    return bool(unit) and all(e.op in ops or e.op == "coalesced" for e in unit)


def compare(units: Mapping[int, Sequence[FrEntry]]) -> tuple[Mismatch, ...]:
    """Ranks whose unit differs from the majority where the operation requires agreement."""
    units = {r: u for r, u in units.items() if u}
    if len(units) < 2:
        return ()
    keys: dict[str, dict[int, str | None]] = {"op": {r: unit_op(u) for r, u in units.items()}}
    if len(set(keys["op"].values())) == 1:
        first = next(iter(units.values()))
        if _agree(first, AGREEMENT_OPS):
            keys["input_sizes"] = {r: _sizes(u, "input_sizes") for r, u in units.items()}
            keys["output_sizes"] = {r: _sizes(u, "output_sizes") for r, u in units.items()}
        if _agree(first, AGREEMENT_OPS | SPLIT_OPS):
            keys["dtypes"] = {r: _dtypes(u) for r, u in units.items()}
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


def _waited(d: FrDump, created_ns: int) -> int | None:
    return None if d.dumped_ns is None else max(0, d.dumped_ns - created_ns)


def collective_stall(
    g: Group, by_rank: Mapping[int, FrDump]
) -> tuple[GroupStall | None, GroupStall | None]:
    """The group's collective stall (wavefront, else frontier) and its first mismatch."""
    units = {r: _units(by_rank[r], g.name) for r in g.members if r in by_rank}
    pos = {r: p for r, u in units.items() if (p := _position(by_rank[r], g.name, u)) is not None}
    if not pos:
        return None, None
    lo, hi = min(pos.values()), max(pos.values())
    if hi > lo:
        s = lo + 1
    else:
        pending = [
            q
            for r, u in units.items()
            for q, unit in u.items()
            if not _done(unit) and q > _completed(by_rank[r], g.name)
        ]
        if not pending:
            return None, _first_mismatch(g, units, hi)
        s = min(pending)
    return _stall_at(g, by_rank, units, pos, s), _first_mismatch(g, units, s)


def _stall_at(
    g: Group,
    by_rank: Mapping[int, FrDump],
    units: Mapping[int, Units],
    pos: Mapping[int, int],
    s: int,
) -> GroupStall | None:
    at_s = {r: u[s] for r, u in units.items() if u.get(s)}
    ref = at_s[min(at_s)] if at_s else []
    entered_ns = min((e.created_ns for u in at_s.values() for e in u), default=None)
    stuck: list[RankWait] = []
    never: list[int] = []
    finished: list[int] = []
    unknown: list[int] = []
    for r in g.members:
        d = by_rank.get(r)
        if d is None:
            unknown.append(r)
        elif r not in pos:
            # no entry of the group: never entered, unless its buffer starts after the op
            first = min((e.created_ns for e in d.entries), default=None)
            late = first is None or (entered_ns is not None and first > entered_ns)
            (unknown if late else never).append(r)
        elif pos[r] < s:
            never.append(r)
        elif r in at_s and not _done(at_s[r]) and _completed(d, g.name) < s:
            waited = _waited(d, min(e.created_ns for e in at_s[r]))
            stuck.append(RankWait(r, waited, at_s[r][0].state))
        else:
            finished.append(r)  # finished it, or past it (no longer in its dump)
    if not stuck and not never:
        return None
    return GroupStall(
        pg_name=g.name,
        pg_desc=g.desc,
        members=g.members,
        members_inferred=g.inferred,
        backend=ref[0].backend if ref else "",
        op=unit_op(ref),
        seq=s,
        p2p=False,
        input_sizes=tuple(sz for e in ref for sz in e.input_sizes),
        input_dtypes=ref[0].input_dtypes if ref else None,
        stuck=tuple(stuck),
        never_entered=tuple(never),
        finished=tuple(finished),
        unknown=tuple(unknown),
        mismatches=compare(at_s),
        record_id=ref[0].record_id if ref else None,
        entered_ns=entered_ns,
    )


def _first_mismatch(g: Group, units: Mapping[int, Units], frontier: int) -> GroupStall | None:
    seqs = sorted({s for u in units.values() for s in u if s <= frontier})
    for s in seqs:
        at_s = {r: u[s] for r, u in units.items() if u.get(s)}
        found = compare(at_s)
        if not found:
            continue
        ref = at_s[min(at_s)]
        return GroupStall(
            pg_name=g.name,
            pg_desc=g.desc,
            members=g.members,
            members_inferred=g.inferred,
            backend=ref[0].backend,
            op=unit_op(ref),
            seq=s,
            p2p=False,
            input_sizes=tuple(sz for e in ref for sz in e.input_sizes),
            input_dtypes=ref[0].input_dtypes,
            stuck=tuple(
                RankWait(r, 0, u[0].state) for r, u in sorted(at_s.items()) if not _done(u)
            ),
            never_entered=(),
            finished=tuple(r for r, u in sorted(at_s.items()) if _done(u)),
            unknown=tuple(r for r in g.members if r not in units),
            mismatches=found,
            record_id=ref[0].record_id,
            entered_ns=min(e.created_ns for u in at_s.values() for e in u),
        )
    return None


def p2p_stall(g: Group, by_rank: Mapping[int, FrDump]) -> GroupStall | None:
    """The group's first point-to-point operation one side entered and the other did not finish."""
    ordered = sorted(g.members)

    def glob(local: int | None) -> int | None:
        return ordered[local] if local is not None and 0 <= local < len(ordered) else None

    sends: dict[tuple[int, int], list[FrEntry]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[FrEntry]] = defaultdict(list)
    peers: dict[int, set[int]] = defaultdict(set)
    pos: dict[int, int] = {}
    for r, d in by_rank.items():
        for e in d.entries:
            if e.pg_name != g.name or e.op not in ("send", "recv"):
                continue
            src, dst = glob(e.src), glob(e.dst)
            if src is None or dst is None:
                continue
            (sends if e.op == "send" else recvs)[(src, dst)].append(e)
            peers[r].add(dst if r == src else src)
            pos[r] = max(pos.get(r, 0), e.p2p_seq)
    by_seq = all(len(p) == 1 for p in peers.values()) and any(n > 0 for n in pos.values())
    best: tuple[tuple[bool, int], GroupStall] | None = None
    for pair in sorted(set(sends) | set(recvs)):
        pairs = _by_seq(sends[pair], recvs[pair]) if by_seq else _in_order(sends[pair], recvs[pair])
        for snd, rcv in pairs:
            if (snd is None or snd.done) and (rcv is None or rcv.done):
                continue
            stall = _pair_stall(g, by_rank, pos if by_seq else None, pair, snd, rcv)
            if stall is None and by_seq:
                continue  # the other side is past it: not where this pair waits
            if stall is not None:
                key = (not stall.never_entered, stall.entered_ns or 0)
                if best is None or key < best[0]:
                    best = (key, stall)
            break
    return best[1] if best else None


Pair = tuple[FrEntry | None, FrEntry | None]


def _by_seq(sends: list[FrEntry], recvs: list[FrEntry]) -> list[Pair]:
    s = {e.p2p_seq: e for e in sends}
    r = {e.p2p_seq: e for e in recvs}
    return [(s.get(n), r.get(n)) for n in sorted(set(s) | set(r))]


def _in_order(sends: list[FrEntry], recvs: list[FrEntry]) -> list[Pair]:
    n = max(len(sends), len(recvs))
    return [
        (sends[k] if k < len(sends) else None, recvs[k] if k < len(recvs) else None)
        for k in range(n)
    ]


def _pair_stall(
    g: Group,
    by_rank: Mapping[int, FrDump],
    pos: Mapping[int, int] | None,
    pair: tuple[int, int],
    snd: FrEntry | None,
    rcv: FrEntry | None,
) -> GroupStall | None:
    stuck: list[RankWait] = []
    never: list[int] = []
    unknown: list[int] = []
    finished: list[int] = []
    ref = snd if snd is not None else rcv
    if ref is None:
        return None
    for rank, e in zip(pair, (snd, rcv), strict=True):
        d = by_rank.get(rank)
        if e is None:
            if d is None:
                unknown.append(rank)
            elif pos is None or pos.get(rank, -1) < ref.p2p_seq:
                never.append(rank)
            else:
                finished.append(rank)  # past it: no longer in its dump
        elif e.done:
            finished.append(rank)
        else:
            stuck.append(RankWait(rank, _waited(by_rank[rank], e.created_ns), e.state))
    if not stuck or (not never and pos is not None and (snd is None or rcv is None)):
        return None
    mism: tuple[Mismatch, ...] = ()
    if snd is not None and rcv is not None and snd.input_sizes != rcv.output_sizes:
        expected = str([list(x) for x in snd.input_sizes])
        mism = (
            Mismatch(pair[1], "output_sizes", expected, str([list(x) for x in rcv.output_sizes])),
        )
    return GroupStall(
        pg_name=g.name,
        pg_desc=g.desc,
        members=g.members,
        members_inferred=g.inferred,
        backend=ref.backend,
        op=f"send {pair[0]}->{pair[1]}",
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
        entered_ns=min(e.created_ns for e in (snd, rcv) if e is not None),
    )
