"""Transformations of raw Nsight SQLite exports with a known effect (the metamorphic suite's).

The Nsight counterpart of metamorph.py: each transformation edits a copy of an export with
SQL, on its raw rows — never on what gpudiag made of it — and says whether it applies
(``None``: applied; a string: why not). What the effect must be is decided here from the
raw rows: the launch links (``correlationId``), the host ranges of collectives on the
launching thread, the threads' runtime calls.
"""

from __future__ import annotations

import itertools
import random
import re
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
GPU_TABLES = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
EVENT_TABLES = (
    *GPU_TABLES,
    RUNTIME,
    "NVTX_EVENTS",
    "OSRT_API",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_CUDA_EVENT",
    "MPI_OTHER_EVENTS",
    "MPI_P2P_EVENTS",
    "MPI_COLLECTIVES_EVENTS",
    "MPI_START_WAIT_EVENTS",
)
# Host ranges that are collective / point-to-point operators (as in metamorph.COMM_OP)
COMM_OP = re.compile(r"^(c10d::|nccl:|rccl:|gloo:|record_param_comms$)")
SHORT_NS = 10_000
NO_LINK = 1 << 62  # clock_evidence's least latency when no GPU work is linked
NS = 1_000_000_000
PID_MASK = ~0xFFFFFF  # a globalTid's process part (Nsight packs the pid above the tid)
_SYNC = re.compile(r"^(cuda|hip)(Device|Stream)Synchronize(_v\d+)?$")
_COPY_CALL = re.compile(r"^(cuda|hip)Memcpy")


@dataclass
class Transform:
    """One transformation: its name, what it does to an export, and the relation to check."""

    name: str
    apply: Callable[[sqlite3.Connection], str | None]
    expect: str  # "same" | "clock+" | "clock-" | "filtered" | "startup" | "padded" | "scaled"
    doc: str


def tables(con: sqlite3.Connection) -> set[str]:
    rows = con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows}


def cols(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def window(src: Path, dst: Path, kernels: int = 1000) -> Path:
    """A copy of ``src`` cut at the start of its ``kernels``-th kernel (every event table)."""
    shutil.copy(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    have = tables(con)
    row = con.execute(
        f"SELECT start FROM {KERNEL} ORDER BY start LIMIT 1 OFFSET ?", (kernels,)
    ).fetchone()
    if row is not None:
        for t in EVENT_TABLES:
            if t in have and "start" in cols(con, t):
                con.execute(f"DELETE FROM {t} WHERE start > ?", (row[0],))
    con.commit()
    con.execute("VACUUM")
    con.close()
    return dst


def edit(src: Path, dst: Path, fn: Callable[[sqlite3.Connection], str | None]) -> str | None:
    """``fn`` applied to a copy of ``src`` at ``dst``; why it does not apply, or None."""
    shutil.copy(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    try:
        why = fn(con)
        con.commit()
    finally:
        con.close()
    return why


def _string(con: sqlite3.Connection, text: str) -> int:
    (top,) = con.execute("SELECT COALESCE(MAX(id), 0) FROM StringIds").fetchone()
    con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (top + 1, text))
    return int(top + 1)


def _names(con: sqlite3.Connection) -> dict[int, str]:
    return dict(con.execute("SELECT id, value FROM StringIds").fetchall())


def _runtime(con: sqlite3.Connection) -> list[tuple[int, int, int, int, str]]:
    """Runtime calls: (start, end, globalTid, correlationId, name), in start order."""
    names = _names(con)
    rows = con.execute(
        f"SELECT start, end, globalTid, correlationId, nameId FROM {RUNTIME} ORDER BY start"
    ).fetchall()
    return [(s, e, t, c, re.sub(r"_v\d+$", "", names.get(n, ""))) for s, e, t, c, n in rows]


def main_threads(con: sqlite3.Connection) -> dict[int, int]:
    """Per process: the thread with the most runtime calls (globalTid)."""
    counts: dict[int, dict[int, int]] = {}
    for _, _, tid, _, _ in _runtime(con):
        per = counts.setdefault(tid & PID_MASK, {})
        per[tid] = per.get(tid, 0) + 1
    return {p: max(per, key=lambda t: per[t]) for p, per in counts.items()}


def spans(con: sqlite3.Connection) -> dict[int, tuple[int, int]]:
    """Per process: the first start and last end of its work (host calls and ranges, GPU work).

    Blocking OS calls do not count (a wait alone does not widen a window); GPU rows count
    for their process where the table names it, else for every process.
    """
    out: dict[int, tuple[int, int]] = {}
    have = tables(con)
    for t in (RUNTIME, "NVTX_EVENTS"):
        if t in have and "globalTid" in cols(con, t):
            q = f"SELECT globalTid, MIN(start), MAX(end) FROM {t} GROUP BY globalTid"
            for tid, s, e in con.execute(q):
                p = int(tid) & PID_MASK
                a, b = out.get(p, (s, e))
                out[p] = (min(a, s), max(b, e))
    gpu: dict[int, tuple[int, int]] = {}
    for t in GPU_TABLES:
        if t not in have:
            continue
        pid = "globalPid" if "globalPid" in cols(con, t) else "-1"
        for p, s, e in con.execute(f"SELECT {pid}, MIN(start), MAX(end) FROM {t} GROUP BY 1"):
            k = int(p) & PID_MASK if pid != "-1" else -1
            a, b = gpu.get(k, (s, e))
            gpu[k] = (min(a, s), max(b, e))
    if not out:
        return {0: (min(a for a, _ in gpu.values()), max(b for _, b in gpu.values()))}
    for p, (a, b) in list(out.items()):
        g = gpu.get(p, gpu.get(-1))
        if g is not None:
            out[p] = (min(a, g[0]), max(b, g[1]))
    return out


def clock_evidence(con: sqlite3.Connection) -> tuple[int, bool]:
    """(the least launch latency in ns over linked GPU work, whether a wait bounds the clock).

    As metamorph.clock_evidence: a device synchronisation after some GPU work, or a copy
    call followed on its thread by a stream synchronisation, bounds a GPU clock ahead.
    """
    calls = _runtime(con)
    by_corr: dict[int, list[tuple[int, int]]] = {}
    for s, _, tid, c, _ in calls:
        by_corr.setdefault(c, []).append((s, tid & PID_MASK))
    least = NO_LINK
    for t in GPU_TABLES:
        if t not in tables(con):
            continue
        pid = "globalPid" if "globalPid" in cols(con, t) else "0"
        for start, corr, p in con.execute(f"SELECT start, correlationId, {pid} FROM {t}"):
            for s, q in by_corr.get(corr, []):
                if pid == "0" or q == (int(p) & PID_MASK):
                    least = min(least, int(start) - s)
    bound = False
    threads: dict[int, list[str]] = {}
    for _, _, tid, _, name in calls:
        threads.setdefault(tid, []).append(name)
    for seq in threads.values():
        for a, b in itertools.pairwise(seq):
            if _COPY_CALL.search(a) and "Stream" in b and _SYNC.search(b):
                bound = True
        if any("Device" in n and _SYNC.search(n) for n in seq[1:]):
            bound = True
    return least, bound


def comm_launched(con: sqlite3.Connection) -> list[int]:
    """Rowids of kernels whose launching call lies inside a collective's NVTX range.

    Launch link: ``correlationId`` (within the process when the kernel table names it);
    the call lies inside a range on its own thread whose name is a collective operator.
    """
    if "NVTX_EVENTS" not in tables(con):
        return []
    names = _names(con)
    ranges: dict[int, list[tuple[int, int]]] = {}
    has_id = "textId" in cols(con, "NVTX_EVENTS")
    text = "COALESCE(text, '')" + (", textId" if has_id else ", NULL")
    q = f"SELECT start, end, globalTid, {text} FROM NVTX_EVENTS WHERE end > start"
    for s, e, tid, txt, tid_text in con.execute(q):
        name = txt or names.get(tid_text, "")
        if COMM_OP.search(name):
            ranges.setdefault(tid, []).append((s, e))
    if not ranges:
        return []
    calls: dict[tuple[int, int], int] = {}
    for s, _, tid, c, _ in _runtime(con):
        if any(a <= s <= b for a, b in ranges.get(tid, [])):
            calls[(c, tid & PID_MASK)] = s
    pid = "globalPid" if "globalPid" in cols(con, KERNEL) else "0"
    out = []
    for rowid, corr, p in con.execute(f"SELECT rowid, correlationId, {pid} FROM {KERNEL}"):
        if (corr, int(p) & PID_MASK) in calls or (pid == "0" and any(k[0] == corr for k in calls)):
            out.append(int(rowid))
    return out


# --- the transformations -----------------------------------------------------------------


def shift_gpu(delta_ns: int) -> Callable[[sqlite3.Connection], str | None]:
    """Every GPU row's start and end moved by ``delta_ns`` (a GPU clock offset)."""

    def run(con: sqlite3.Connection) -> str | None:
        for t in GPU_TABLES:
            if t in tables(con):
                con.execute(
                    f"UPDATE {t} SET start = start + ?, end = end + ?", (delta_ns, delta_ns)
                )
        return None

    return run


def _insert_call(con: sqlite3.Connection, tid: int, start: int, end: int, name_id: int) -> None:
    (corr,) = con.execute(f"SELECT COALESCE(MAX(correlationId), 0) + 1 FROM {RUNTIME}").fetchone()
    c = cols(con, RUNTIME)
    fields = {
        "start": start,
        "end": end,
        "globalTid": tid,
        "correlationId": corr,
        "nameId": name_id,
    }
    if "eventClass" in c:
        fields["eventClass"] = 1
    if "returnValue" in c:
        fields["returnValue"] = 0
    keys = ", ".join(fields)
    marks = ", ".join("?" for _ in fields)
    con.execute(f"INSERT INTO {RUNTIME} ({keys}) VALUES ({marks})", tuple(fields.values()))


def prepend_startup(seconds: float, name: str) -> Callable[[sqlite3.Connection], str | None]:
    """A one-off runtime call of ``seconds`` on each process's main thread, before anything."""

    def run(con: sqlite3.Connection) -> str | None:
        threads = main_threads(con)
        if not threads:
            return "no runtime calls: no thread to make the call on"
        sid = _string(con, name)
        sp = spans(con)
        for p, tid in threads.items():
            t0 = sp.get(p, next(iter(sp.values())))[0]
            _insert_call(con, tid, t0 - round(seconds * NS) - 1_000_000, t0 - 1_000_000, sid)
        return None

    return run


def pad_edges(head_s: float, tail_s: float) -> Callable[[sqlite3.Connection], str | None]:
    """A 10 µs runtime call ``head_s`` before the first and ``tail_s`` after the last event."""

    def run(con: sqlite3.Connection) -> str | None:
        threads = main_threads(con)
        if not threads:
            return "no runtime calls: no thread to make the call on"
        sid = _string(con, "cudaGetDevice")
        sp = spans(con)
        for p, tid in threads.items():
            t0, t1 = sp.get(p, next(iter(sp.values())))
            for s in (t0 - round(head_s * NS) - 10_000, t1 + round(tail_s * NS)):
                _insert_call(con, tid, s, s + 10_000, sid)
        return None

    return run


def rename_comm_kernels(con: sqlite3.Connection) -> str | None:
    hit = comm_launched(con)
    if not hit:
        return "no kernel is launched inside a collective operator"
    sid = _string(con, "custom_exchange_kernel")
    sets = ", ".join(
        f"{c} = ?" for c in ("shortName", "demangledName", "mangledName") if c in cols(con, KERNEL)
    )
    n = sets.count("?")
    for chunk in range(0, len(hit), 500):
        part = hit[chunk : chunk + 500]
        marks = ", ".join("?" for _ in part)
        con.execute(
            f"UPDATE {KERNEL} SET {sets} WHERE rowid IN ({marks})", (sid,) * n + tuple(part)
        )
    return None


def drop_short_kernels(con: sqlite3.Connection) -> str | None:
    (n,) = con.execute(f"SELECT COUNT(*) FROM {KERNEL}").fetchone()
    (short,) = con.execute(
        f"SELECT COUNT(*) FROM {KERNEL} WHERE end - start < ?", (SHORT_NS,)
    ).fetchone()
    launches = sum(1 for c in _runtime(con) if "aunch" in c[4])
    if not launches:
        return "no launch calls: a dropped kernel leaves no trace"
    if n < 50:
        return f"only {n} kernels: too few to tell a filter from chance"
    if short < 0.2 * n or n - short < 1:
        return f"{short} of {n} kernels are short"
    con.execute(f"DELETE FROM {KERNEL} WHERE end - start < ?", (SHORT_NS,))
    return None


def _event_tables(con: sqlite3.Connection) -> list[str]:
    """Every table with a time column (``start`` or ``timestamp``): the export's events."""
    return sorted(t for t in tables(con) if cols(con, t) & {"start", "timestamp"})


def _has_key(con: sqlite3.Connection, table: str) -> bool:
    """Whether a column is the table's key (its rows are stored in key order, not as written)."""
    return any(r[5] for r in con.execute(f"PRAGMA table_info({table})"))


def shuffle_rows(con: sqlite3.Connection) -> str | None:
    """The rows of every event table written back in a shuffled order (rowids renewed).

    A table keyed by a column (stored in key order whatever the order written) is left.
    """
    rng = random.Random(29)
    done = 0
    for t in _event_tables(con):
        if _has_key(con, t):
            continue
        names = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
        keys = ", ".join(f'"{c}"' for c in names)
        rows = con.execute(f"SELECT {keys} FROM {t}").fetchall()
        if len(rows) < 2:
            continue
        order = list(range(len(rows)))
        rng.shuffle(order)
        if order == sorted(order):
            order.reverse()
        con.execute(f"DELETE FROM {t}")
        marks = ", ".join("?" for _ in names)
        con.executemany(f"INSERT INTO {t} ({keys}) VALUES ({marks})", [rows[i] for i in order])
        done += 1
    return None if done else "no event table holds two rows: no order to shuffle"


TID_COLS = ("globalTid", "endGlobalTid")  # the columns that hold a thread's globalTid


def renumber_threads(con: sqlite3.Connection) -> str | None:
    """Every thread's number (a globalTid's low 24 bits) mapped to another, in every table.

    The process part stays (the GPU rows' ``globalPid`` still names the process); each
    globalTid gets a number of its own (900,000 up), the same in every table and column.
    """
    where = [(t, c) for t in sorted(tables(con)) for c in TID_COLS if c in cols(con, t)]
    seen: set[int] = set()
    for t, c in where:
        q = f"SELECT DISTINCT {c} FROM {t} WHERE typeof({c}) = 'integer'"
        seen.update(int(v) for (v,) in con.execute(q))
    if not seen:
        return "no table holds a globalTid"
    new = {old: (old & PID_MASK) | (900_000 + i) for i, old in enumerate(sorted(seen))}
    if all(old == n for old, n in new.items()):
        return "every thread already has the numbers it would get"
    con.execute("CREATE TEMP TABLE tid_map (old INTEGER PRIMARY KEY, new INTEGER)")
    con.executemany("INSERT INTO tid_map VALUES (?, ?)", new.items())
    for t, c in where:
        con.execute(
            f"UPDATE {t} SET {c} = (SELECT new FROM tid_map WHERE old = {t}.{c}) "
            f"WHERE {c} IN (SELECT old FROM tid_map)"
        )
    con.execute("DROP TABLE tid_map")
    return None


TIME_COLS = ("start", "end", "timestamp")


def scale_time(k: int) -> Callable[[sqlite3.Connection], str | None]:
    """Every time column (start, end, timestamp) of every event table ×k about the first
    time: every duration and gap ×k, every share the same."""

    def run(con: sqlite3.Connection) -> str | None:
        firsts = []
        for t in _event_tables(con):
            for c in TIME_COLS:
                if c in cols(con, t):
                    (v,) = con.execute(f'SELECT MIN("{c}") FROM {t}').fetchone()
                    firsts += [] if v is None else [int(v)]
        if not firsts:
            return "no times"
        t0 = min(firsts)
        for t in _event_tables(con):
            sets = ", ".join(
                f'"{c}" = {t0} + ("{c}" - {t0}) * {k}' for c in TIME_COLS if c in cols(con, t)
            )
            con.execute(f"UPDATE {t} SET {sets}")
        return None

    return run


_REF = re.compile(r"^\s*(\w+)\s.*--\s*REFERENCES StringIds\(id\)", re.MULTILINE)


def string_refs(con: sqlite3.Connection) -> list[tuple[str, str]]:
    """(table, column) of every column the schema says references ``StringIds(id)``."""
    rows = con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    return sorted((t, c) for t, sql in rows for c in _REF.findall(sql or "") if t != "StringIds")


def renumber_strings(con: sqlite3.Connection) -> str | None:
    """Every StringIds id mapped to another (a shuffled order, above the old ones), and every
    column the schema marks ``REFERENCES StringIds(id)`` mapped the same way."""
    refs = string_refs(con)
    if not refs:
        return (
            "the schema marks no column as referencing StringIds: a renumbering can't be followed"
        )
    ids = [int(i) for (i,) in con.execute("SELECT id FROM StringIds ORDER BY id")]
    if len(ids) < 2:
        return "fewer than two strings"
    perm = list(range(len(ids)))
    random.Random(29).shuffle(perm)
    top = ids[-1] + 1
    con.execute("CREATE TEMP TABLE sid_map (old INTEGER PRIMARY KEY, new INTEGER)")
    con.executemany(
        "INSERT INTO sid_map VALUES (?, ?)", [(o, top + p) for o, p in zip(ids, perm, strict=True)]
    )
    for t, c in [*refs, ("StringIds", "id")]:
        con.execute(
            f"UPDATE {t} SET {c} = (SELECT new FROM sid_map WHERE old = {t}.{c}) "
            f"WHERE {c} IN (SELECT old FROM sid_map)"
        )
    con.execute("DROP TABLE sid_map")
    return None


IDLE_RANGE = "unrelated_marker"
IDLE_GAP_NS = 20_000


def idle_gaps(con: sqlite3.Connection) -> list[tuple[int, int]]:
    """The gaps where nothing runs: no row with a start and an end, in any table but the NVTX
    ranges (host calls, OS calls, GPU work, profiler overhead), overlaps them; largest first."""
    spans_: list[tuple[int, int]] = []
    for t in _event_tables(con):
        if t == "NVTX_EVENTS" or not {"start", "end"} <= cols(con, t):
            continue
        q = f'SELECT start, "end" FROM {t} WHERE "end" IS NOT NULL AND "end" >= start'
        spans_ += [(int(a), int(b)) for a, b in con.execute(q)]
    spans_.sort()
    gaps = []
    reach = None
    for a, b in spans_:
        if reach is not None and a > reach:
            gaps.append((reach, a))
        reach = b if reach is None else max(reach, b)
    return sorted(gaps, key=lambda g: (g[0] - g[1], g[0]))


def add_idle_nvtx(con: sqlite3.Connection) -> str | None:
    """An NVTX push/pop range of an unrelated name on a main thread in each of the (up to)
    three largest gaps where nothing runs, over the middle half of the gap."""
    if "NVTX_EVENTS" not in tables(con):
        return "no NVTX_EVENTS table"
    need = {"start", "end", "eventType", "globalTid", "text"}
    if not need <= cols(con, "NVTX_EVENTS"):
        return f"NVTX_EVENTS lacks {', '.join(sorted(need - cols(con, 'NVTX_EVENTS')))}"
    threads = main_threads(con)
    if not threads:
        return "no runtime calls: no thread to put the range on"
    gaps = [g for g in idle_gaps(con) if g[1] - g[0] >= IDLE_GAP_NS][:3]
    if not gaps:
        return f"no gap of {IDLE_GAP_NS // 1000} µs where nothing runs"
    tid = threads[min(threads)]
    fields = {"eventType": 59, "globalTid": tid, "text": IDLE_RANGE}
    if "domainId" in cols(con, "NVTX_EVENTS"):
        row = con.execute(
            "SELECT domainId FROM NVTX_EVENTS WHERE eventType = 59 "
            "GROUP BY domainId ORDER BY COUNT(*) DESC LIMIT 1"
        ).fetchone()
        fields["domainId"] = 0 if row is None else row[0]
    if "endGlobalTid" in cols(con, "NVTX_EVENTS"):
        fields["endGlobalTid"] = tid
    keys = ", ".join(f'"{k}"' for k in ["start", "end", *fields])
    marks = ", ".join("?" for _ in range(len(fields) + 2))
    for a, b in gaps:
        q = (b - a) // 4
        row_ = (a + q, b - q, *fields.values())
        con.execute(f"INSERT INTO NVTX_EVENTS ({keys}) VALUES ({marks})", row_)
    return None


STARTUP_S = 3.0
STARTUP_CALL = "cudaStreamCreateWithPriority"
TRANSFORMS = [
    Transform("shift_gpu_plus", shift_gpu(600_000_000), "clock+", "GPU clock +0.6 s"),
    Transform("shift_gpu_minus", shift_gpu(-300_000_000), "clock-", "GPU clock −0.3 s"),
    Transform(
        "prepend_startup",
        prepend_startup(STARTUP_S, STARTUP_CALL),
        "startup",
        f"a {STARTUP_S:.0f} s {STARTUP_CALL} before anything",
    ),
    Transform("pad_edges", pad_edges(0.2, 0.5), "padded", "0.2 s idle before, 0.5 s after"),
    Transform(
        "rename_comm_kernels",
        rename_comm_kernels,
        "same",
        "kernels launched inside collective ranges renamed to a custom name",
    ),
    Transform("drop_short_kernels", drop_short_kernels, "filtered", "kernels under 10 µs dropped"),
    Transform("shuffle_rows", shuffle_rows, "same", "every event table's rows in a shuffled order"),
    Transform("renumber_threads", renumber_threads, "same", "every globalTid's thread renumbered"),
    Transform("scale_time_x2", scale_time(2), "scaled", "every start/end/timestamp ×2"),
    Transform(
        "renumber_strings", renumber_strings, "same", "StringIds renumbered with every reference"
    ),
    Transform(
        "add_idle_nvtx",
        add_idle_nvtx,
        "same",
        "NVTX ranges of an unrelated name where nothing runs",
    ),
]
