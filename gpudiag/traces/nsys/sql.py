"""SQL over an Nsight Systems SQLite export: tables, schema checks, and the rows gpudiag maps.

SQL does the heavy lifting: the GPU activity tables are unioned, joined to their launching
runtime call through ``correlationId`` (same process), NVTX names are resolved against
``StringIds`` and numbered with ``DENSE_RANK`` in SQL, and rows come back ordered by
process and start, as plain integers, straight into numpy columns.

Schema drift (``docs/formats.md``, shared ``reference/nsys-export.md`` §2) is handled by
resolving tables by name (exact, else the highest ``_V<n>`` suffix), checking columns
before using optional ones, treating a missing table as "not captured", and decoding
non-UTF-8 text with replacement characters.
"""

from __future__ import annotations

import re
import sqlite3
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from gpudiag.errors import InputError
from gpudiag.traces.schema import Kind

SQLITE_MAGIC = b"SQLite format 3\x00"
# EXPORT_SCHEMA_VERSION → the nsys release that wrote it (reference §2). Other minor
# versions of a known major are read with the same rules and noted.
KNOWN_SCHEMAS = {
    "2.9.1": "2022.2", "3.0.0": "2022.4", "3.4.0": "2023.3", "3.7.2": "2023.4",
    "3.16.1": "2024.6", "3.17.1": "2025.1", "3.24.0": "2025.5", "3.24.14": "2026.1",
    "3.25.0": "2026.2", "3.28.1": "2026.4",
}  # fmt: skip
SUPPORTED_MAJORS = (2, 3)
# Launcher variables naming the global rank, most specific first: under srun + mpirun,
# SLURM_PROCID is 0 while OMPI_COMM_WORLD_RANK is the rank.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")
SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
# NVTX domains whose ranges are communication calls (NCCL's own ranges, nsys MPI tracing).
COMM_DOMAINS = ("NCCL", "MPI")
_PID = "((({col}) >> 24) & 16777215)"
_TID = "(({col}) & 16777215)"
_STRIP_ARGS = (", seq = ", ", op_id = ", ", sizes = ")

I64A = npt.NDArray[np.int64]


def vtuple(v: str) -> tuple[int, ...]:
    """A version string as a tuple of up to four integers."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def connect(path: Path) -> sqlite3.Connection:
    """Open an export read-only; InputError for anything that is not a SQLite file."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from e
    if head != SQLITE_MAGIC:
        raise InputError(
            path,
            "not a SQLite database",
            "give an Nsight Systems export (`nsys export --type sqlite`) or the .nsys-rep",
        )
    con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    # Some 2021–2022 exports hold text that is not UTF-8.
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


def resolve_tables(names: list[str]) -> dict[str, str]:
    """Canonical table name → name in the file: exact name first, else highest ``_V<n>``."""
    best: dict[str, tuple[bool, int, str]] = {}
    for n in names:
        m = re.match(r"^(.*?)(?:_V(\d+))?$", n)
        base, v = (m.group(1), int(m.group(2) or 0)) if m else (n, 0)
        cand = (n == base, v, n)
        if base not in best or cand[:2] > best[base][:2]:
            best[base] = cand
    return {b: c[2] for b, c in best.items()}


class Export:
    """An open export: its tables, columns and metadata."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = connect(path)
        try:
            rows = self.con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            ).fetchall()
        except sqlite3.DatabaseError as e:
            raise InputError(path, f"corrupt SQLite database ({e})", CORRUPT_HINT) from e
        self.tables = resolve_tables([r[0] for r in rows])
        self._cols: dict[str, set[str]] = {}

    def table(self, name: str) -> str | None:
        """The file's name for a canonical table, None when it is absent."""
        return self.tables.get(name)

    def cols(self, name: str) -> set[str]:
        """The columns of a table (empty when the table is absent)."""
        t = self.tables.get(name)
        if t is None:
            return set()
        if t not in self._cols:
            self._cols[t] = {r[1] for r in self.con.execute(f'PRAGMA table_info("{t}")')}
        return self._cols[t]

    def rows(self, sql: str, *args: Any) -> list[Any]:
        """All rows of a query."""
        return self.con.execute(sql, args).fetchall()

    def ints(self, sql: str, ncols: int) -> I64A:
        """An integer query as an (n, ncols) array, decoded in C (NULLs must be COALESCEd)."""
        cur = self.con.execute(sql)
        flat = np.fromiter(chain.from_iterable(cur), dtype=np.int64)
        return flat.reshape(-1, ncols)

    def meta(self) -> dict[str, str]:
        """The export's metadata table (schema and product versions)."""
        for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if self.table(t):
                return {str(k): str(v) for k, v in self.rows(f'SELECT name, value FROM "{t}"')}
        return {}

    def env(self) -> dict[str, str]:
        """The launch environment's rank variables (values of other variables are not kept)."""
        want = set(RANK_VARS) | set(SIZE_VARS) | {"NSIGHT_SYSTEMS_VERSION"}
        out: dict[str, str] = {}
        if self.table("META_DATA_CAPTURE"):
            for (v,) in self.rows(
                "SELECT value FROM \"META_DATA_CAPTURE\" WHERE name LIKE '%ENVIRONMENT_VARIABLE'"
            ):
                k, _, val = str(v).partition("=")
                if k in want:
                    out[k] = val.strip('"')
        if self.table("TARGET_INFO_SYSTEM_ENV"):
            for (v,) in self.rows(
                "SELECT value FROM \"TARGET_INFO_SYSTEM_ENV\" WHERE name = 'DeviceEnvironment'"
            ):
                for item in str(v).split(";"):
                    k, _, val = item.partition("=")
                    if k in want:
                        out[k] = val.strip('"')
        return out

    def install_version(self) -> str | None:
        """The capturing nsys, from ``TargetInstallDir`` (the path names the release)."""
        if not self.table("TARGET_INFO_SYSTEM_ENV"):
            return None
        for (v,) in self.rows(
            "SELECT value FROM \"TARGET_INFO_SYSTEM_ENV\" WHERE name = 'TargetInstallDir'"
        ):
            m = re.search(r"/(\d{4}\.\d+\.\d+)", str(v))
            if m:
                return m.group(1)
        return None


CORRUPT_HINT = "the file is damaged or truncated; export it again with `nsys export --type sqlite`"


def check_schema(ex: Export, meta: dict[str, str]) -> tuple[str, list[str]]:
    """The era label; InputError for exports gpudiag cannot read."""
    notes: list[str] = []
    if not ex.table("StringIds") or not (
        meta or any(t.startswith("CUPTI_ACTIVITY_KIND_") or t == "NVTX_EVENTS" for t in ex.tables)
    ):
        raise InputError(
            ex.path,
            "SQLite database is not an Nsight Systems export (no StringIds / CUPTI tables)",
            "export the report with `nsys export --type sqlite -o R.sqlite R.nsys-rep`",
        )
    schema = meta.get("EXPORT_SCHEMA_VERSION", "")
    product = meta.get("EXPORT_PRODUCT_VERSION", "")
    if schema:
        major = vtuple(schema)[:1]
        if not major or major[0] not in SUPPORTED_MAJORS:
            known = ", ".join(KNOWN_SCHEMAS)
            raise InputError(
                ex.path,
                f"nsys export schema {schema} not supported (known: {known})",
                "re-export the report with an nsys of 2022.2 … 2026.x "
                "(`nsys export --type sqlite`), or upgrade gpudiag",
            )
        if schema not in KNOWN_SCHEMAS:
            notes.append(f"export schema {schema} is not one gpudiag was tested with; "
                         "read with the rules of schema 3")  # fmt: skip
    if not ex.table("CUPTI_ACTIVITY_KIND_KERNEL"):
        raise InputError(
            ex.path,
            "export has no CUDA kernel table (CUPTI_ACTIVITY_KIND_KERNEL): no GPU work was "
            "captured",
            "profile with CUDA tracing on: `nsys profile -t cuda,nvtx …`",
        )
    era = f"nsys {product or '≤2021.3'}" + (f" schema {schema}" if schema else "")
    return era, notes


def gpu_rows(ex: Export) -> I64A:
    """Kernels, copies and memsets with their launch time; ordered by process and start.

    Columns: kind, pid, device, stream, start, end, name code, bytes, launch_ns.
    The name code is a StringIds id for kernels, the copyKind for copies, -1 for memsets.
    """
    kcols = ex.cols("CUPTI_ACTIVITY_KIND_KERNEL")
    by_pid = "globalPid" in kcols
    parts = []
    for canon, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", Kind.COMPUTE),
                        ("CUPTI_ACTIVITY_KIND_MEMCPY", Kind.MEMCPY),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", Kind.MEMSET)):  # fmt: skip
        t = ex.table(canon)
        c = ex.cols(canon)
        if t is None or not {"start", "end", "deviceId", "streamId"} <= c:
            continue
        pid = _PID.format(col="globalPid") if by_pid and "globalPid" in c else "0"
        if kind == Kind.COMPUTE:
            nm = next(
                (f"COALESCE({n}, -1)" for n in ("shortName", "demangledName") if n in c), "-1"
            )
        elif kind == Kind.MEMCPY:
            nm = "COALESCE(copyKind, -1)" if "copyKind" in c else "-1"
        else:
            nm = "-1"
        nb = "COALESCE(bytes, -1)" if "bytes" in c else "-1"
        corr = "COALESCE(correlationId, -1)" if "correlationId" in c else "-1"
        parts.append(
            f"SELECT {int(kind)} AS kind, {pid} AS pid, deviceId AS dev, streamId AS stream, "
            f'start, "end", {nm} AS nm, {nb} AS nb, {corr} AS corr FROM "{t}" '
            f'WHERE start IS NOT NULL AND "end" >= start'
        )
    rt = ex.table("CUPTI_ACTIVITY_KIND_RUNTIME")
    rcols = ex.cols("CUPTI_ACTIVITY_KIND_RUNTIME")
    sql = "WITH g AS (" + " UNION ALL ".join(parts) + ")"
    if rt and {"correlationId", "start"} <= rcols:
        rpid = _PID.format(col="globalTid") if by_pid and "globalTid" in rcols else "0"
        sql += (
            f', r AS (SELECT correlationId AS c, {rpid} AS p, MIN(start) AS s FROM "{rt}" '
            "GROUP BY 1, 2) "
            'SELECT g.kind, g.pid, g.dev, g.stream, g.start, g."end", g.nm, g.nb, '
            "COALESCE(r.s, -1) FROM g LEFT JOIN r ON r.c = g.corr AND r.p = g.pid "
        )
    else:
        sql += ' SELECT kind, pid, dev, stream, start, "end", nm, nb, -1 FROM g '
    return ex.ints(sql + "ORDER BY 2, 5", 9)


def runtime_rows(ex: Export, by_pid: bool) -> I64A:
    """CUDA runtime/driver calls: pid, tid, start, end, name id; ordered by process, start."""
    t = ex.table("CUPTI_ACTIVITY_KIND_RUNTIME")
    c = ex.cols("CUPTI_ACTIVITY_KIND_RUNTIME")
    if t is None or not {"start", "end", "globalTid"} <= c:
        return np.zeros((0, 5), np.int64)
    pid = _PID.format(col="globalTid") if by_pid else "0"
    nm = "COALESCE(nameId, -1)" if "nameId" in c else "-1"
    return ex.ints(
        f'SELECT {pid}, {_TID.format(col="globalTid")}, start, "end", {nm} FROM "{t}" '
        'WHERE start IS NOT NULL AND "end" >= start ORDER BY 1, 3',
        5,
    )


# OS runtime calls in which a thread blocks (waiting on a queue, a pipe, a lock or a timer):
# evidence of what the training thread waited for between step ranges.
BLOCKING_CALLS = (
    "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait", "poll", "ppoll",
    "select", "pselect6", "epoll_wait", "epoll_pwait", "sem_wait", "sem_timedwait",
    "sem_clockwait", "futex", "read", "readv", "recv", "recvfrom", "recvmsg",
    "pthread_mutex_lock", "pthread_join", "waitpid", "wait4", "nanosleep", "clock_nanosleep",
    "usleep", "sleep",
)  # fmt: skip


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

    Per-operator ranges are skipped (:func:`_op_range`). Names are
    ``COALESCE(text, StringIds)`` with PyTorch's suffixes (``, seq = N``, ``, op_id = N``,
    ``, sizes = …``) cut off in SQL, so that ``nccl:all_to_all, op_id = N`` ranges share a
    name; they are numbered by DENSE_RANK over the sorted
    distinct names, which the second query returns in the same order.
    """
    t = ex.table("NVTX_EVENTS")
    c = ex.cols("NVTX_EVENTS")
    if t is None or not {"start", "end", "eventType", "globalTid"} <= c:
        return np.zeros((0, 6), np.int64), []
    txt = "n.text" if "text" in c else "NULL"
    join = ""
    if "textId" in c:
        txt += ", s.value"
        join = "LEFT JOIN StringIds AS s ON s.id = n.textId "
    x = f"COALESCE({txt}, '')"
    # Cut at the first of the separators (they appear in this order when present).
    cut = "COALESCE(" + ", ".join(f"NULLIF(instr({x}, '{s}'), 0)" for s in _STRIP_ARGS) + ")"
    nm = f"CASE WHEN {cut} IS NULL THEN {x} ELSE substr({x}, 1, {cut} - 1) END"
    if "domainId" in c:
        doms = ", ".join(f"'{d}'" for d in COMM_DOMAINS)
        comm = (
            f'(n.domainId IN (SELECT domainId FROM "{t}" WHERE eventType = 75 '
            f"AND text IN ({doms})))"
        )
    else:
        comm = "0"
    pid = _PID.format(col="n.globalTid") if by_pid else "0"
    base = (
        f"SELECT {pid} AS pid, {_TID.format(col='n.globalTid')} AS tid, n.start AS s, "
        f'n."end" AS e, {nm} AS nm, {comm} AS cd FROM "{t}" AS n {join}'
        'WHERE n.eventType IN (59, 60) AND n."end" IS NOT NULL AND n."end" >= n.start '
        f"AND n.globalTid IS NOT NULL AND NOT ({_op_range(x)})"
    )
    names = [str(r[0]) for r in ex.rows(f"SELECT DISTINCT nm FROM ({base}) ORDER BY nm")]
    rows = ex.ints(
        f"SELECT pid, tid, s, e, DENSE_RANK() OVER (ORDER BY nm) - 1, cd FROM ({base}) "
        "ORDER BY pid, s",
        6,
    )
    return rows, names


def strings(ex: Export, ids: I64A) -> dict[int, str]:
    """StringIds values of ``ids`` (kernel and runtime names: thousands, not rows)."""
    want = np.unique(ids[ids >= 0])
    out: dict[int, str] = {}
    for i in range(0, len(want), 900):  # SQLite's default limit on bound parameters
        chunk = want[i : i + 900].tolist()
        marks = ",".join("?" * len(chunk))
        out.update(
            (int(k), str(v))
            for k, v in ex.rows(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", *chunk)
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
    if not ex.table("NVTX_EVENTS") or "text" not in ex.cols("NVTX_EVENTS"):
        return {}
    out: dict[int, int] = {}
    t = ex.table("NVTX_EVENTS")
    for gtid, text in ex.rows(
        f"SELECT globalTid, text FROM \"{t}\" WHERE eventType = 39 AND text LIKE 'MPI Rank %'"
    ):
        m = re.match(r"MPI Rank (\d+)$", str(text))
        if m and gtid is not None:
            out[(int(gtid) >> 24) & 0xFFFFFF] = int(m.group(1))
    return out


def gpu_names(ex: Export, nsys_dev: list[int]) -> dict[int, str]:
    """Device id → GPU model name, for the devices that ran work."""
    t = ex.table("TARGET_INFO_GPU")
    if t is None or not {"id", "name"} <= ex.cols("TARGET_INFO_GPU"):
        return {}
    return {int(i): str(n) for i, n in ex.rows(f'SELECT id, name FROM "{t}"') if i in nsys_dev}


# GPU_METRICS counters gpudiag joins to steps: key → metricName prefix (names vary by
# release and GPU: "SMs Active [Throughput %]", "SM Active", "Tensor Active [...]").
GPU_METRIC_NAMES = {"sm_active": ("SMs Active", "SM Active"), "sm_issue": ("SM Issue",),
                    "tensor_active": ("Tensor Active",)}  # fmt: skip


def gpu_metrics(ex: Export) -> dict[int, dict[str, tuple[list[int], list[float]]]]:
    """Sampled GPU counters (``--gpu-metrics-devices``) per device: metric → [times, ratios].

    Values are percentages in the export; they become ratios in [0, 1]. The device is the
    low byte of ``typeId``.
    """
    if not (ex.table("GPU_METRICS") and ex.table("TARGET_INFO_GPU_METRICS")):
        return {}
    names = ex.rows(
        f'SELECT DISTINCT metricId, metricName FROM "{ex.table("TARGET_INFO_GPU_METRICS")}"'
    )
    ids: dict[int, str] = {}
    for mid, name in names:
        for key, prefixes in GPU_METRIC_NAMES.items():
            if str(name).startswith(prefixes) and key not in ids.values():
                ids[int(mid)] = key
    if not ids:
        return {}
    rows = ex.ints(
        f"SELECT timestamp, typeId & 255, metricId, COALESCE(value, -1) FROM "
        f'"{ex.table("GPU_METRICS")}" WHERE metricId IN ({",".join(map(str, ids))}) '
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
