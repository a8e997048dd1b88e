"""SQL over an Nsight Systems SQLite export: the rows gpudiag maps, straight into numpy.

SQL does the heavy lifting: the GPU activity tables are unioned, joined to their launching
runtime call through ``correlationId`` (same process), NVTX names are resolved against
``StringIds`` and numbered with ``DENSE_RANK`` in SQL, and rows come back ordered by
process and start, as plain integers, straight into numpy columns.

Schema drift (``docs/formats.md``, shared ``reference/nsys-export.md`` §2) is handled by
the opened export (:mod:`gpudiag.traces.nsys.database`): tables resolved by name, columns
checked before optional ones are used, a missing table read as "not captured", non-UTF-8
text decoded with replacement characters.

Damaged exports are handled in SQL too: a row whose needed cells are not numbers in range
(text, blobs, NULL, int64 extremes) is filtered out with ``BETWEEN`` (in SQLite a text,
blob or NULL is never between two integers, and the test costs nothing measurable, where
``typeof`` cost 8% of the big queries) and counted in a note (:attr:`Export.notes`);
optional cells that are not numbers in range read as "unknown" (-1).
"""

from __future__ import annotations

import re

import numpy as np

from gpudiag.traces.core.common import TIME_MAX_NS, TIME_MIN_NS, check_rank
from gpudiag.traces.nsys.database import GPU_COLUMNS, I64A, Export, quoted
from gpudiag.traces.schema import Kind

# NVTX domains whose ranges are communication calls (NCCL's own ranges, nsys MPI tracing).
COMM_DOMAINS = ("NCCL", "MPI")
_PID = "((({col}) >> 24) & 16777215)"
_TID = "(({col}) & 16777215)"
_STRIP_ARGS = (", seq = ", ", op_id = ", ", sizes = ")
_T_RANGE = f"BETWEEN {TIME_MIN_NS} AND {TIME_MAX_NS}"


def _is_int(col: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> str:
    """SQL: ``col`` holds a number in [lo, hi], never text, a blob or NULL.

    (A real number in range passes and is read as its integer part: an export never holds
    one, and a damaged one is then at most 1 ns off.)
    """
    return f"{col} BETWEEN {lo} AND {hi}"


def _int_or(col: str, default: int = -1, lo: int = -(2**63), hi: int = 2**63 - 1) -> str:
    """SQL: ``col`` when it holds an integer (in [lo, hi]), else ``default``."""
    return f"CASE WHEN {_is_int(col, lo, hi)} THEN {col} ELSE {default} END"


def _times_ok(start: str, end: str) -> str:
    """SQL: a start and end that are integer ns in range, end ≥ start."""
    return f"{start} {_T_RANGE} AND {end} {_T_RANGE} AND {end} >= {start}"


def gpu_rows(ex: Export) -> I64A:
    """Kernels, copies and memsets with their launch time; ordered by process and start.

    Columns: kind, pid, device, stream, start, end, name code, bytes, launch_ns, signature.
    The name code is a StringIds id for kernels, the copyKind for copies, -1 for memsets;
    the signature is the kernel's ``demangledName`` id (-1 for the others): the
    communication classification needs its namespace (``deep_ep::intranode::dispatch``,
    whose short name is only ``dispatch``).
    """
    kcols = ex.cols("CUPTI_ACTIVITY_KIND_KERNEL")
    by_pid = "globalPid" in kcols
    parts = []
    read: dict[int, tuple[str, int]] = {}
    for canon, kind in (
        ("CUPTI_ACTIVITY_KIND_KERNEL", Kind.COMPUTE),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", Kind.MEMCPY),
        ("CUPTI_ACTIVITY_KIND_MEMSET", Kind.MEMSET),
    ):
        t, c = ex.table(canon), ex.cols(canon)
        if t is None:
            continue
        lacking = sorted(GPU_COLUMNS - c)  # the kernel table was checked in check_schema
        if lacking:
            ex.dropped(f"rows of {t}", ex.count(canon), f"no column {', '.join(lacking)}: renamed?")
            continue
        ok = (
            f"{_times_ok('start', quoted('end'))} AND {_is_int('deviceId', 0, 2**31 - 1)} "
            f"AND {_is_int('streamId', 0, 2**32 - 1)}"
        )
        pid = "0"
        if by_pid and "globalPid" in c:
            pid = _PID.format(col="globalPid")
            ok += f" AND {_is_int('globalPid')}"
        if kind == Kind.COMPUTE:
            # the demangled name: a short name can be just "Kernel" (CUTLASS, cuDNN)
            nm = next(
                (_int_or(n, -1, 0, 2**62) for n in ("demangledName", "shortName") if n in c), "-1"
            )
        elif kind == Kind.MEMCPY:
            nm = _int_or("copyKind", -1, 0, 2**31 - 1) if "copyKind" in c else "-1"
            if "copyKind" in c and {"srcKind", "dstKind"} <= c:  # the memory kinds: see MEM_KINDS
                nm = (
                    f"({_int_or('copyKind', 0, 0, 255)} + 256 * {_int_or('srcKind', 7, 0, 15)}"
                    f" + 4096 * {_int_or('dstKind', 7, 0, 15)})"
                )
        else:
            nm = "-1"
        has_dn = kind == Kind.COMPUTE and "demangledName" in c
        dn = _int_or("demangledName", -1, 0, 2**62) if has_dn else "-1"
        nb = _int_or("bytes", -1, 0, 2**62) if "bytes" in c else "-1"
        corr = _int_or("correlationId") if "correlationId" in c else "-1"
        parts.append(
            f"SELECT {int(kind)} AS kind, {pid} AS pid, deviceId AS dev, streamId AS stream, "
            f'start, "end", {nm} AS nm, {nb} AS nb, {corr} AS corr, {dn} AS dn '
            f"FROM {quoted(t)} WHERE {ok}"
        )
        read[int(kind)] = (t, ex.count(canon))
    if not parts:
        return np.zeros((0, 10), np.int64)
    rt, rcols = ex.table("CUPTI_ACTIVITY_KIND_RUNTIME"), ex.cols("CUPTI_ACTIVITY_KIND_RUNTIME")
    sql = "WITH g AS (" + " UNION ALL ".join(parts) + ")"
    if rt and {"correlationId", "start"} <= rcols:
        rpid = _PID.format(col="globalTid") if by_pid and "globalTid" in rcols else "0"
        r_ok = f"{_is_int('correlationId')} AND start {_T_RANGE}"
        if rpid != "0":
            r_ok += f" AND {_is_int('globalTid')}"
        sql += (
            f", r AS (SELECT correlationId AS c, {rpid} AS p, MIN(start) AS s FROM {quoted(rt)} "
            f"WHERE {r_ok} GROUP BY 1, 2) "
            'SELECT g.kind, g.pid, g.dev, g.stream, g.start, g."end", g.nm, g.nb, '
            "COALESCE(r.s, -1), g.dn FROM g LEFT JOIN r ON r.c = g.corr AND r.p = g.pid "
        )
    else:
        sql += ' SELECT kind, pid, dev, stream, start, "end", nm, nb, -1, dn FROM g '
    rows = ex.ints(sql + "ORDER BY 2, 5", 10)
    got = np.bincount(rows[:, 0], minlength=4) if len(rows) else np.zeros(4, np.int64)
    why = "start/end/deviceId/streamId missing, not integers, or out of range"
    for k, (t, total) in read.items():
        ex.dropped(f"rows of {t}", total - int(got[k]), why)
    return rows


def runtime_rows(ex: Export, by_pid: bool) -> I64A:
    """CUDA runtime/driver calls: pid, tid, start, end, name id; ordered by process, start."""
    canon = "CUPTI_ACTIVITY_KIND_RUNTIME"
    t = ex.table(canon)
    c = ex.cols(canon)
    if t is None:
        return np.zeros((0, 5), np.int64)
    if not {"start", "end", "globalTid"} <= c:
        ex.notes.append(
            f"{t} has no column {', '.join(sorted({'start', 'end', 'globalTid'} - c))} "
            "(renamed?): runtime calls are not read, so no kernel has a launch "
            "time"
        )
        return np.zeros((0, 5), np.int64)
    pid = _PID.format(col="globalTid") if by_pid else "0"
    nm = _int_or("nameId", -1, 0, 2**62) if "nameId" in c else "-1"
    rows = ex.ints(
        f'SELECT {pid}, {_TID.format(col="globalTid")}, start, "end", {nm} FROM {quoted(t)} '
        f"WHERE {_times_ok('start', quoted('end'))} AND {_is_int('globalTid')} ORDER BY 1, 3",
        5,
    )
    ex.dropped(
        f"rows of {t}",
        ex.count(canon) - len(rows),
        "start/end/globalTid missing, not integers, or out of range",
    )
    return rows


# OS runtime calls in which a thread blocks (waiting on a queue, a pipe, a lock or a timer):
# evidence of what the training thread waited for between step ranges.
BLOCKING_CALLS = (
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_wait",
    "epoll_pwait",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
    "futex",
    "read",
    "readv",
    "recv",
    "recvfrom",
    "recvmsg",
    "pthread_mutex_lock",
    "pthread_join",
    "waitpid",
    "wait4",
    "nanosleep",
    "clock_nanosleep",
    "usleep",
    "sleep",
)


def osrt_rows(ex: Export, by_pid: bool) -> I64A:
    """Blocking OS runtime calls (``-t osrt``): pid, tid, start, end, name id; by process."""
    t = ex.table("OSRT_API")
    if t is None or not {"start", "end", "globalTid", "nameId"} <= ex.cols("OSRT_API"):
        return np.zeros((0, 5), np.int64)
    pid = _PID.format(col="o.globalTid") if by_pid else "0"
    names = ", ".join(f"'{n}'" for n in BLOCKING_CALLS)
    return ex.ints(
        f'SELECT {pid}, {_TID.format(col="o.globalTid")}, o.start, o."end", o.nameId '
        f'FROM "{t}" AS o JOIN StringIds AS s ON s.id = o.nameId '
        f'WHERE s.value IN ({names}) AND o.start IS NOT NULL AND o."end" > o.start '
        "AND o.globalTid IS NOT NULL ORDER BY 1, 3",
        5,
    )


def _op_range(x: str) -> str:
    """SQL: the range is one operator of ``emit_nvtx`` / ``--pytorch=autograd-nvtx``.

    Those are most of an export's NVTX rows (``aten::mul, seq = 885, op_id = 314359``,
    ``MulBackward0, seq = 885``) and never steps, data or communication, so they are left
    in the file: the classification needs none of them. c10d's ``nccl:*, op_id = N`` stay.
    """
    return f"{x} GLOB 'aten::*' OR ({x} GLOB '*, seq = *' AND {x} NOT GLOB 'nccl:*')"


def nvtx_rows(ex: Export, by_pid: bool) -> tuple[I64A, list[str]]:
    """Push/pop and start/end ranges: (pid, tid, start, end, name index, comm domain), names.

    Nsight's MPI trace tables (:data:`MPI_TABLES`) join them as ranges named by the call
    (``MPI_Sendrecv``), which ``comm_host_re`` makes communication (not ``MPI_Init``).

    Per-operator ranges are skipped (:func:`_op_range`). Names are
    ``COALESCE(text, StringIds)`` with PyTorch's suffixes (``, seq = N``, ``, op_id = N``,
    ``, sizes = …``) cut off in SQL, so that ``nccl:all_to_all, op_id = N`` ranges share a
    name; they are numbered by DENSE_RANK over the sorted
    distinct names, which the second query returns in the same order.
    """
    t = ex.table("NVTX_EVENTS")
    c = ex.cols("NVTX_EVENTS")
    parts = _mpi_parts(ex, by_pid)
    if t is not None and not {"start", "end", "eventType", "globalTid"} <= c:
        need = {"start", "end", "eventType", "globalTid"}
        ex.notes.append(
            f"{t} has no column {', '.join(sorted(need - c))} (renamed?): NVTX ranges are not read"
        )
        t = None
    if t is not None:
        parts.insert(0, _nvtx_part(ex, t, c, by_pid))
    if not parts:
        return np.zeros((0, 6), np.int64), []
    base = " UNION ALL ".join(parts)
    names = [str(r[0]) for r in ex.rows(f"SELECT DISTINCT nm FROM ({base}) ORDER BY nm")]
    rows = ex.ints(
        f"SELECT pid, tid, s, e, DENSE_RANK() OVER (ORDER BY nm) - 1, cd, ok FROM ({base}) "
        "ORDER BY pid, s",
        7,
    )
    good = rows[:, 6] == 1
    what = f"NVTX ranges of {t}" if t is not None else "MPI calls"
    if t is not None and len(parts) > 1:
        what += " and MPI calls"
    ex.dropped(
        what,
        int(np.count_nonzero(~good)),
        "start/end/globalTid not integers or out of range, or end < start",
    )
    return np.ascontiguousarray(rows[good, :6]), names


# Nsight's MPI trace (``-t mpi``): one table per kind of call, each row one call.
MPI_TABLES = (
    "MPI_P2P_EVENTS",
    "MPI_COLLECTIVES_EVENTS",
    "MPI_START_WAIT_EVENTS",
    "MPI_OTHER_EVENTS",
)


def _mpi_parts(ex: Export, by_pid: bool) -> list[str]:
    """SELECTs of the MPI trace tables as communication ranges named by their call."""
    out = []
    for canon in MPI_TABLES:
        t = ex.table(canon)
        if t is None or not {"start", "end", "globalTid", "textId"} <= ex.cols(canon):
            continue
        end = 'm."end"'
        ok = f"{_times_ok('m.start', end)} AND {_is_int('m.globalTid')}"
        pid = _PID.format(col="m.globalTid") if by_pid else "0"
        out.append(
            f"SELECT {_int_or(pid, 0)} AS pid, {_int_or(_TID.format(col='m.globalTid'), 0)} "
            f"AS tid, {_int_or('m.start', 0)} AS s, {_int_or(end, 0)} AS e, "
            f"COALESCE(s.value, 'MPI call') AS nm, 0 AS cd, CASE WHEN {ok} THEN 1 ELSE 0 END "
            f"AS ok FROM {quoted(t)} AS m LEFT JOIN {quoted(str(ex.table('StringIds')))} AS s "
            'ON s.id = m.textId WHERE m."end" IS NOT NULL'
        )
    return out


def _nvtx_part(ex: Export, t: str, c: set[str], by_pid: bool) -> str:
    """The SELECT of NVTX push/pop and start/end ranges (see :func:`nvtx_rows`)."""
    txt = "n.text" if "text" in c else "NULL"  # a blob or a number here is only a bad name
    join = ""
    if "textId" in c:
        txt += ", s.value"
        join = f"LEFT JOIN {quoted(str(ex.table('StringIds')))} AS s ON s.id = n.textId "
    x = f"COALESCE({txt}, '')"
    # Cut at the first of the separators (they appear in this order when present).
    cut = "COALESCE(" + ", ".join(f"NULLIF(instr({x}, '{s}'), 0)" for s in _STRIP_ARGS) + ")"
    nm = f"CASE WHEN {cut} IS NULL THEN {x} ELSE substr({x}, 1, {cut} - 1) END"
    if "domainId" in c and "text" in c:
        doms = ", ".join(f"'{d}'" for d in COMM_DOMAINS)
        comm = (
            f"COALESCE(n.domainId IN (SELECT domainId FROM {quoted(t)} WHERE eventType = 75 "
            f"AND text IN ({doms})), 0)"
        )
    else:
        comm = "0"
    # Ranges are kept or dropped by `ok` after the query (few rows are left by then), so
    # that bad ones are counted without a second pass over the table. A range without an
    # end (never closed) is not a bad row: it is the capture that stopped.
    end = 'n."end"'
    ok = f"{_times_ok('n.start', end)} AND {_is_int('n.globalTid')}"
    pid = _PID.format(col="n.globalTid") if by_pid else "0"
    return (
        f"SELECT {_int_or(pid, 0)} AS pid, {_int_or(_TID.format(col='n.globalTid'), 0)} AS tid, "
        f"{_int_or('n.start', 0)} AS s, {_int_or(end, 0)} AS e, {nm} AS nm, "
        f"{comm} AS cd, CASE WHEN {ok} THEN 1 ELSE 0 END AS ok FROM {quoted(t)} AS n {join}"
        'WHERE n.eventType IN (59, 60) AND n."end" IS NOT NULL '
        f"AND NOT ({_op_range(x)})"
    )


def strings(ex: Export, ids: I64A) -> dict[int, str]:
    """StringIds values of ``ids`` (kernel and runtime names: thousands, not rows)."""
    want = np.unique(ids[ids >= 0])
    out: dict[int, str] = {}
    t = quoted(str(ex.table("StringIds")))
    for i in range(0, len(want), 900):  # SQLite's default limit on bound parameters
        chunk = want[i : i + 900].tolist()
        marks = ",".join("?" * len(chunk))
        out.update(
            (int(k), str(v))
            for k, v in ex.rows(
                f"SELECT id, CASE WHEN typeof(value) = 'text' THEN value ELSE '' END FROM {t} "
                f"WHERE typeof(id) = 'integer' AND id IN ({marks})",
                *chunk,
            )
        )
    return out


def pieces(rows: I64A, pid_col: int) -> dict[int, I64A]:
    """Rows already ordered by process, split per process."""
    if not len(rows):
        return {}
    pids, first = np.unique(rows[:, pid_col], return_index=True)
    bounds = [*first.tolist()[1:], len(rows)]
    return {
        int(p): rows[a:b] for p, a, b in zip(pids.tolist(), first.tolist(), bounds, strict=True)
    }


def thread_ranks(ex: Export) -> dict[int, int]:
    """Process id → rank from NVTX thread names ``MPI Rank N`` (as nsys MPI tracing sets)."""
    if not {"text", "eventType", "globalTid"} <= ex.cols("NVTX_EVENTS"):
        return {}  # noted by nvtx_rows
    out: dict[int, int] = {}
    t = quoted(str(ex.table("NVTX_EVENTS")))
    for gtid, text in ex.rows(
        f"SELECT globalTid, text FROM {t} WHERE eventType = 39 AND typeof(text) = 'text' "
        "AND text LIKE 'MPI Rank %' AND typeof(globalTid) = 'integer'"
    ):
        m = re.match(r"MPI Rank ([0-9]+)$", str(text))
        if m:
            rank = check_rank(
                int(m.group(1)),
                ex.path,
                f"the NVTX thread name {text!r:.40}",
                "the export is damaged or edited; export it again",
            )
            out[(int(gtid) >> 24) & 0xFFFFFF] = rank
    return out


def gpu_names(ex: Export, nsys_dev: list[int]) -> dict[int, str]:
    """Device id → GPU model name, for the devices that ran work."""
    t = ex.usable("TARGET_INFO_GPU", {"id", "name"})
    if t is None:
        return {}
    return {
        int(i): str(n)
        for i, n in ex.rows(f"SELECT id, name FROM {quoted(t)} WHERE typeof(id) = 'integer'")
        if i in nsys_dev
    }


def gpu_props(ex: Export, nsys_dev: list[int]) -> dict[int, tuple[str, int]]:
    """Device id → (compute capability "major.minor" or "", SM count or 0), where recorded."""
    t = ex.usable("TARGET_INFO_GPU", {"id", "computeMajor", "computeMinor"})
    if t is None:
        return {}
    sm = "smCount" if "smCount" in ex.cols(t) else "0"
    out = {}
    for i, major, minor, n in ex.rows(
        f"SELECT id, computeMajor, computeMinor, {sm} FROM {quoted(t)} WHERE typeof(id) = 'integer'"
    ):
        if i not in nsys_dev:
            continue
        ok = all(isinstance(v, int) and 0 <= v < 100 for v in (major, minor))
        out[int(i)] = (f"{major}.{minor}" if ok else "", n if isinstance(n, int) and n > 0 else 0)
    return out


# GPU_METRICS counters gpudiag joins to steps: key → metricName prefix (names vary by
# release and GPU: "SMs Active [Throughput %]", "SM Active", "Tensor Active [...]").
GPU_METRIC_NAMES = {
    "sm_active": ("SMs Active", "SM Active"),
    "sm_issue": ("SM Issue",),
    "tensor_active": ("Tensor Active",),
}


def gpu_metrics(ex: Export) -> dict[int, dict[str, tuple[list[int], list[float]]]]:
    """Sampled GPU counters (``--gpu-metrics-devices``) per device: metric → [times, ratios].

    Values are percentages in the export; they become ratios in [0, 1]. The device is the
    low byte of ``typeId``.
    """
    gm = ex.usable("GPU_METRICS", {"timestamp", "typeId", "metricId", "value"})
    info = ex.usable("TARGET_INFO_GPU_METRICS", {"metricId", "metricName"})
    if not (gm and info):
        return {}
    names = ex.rows(
        "SELECT DISTINCT metricId, metricName FROM "
        f"{quoted(info)} WHERE typeof(metricId) = 'integer'"
    )
    ids: dict[int, str] = {}
    for mid, name in names:
        for key, prefixes in GPU_METRIC_NAMES.items():
            if str(name).startswith(prefixes) and key not in ids.values():
                ids[int(mid)] = key
    if not ids:
        return {}
    rows = ex.ints(
        "SELECT timestamp, typeId & 255, metricId, CASE WHEN typeof(value) IN ('integer', "
        "'real') AND value BETWEEN 0 AND 100 THEN CAST(value AS INTEGER) ELSE -1 END FROM "
        f"{quoted(gm)} WHERE metricId IN ({','.join(map(str, ids))}) "
        f"AND timestamp {_T_RANGE} AND {_is_int('typeId')} "
        "ORDER BY timestamp",
        4,
    )
    out: dict[int, dict[str, tuple[list[int], list[float]]]] = {}
    for dev in np.unique(rows[:, 1]).tolist():
        for mid, key in ids.items():
            sel = rows[(rows[:, 1] == dev) & (rows[:, 2] == mid) & (rows[:, 3] >= 0)]
            if len(sel):
                out.setdefault(int(dev), {})[key] = (
                    sel[:, 0].tolist(),
                    (sel[:, 3] / 100.0).tolist(),
                )
    return out
