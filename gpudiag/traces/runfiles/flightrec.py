"""PyTorch flight-recorder dumps (pickle or JSON, schema 2.2 … 2.10) → typed per-rank records.

The flight recorder (``torch/csrc/distributed/c10d/FlightRecorder.hpp`` and
``FlightRecorderDetail.hpp``) keeps the last N collectives of every process group in a
ring buffer and writes them as a dict: ``version``, ``pg_config`` (group name → name,
desc, ranks), ``pg_status`` (per group: last enqueued / started / completed sequence
id), ``comm_lib_version`` (``nccl_version`` before 2.8) and ``entries``. Each entry
carries ``record_id``, ``pg_id``, ``process_group`` (name, desc), ``collective_seq_id``,
``p2p_seq_id``, ``op_id``, ``profiling_name`` (``nccl:all_reduce``, ``gloo:broadcast``,
``nccl:send 0->3``, ``nccl:recv 3<-0``, ``nccl:coalesced``), sizes and dtypes, ``state``
(scheduled / started / completed), ``time_created_ns``, ``time_discovered_*_ns``,
``retired``, and from later versions ``timeout_ms``, ``is_p2p``, ``duration_ms``,
``thread_name``/``thread_id`` and ``frames`` (innermost first).

Dumps come from other machines, so a pickle is read by an unpickler that builds plain
containers and scalars only: any request for a class or function (what a malicious
``__reduce__`` needs) is refused with one line and nothing in the file runs.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from gpudiag._support import fileio
from gpudiag._support.records import dataclass
from gpudiag.errors import InputError
from gpudiag.rundir import layout as rundir
from gpudiag.traces.core.common import RANK_MAX, dropped_notes

DUMP_LIMIT = 1 << 30
# Schema versions whose field lists gpudiag knows (FlightRecorder.hpp's ``version_val``).
KNOWN_MINORS = range(2, 11)
KNOWN_VERSIONS = "2.2 … 2.10"
BACKENDS = frozenset({"nccl", "ncclx", "gloo", "xccl", "rccl", "rcclx", "mccl", "hccl", "mpi"})
P2P_OPS = frozenset({"send", "recv"})
STATES = frozenset({"scheduled", "started", "completed"})
# ``<prefix><rank>`` with an optional extension: ``nccl_trace_rank_node07_40`` is rank 40.
_TRAILING_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin))?$")
_HINT = "give the files torch's flight recorder wrote (TORCH_FR_DUMP_TEMP_FILE<rank>)"


class _Refused(Exception):
    """A pickle asked for something other than plain containers and scalars."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that resolves no global at all: dicts, lists, tuples, str, numbers only.

    The standard library's "restricting globals" pattern: ``find_class`` is the only way a
    pickle reaches a class or callable (``GLOBAL``, ``STACK_GLOBAL``, ``INST``, ``OBJ`` and
    the copyreg extension codes all go through it), so refusing it refuses ``__reduce__``.
    """

    def find_class(self, module: str, name: str) -> Any:
        """Refuse every global."""
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        """Refuse persistent ids (they would need the writer's own loader)."""
        raise _Refused("a persistent id")


def loads_plain(data: bytes, path: Path | str) -> Any:
    """Unpickle ``data`` built of plain containers and scalars; InputError for anything else."""
    try:
        return PlainUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise InputError(
            path,
            f"refused: the pickle asks for {e} to be built; a flight-recorder dump holds only "
            "plain containers and numbers, so nothing in this file was run",
            "only load dumps written by torch's flight recorder; this file may be malicious",
        ) from None
    except (
        EOFError,
        pickle.UnpicklingError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        MemoryError,
        RecursionError,
        UnicodeDecodeError,
    ) as e:
        raise InputError(
            path,
            f"not a readable pickle ({type(e).__name__}: {str(e)[:80] or 'truncated'})",
            _HINT + "; the file may be truncated",
        ) from None


@dataclass(frozen=True)
class Frame:
    """One frame of a Python stack: function, file, line."""

    name: str
    filename: str
    line: int


@dataclass(frozen=True)
class FrEntry:
    """One flight-recorder entry: one operation of one rank in one process group."""

    record_id: int
    pg_name: str
    pg_desc: str
    seq: int  # collective_seq_id: one per collective or coalesced group
    p2p_seq: int
    op_id: int
    backend: str
    op: str
    is_p2p: bool
    src: int | None  # group-local peer ranks of a send/recv
    dst: int | None
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...] | None
    output_dtypes: tuple[str, ...] | None
    state: str
    retired: bool
    created_ns: int
    started_ns: int | None
    completed_ns: int | None
    duration_ms: float | None = None
    timeout_ms: int | None = None
    thread_name: str | None = None
    frames: tuple[Frame, ...] = ()
    pg_id: int | None = None  # the rank's own index of the group (keys ``pg_status``)

    @property
    def done(self) -> bool:
        """The operation finished on this rank.

        ``state == "completed"`` for backends that time their work (NCCL, xccl). Gloo in
        torch 2.13 records neither start nor completion times (its entries stay
        ``scheduled``); it retires an entry when its work ends, so for gloo retired is done.
        """
        return self.state == "completed" or (self.backend == "gloo" and self.retired)


@dataclass(frozen=True)
class GroupConfig:
    """A process group as one rank's dump describes it."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None  # global ranks; None when the dump does not say


@dataclass(frozen=True)
class FrDump:
    """One rank's flight-recorder dump."""

    path: str
    rank: int
    version: str
    fmt: str  # "pickle" or "json"
    # when it was written: gpudiag's record, else the file's modification time; None when
    # that time cannot be it (a day or more after everything the dump recorded: a copy)
    dumped_ns: int | None
    lib_version: str
    groups: dict[str, GroupConfig]
    pg_status: dict[str, dict[str, int]]
    entries: tuple[FrEntry, ...]
    notes: tuple[str, ...] = field(default=())


def rank_from_dump_name(path: Path) -> int | None:
    """The trailing digits of a dump's file name (``nccl_trace_rank_node07_40`` → 40)."""
    m = _TRAILING_RANK.search(path.name)
    return int(m.group(1)) if m else None


def looks_like_dump(path: Path) -> bool:
    """Cheap check for directory search: a pickle or JSON whose start reads like a dump."""
    try:
        with fileio.open_input(path) as f:
            head = f.read(4096)
    except InputError:
        return False
    if head[:1] == b"\x80":
        return b"entries" in head or b"version" in head or b"pg_config" in head
    text = head.lstrip()[:1]
    return text == b"{" and (
        b'"pg_config"' in head
        or b'"comm_lib_version"' in head
        or b'"nccl_comm_state"' in head
        or b'"pg_status"' in head
    )


def read_dump(path: Path | str, rank: int | None = None) -> FrDump:
    """Read one dump file (pickle or JSON); InputError with one line for anything else."""
    p = Path(path)
    st = fileio.check_regular(p)
    data = fileio.read_input(p, DUMP_LIMIT, "flight-recorder dump")
    if not data:
        raise InputError(p, "empty file: not a flight-recorder dump", _HINT)
    if data[:1] == b"\x80" or data.lstrip()[:1] not in (b"{", b"["):
        raw = loads_plain(data, p)
        fmt = "pickle"
    else:
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise InputError(p, f"not valid JSON ({str(e)[:80]})", _HINT) from None
        fmt = "json"
    return parse_dump(raw, p, fmt, st.st_mtime_ns, rank)


def _version(raw: dict[Any, Any], path: Path) -> str:
    v = raw.get("version")
    if not isinstance(v, str):
        raise InputError(
            path, f"flight-recorder dump without a version string ({type(v).__name__})", _HINT
        )
    m = re.fullmatch(r"(\d+)\.(\d+)", v)
    if not m or int(m.group(1)) != 2 or int(m.group(2)) not in KNOWN_MINORS:
        raise InputError(
            path,
            f"flight-recorder dump version {v[:20]!r} not supported (known: {KNOWN_VERSIONS})",
            "dump it with a torch whose flight recorder writes one of the known versions, "
            "or report the version so it can be added",
        )
    return v


MTIME_SLACK_NS = 86_400 * 10**9


def parse_dump(
    raw: Any, path: Path, fmt: str, dumped_ns: int | None, rank: int | None = None
) -> FrDump:
    """Check and normalise a decoded dump (both formats, every known version)."""
    if not isinstance(raw, dict) or "entries" not in raw or "version" not in raw:
        kind = type(raw).__name__
        raise InputError(
            path,
            f"not a flight-recorder dump (a {fmt} {kind} without 'version' and 'entries')",
            _HINT,
        )
    version = _version(raw, path)
    content_rank = raw.get("rank")
    name_rank = rank_from_dump_name(path)
    if rank is None:
        if isinstance(content_rank, int) and not isinstance(content_rank, bool):
            rank = content_rank
        elif name_rank is not None:
            rank = name_rank
        else:
            raise InputError(
                path,
                "no rank: the file name does not end in a rank number and the dump does not say",
                "keep torch's names (<prefix><rank>)",
            )
    if not 0 <= rank <= RANK_MAX:
        raise InputError(path, f"rank {rank} is not a rank (0 … {RANK_MAX})", _HINT)
    dropped: Counter[str] = Counter()
    groups = _groups(raw.get("pg_config"), path, dropped)
    status = _status(raw.get("pg_status"), dropped)
    entries_raw = raw["entries"]
    if not isinstance(entries_raw, list):
        raise InputError(path, "'entries' is not a list", _HINT)
    entries = []
    for e in entries_raw:
        entry = _entry(e, fmt, dropped)
        if entry is not None:
            entries.append(entry)
    entries.sort(key=lambda e: e.record_id)
    latest = max(
        (t for e in entries for t in (e.created_ns, e.started_ns, e.completed_ns) if t),
        default=None,
    )
    notes = [f"{path.name}: {n}" for n in dropped_notes(dropped)]
    if dumped_ns is not None and latest is not None and dumped_ns - latest > MTIME_SLACK_NS:
        notes.append(
            f"{path.name}: its modification time is a day or more after its last entry, so it "
            "is not when the dump was written (a copy?): how long ranks waited is unknown "
            "(copy dumps with `cp -p`)"
        )
        dumped_ns = None
    lib = raw.get("comm_lib_version", raw.get("nccl_version", ""))
    return FrDump(
        path=str(path),
        rank=rank,
        version=version,
        fmt=fmt,
        dumped_ns=dumped_ns,
        lib_version=lib if isinstance(lib, str) else "",
        groups=groups,
        pg_status=status,
        entries=tuple(entries),
        notes=tuple(notes),
    )


def _ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except (ValueError, RecursionError):
            return None
    if isinstance(v, (list, tuple)) and all(
        isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= RANK_MAX for r in v
    ):
        return tuple(v)
    return None


def _groups(cfg: Any, path: Path, dropped: Counter[str]) -> dict[str, GroupConfig]:
    out: dict[str, GroupConfig] = {}
    if not isinstance(cfg, dict):
        return out
    for key, v in cfg.items():
        if not isinstance(v, dict):
            dropped["process-group configs that are not dicts"] += 1
            continue
        name = v.get("name", key)
        desc = v.get("desc", "")
        ranks = _ranks(v.get("ranks"))
        if ranks is None:
            dropped["process-group configs without a readable rank list"] += 1
        out[str(key)] = GroupConfig(str(name), str(desc), ranks)
    return out


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _status(st: Any, dropped: Counter[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    if not isinstance(st, dict):
        return out
    for key, v in st.items():
        if not isinstance(v, dict):
            continue
        counters = {str(k): n for k, x in v.items() if (n := _int(x)) is not None}
        out[str(key)] = counters
    return out


def _sizes(v: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(v, (list, tuple)):
        return None
    out = []
    for s in v:
        if not isinstance(s, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in s
        ):
            return None
        out.append(tuple(s))
    return tuple(out)


def _dtypes(v: Any) -> tuple[str, ...] | None:
    if isinstance(v, (list, tuple)) and all(isinstance(d, str) for d in v):
        return tuple(v)
    return None


def _time(v: Any, fmt: str) -> int | None:
    n = _int(v)
    # The JSON dump writes 0 for a time that was never discovered.
    if n is None or (fmt == "json" and n == 0):
        return None
    return n if 0 < n < 1 << 63 else None


def _frames(v: Any) -> tuple[Frame, ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    out = []
    for f in v:
        if isinstance(f, dict):
            line = _int(f.get("line"))
            out.append(Frame(str(f.get("name", "")), str(f.get("filename", "")), line or 0))
    return tuple(out)


def parse_profiling_name(name: str) -> tuple[str, str, int | None, int | None] | None:
    """``backend:op [src->dst | dst<-src]`` → (backend, op, src, dst); None if not one."""
    backend, sep, rest = name.partition(":")
    if not sep or not rest:
        return None
    parts = rest.split(" ")
    op = parts[0]
    src = dst = None
    if len(parts) == 2 and op in P2P_OPS:
        meta = parts[1]
        if op == "send" and "->" in meta:
            s, d = meta.split("->", 1)
        elif op == "recv" and "<-" in meta:
            d, s = meta.split("<-", 1)
        else:
            return None
        if not (s.isdigit() and d.isdigit()):
            return None
        src, dst = int(s), int(d)
    elif len(parts) != 1:
        return None
    return backend.lower(), op, src, dst


def _finite(v: Any) -> float | None:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _entry(e: Any, fmt: str, dropped: Counter[str]) -> FrEntry | None:
    if not isinstance(e, dict):
        dropped["entries that are not dicts"] += 1
        return None
    pname = e.get("profiling_name")
    parsed = parse_profiling_name(pname) if isinstance(pname, str) else None
    if parsed is None:
        dropped["entries without a readable profiling_name"] += 1
        return None
    backend, op, src, dst = parsed
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) == 2:
        pg_name, pg_desc = str(pg[0]), str(pg[1])
    elif isinstance(pg, str):
        pg_name, pg_desc = pg, ""
    else:
        dropped["entries without a process_group"] += 1
        return None
    record_id, seq = _int(e.get("record_id")), _int(e.get("collective_seq_id"))
    created = _time(e.get("time_created_ns"), fmt)
    if record_id is None or seq is None or created is None:
        dropped["entries without record_id, collective_seq_id or time_created_ns"] += 1
        return None
    state = e.get("state")
    if state not in STATES:
        dropped["entries with an unknown state"] += 1
        return None
    in_sizes, out_sizes = _sizes(e.get("input_sizes")), _sizes(e.get("output_sizes"))
    if in_sizes is None or out_sizes is None:
        dropped["entries with unreadable sizes"] += 1
        return None
    is_p2p = e.get("is_p2p")
    duration = e.get("duration_ms")
    thread = e.get("thread_name")
    return FrEntry(
        record_id=record_id,
        pg_name=pg_name,
        pg_desc=pg_desc,
        seq=seq,
        p2p_seq=_int(e.get("p2p_seq_id")) or 0,
        op_id=_int(e.get("op_id")) or 0,
        backend=backend,
        op=op,
        is_p2p=is_p2p if isinstance(is_p2p, bool) else op in P2P_OPS,
        src=src,
        dst=dst,
        input_sizes=in_sizes,
        output_sizes=out_sizes,
        input_dtypes=_dtypes(e.get("input_dtypes")),
        output_dtypes=_dtypes(e.get("output_dtypes")),
        state=str(state),
        retired=bool(e.get("retired", False)),
        created_ns=created,
        started_ns=_time(e.get("time_discovered_started_ns"), fmt),
        completed_ns=_time(e.get("time_discovered_completed_ns"), fmt),
        duration_ms=_finite(duration),
        timeout_ms=_int(e.get("timeout_ms")),
        thread_name=thread if isinstance(thread, str) else None,
        frames=_frames(e.get("frames")),
        pg_id=_int(e.get("pg_id")),
    )


def dump_notes(dumps: Sequence[FrDump]) -> list[str]:
    """The dumps' notes, one line for a note several dumps share (``_dump_0 … (16 dumps)``)."""
    by_body: dict[str, list[str]] = {}
    for d in dumps:
        for n in d.notes:
            name, sep, body = n.partition(": ")
            by_body.setdefault(body if sep else n, []).append(name if sep else "")
    out = []
    for body, names in by_body.items():
        named = [x for x in names if x]
        if len(named) > 2:
            out.append(f"{named[0]} … {named[-1]} ({len(named)} dumps): {body}")
        elif named:
            out.extend(f"{x}: {body}" for x in named)
        else:
            out.append(body)
    return out


def read_dumps(paths: Sequence[Path]) -> list[FrDump]:
    """Read several dumps; two files for one rank is an error."""
    out: dict[int, FrDump] = {}
    for p in sorted(paths):
        d = read_dump(p)
        if d.rank in out:
            raise InputError(
                p,
                f"a second flight-recorder dump for rank {d.rank} "
                f"(also {os.path.basename(out[d.rank].path)})",
                "give one dump per rank",
            )
        out[d.rank] = d
    return [out[r] for r in sorted(out)]


# --- gpudiag's own answers to a hang request (collect/hangdump.py) -------------------

STACKS_LIMIT = 64 << 20
HANG_DIR = rundir.HANG_DIR  # under ranks/


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python stack, innermost frame first."""

    name: str
    main: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class RankStacks:
    """What one rank wrote when the watchdog asked: its threads, its groups, its step."""

    path: str
    rank: int
    time_ns: int
    step: int | None
    threads: tuple[ThreadStack, ...]
    groups: dict[str, GroupConfig]
    fr_time_ns: int | None
    fr_error: str | None

    @property
    def main(self) -> ThreadStack | None:
        """The main (training) thread."""
        return next((t for t in self.threads if t.main), None)


def read_stacks(path: Path | str) -> RankStacks:
    """Read ``ranks/hang/rank-<R>.stacks.json``; InputError with one line when unusable."""
    p = Path(path)
    data = fileio.read_input(p, STACKS_LIMIT, "gpudiag stacks file")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise InputError(
            p, f"not valid JSON ({str(e)[:80]})", "give the file gpudiag wrote"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != "gpudiag.stacks":
        raise InputError(p, "not a gpudiag stacks file", "give the file gpudiag wrote")
    rank, t = doc.get("rank"), _int(doc.get("time_ns"))
    if (
        not isinstance(rank, int)
        or isinstance(rank, bool)
        or not 0 <= rank <= RANK_MAX
        or t is None
    ):
        raise InputError(
            p, "stacks file without a valid rank and time_ns", "give the file gpudiag wrote"
        )
    threads = [
        ThreadStack(str(th.get("name", "")), th.get("main") is True, _frames(th.get("frames")))
        for th in doc.get("threads") or []
        if isinstance(th, dict)
    ]
    groups = {}
    raw_groups = doc.get("groups")
    if isinstance(raw_groups, dict):
        for name, g in raw_groups.items():
            if isinstance(g, dict):
                groups[str(name)] = GroupConfig(
                    str(name), str(g.get("desc", "")), _ranks(g.get("ranks"))
                )
    fr_raw = doc.get("flight_recorder")
    fr: dict[str, Any] = fr_raw if isinstance(fr_raw, dict) else {}
    err = fr.get("error")
    return RankStacks(
        path=str(p),
        rank=rank,
        time_ns=t,
        step=_int(doc.get("step")),
        threads=tuple(threads),
        groups=groups,
        fr_time_ns=_int(fr.get("time_ns")),
        fr_error=err if isinstance(err, str) else None,
    )


def with_stacks(dump: FrDump, stacks: RankStacks | None) -> FrDump:
    """The dump with what gpudiag's stacks file adds: its dump time, the groups' ranks."""
    if stacks is None:
        return dump
    groups = dict(dump.groups)
    for name, g in stacks.groups.items():
        if name not in groups or not groups[name].ranks:
            groups[name] = g
    dumped = stacks.fr_time_ns if stacks.fr_time_ns is not None else dump.dumped_ns
    return replace(dump, groups=groups, dumped_ns=dumped)


def read_hang_dir(d: Path) -> tuple[list[FrDump], list[RankStacks], list[str]]:
    """A run's ``ranks/hang/``: gpudiag's dumps and stacks, and torch's own timeout dumps.

    gpudiag's dump (taken at the watchdog's request) is used for a rank that also has one
    of torch's own (written when its collective timed out); the other is noted.
    """
    notes: list[str] = []
    stacks = {s.rank: s for s in (read_stacks(p) for p in sorted(d.glob("rank-*.stacks.json")))}
    ours: dict[int, Path] = {}
    theirs: dict[int, Path] = {}
    for p in sorted(d.iterdir()):
        if p.name.startswith(".") or not p.is_file():
            continue
        r = rank_from_dump_name(p)
        if r is None:
            continue
        if p.name.startswith("fr-rank-"):
            ours[r] = p
        elif p.name.startswith("torch_fr_rank_"):
            theirs[r] = p
    dumps = []
    for r in sorted(set(ours) | set(theirs)):
        p = ours.get(r) or theirs[r]
        if r in ours and r in theirs:
            notes.append(
                f"rank {r}: torch's own timeout dump {theirs[r].name} not used "
                f"(gpudiag's {ours[r].name} was taken at the hang)"
            )
        dumps.append(with_stacks(read_dump(p, rank=r), stacks.get(r)))
    return dumps, [stacks[r] for r in sorted(stacks)], notes
