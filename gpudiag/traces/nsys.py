"""nsys SQLite export (stdlib sqlite3) → Intervals; maps CUDA/NCCL/NVTX tables to kinds.

One export may hold several profiled processes (``nsys profile torchrun …``): each process
with GPU activity becomes one :class:`RankTimeline`. SQL does the heavy lifting: the GPU
activity tables are unioned, joined to their launching runtime call through
``correlationId`` (same process), NVTX names are resolved against ``StringIds`` and
numbered with ``DENSE_RANK`` in SQL, and rows come back ordered by process and start, as
plain integers, straight into numpy columns. Python only looks at the *distinct* names
(regexes for comm / data / step) and at a few metadata rows.

Schema drift (``docs/formats.md``, shared ``reference/nsys-export.md`` §2) is handled by
resolving tables by name (exact, else the highest ``_V<n>`` suffix), checking columns
before using optional ones, treating a missing table as "not captured", and decoding
non-UTF-8 text with replacement characters.

``.nsys-rep`` / ``.qdrep`` reports are read through their SQLite export: an up-to-date
``.sqlite`` beside the report, else ``nsys export`` into gpudiag's cache directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from gpudiag import nsysbin
from gpudiag.config import DEFAULT_STEP_RE, Thresholds
from gpudiag.errors import EnvironmentProblem, InputError
from gpudiag.traces.kineto import rank_from_filename
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
HEADER_MAGIC = b"NVIDIA Tegra Profiler Report "
SQLITE_MAGIC = b"SQLite format 3\x00"
# Steps recognised without --step-marker: PyTorch's ProfilerStep#N and gpudiag's own
# ``gpudiag.step#N`` NVTX range (collect/hook.py).
NSYS_STEP_RE = r"^(?:ProfilerStep|gpudiag\.step)#(\d+)$"
GPUDIAG_COMM_RE = r"^gpudiag\.comm$"
# NVTX domains whose ranges are communication calls (NCCL's own ranges, nsys MPI tracing).
COMM_DOMAINS = ("NCCL", "MPI")
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
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
                8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH",
                13: "UVM DtoD"}  # fmt: skip
PEER_COPY = 10
EXPORT_TIMEOUT_S = float(os.environ.get("GPUDIAG_NSYS_TIMEOUT", "900"))
_PID = "((({col}) >> 24) & 16777215)"
_TID = "(({col}) & 16777215)"
_STRIP_ARGS = (", seq = ", ", op_id = ", ", sizes = ")
_MISMATCH = ("newer than your current version", "Version number is invalid", "ProtobufParse")

I64A = npt.NDArray[np.int64]


# ---------------------------------------------------------------- reports and nsys


def report_version(path: Path) -> str:
    """The nsys that captured a report, from its header: ``2024.6.2.25`` or ``before 2023.4``."""
    try:
        with path.open("rb") as f:
            head = f.read(96)
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from e
    if not head.startswith(HEADER_MAGIC):
        raise InputError(
            path,
            "not an Nsight Systems report (no `NVIDIA Tegra Profiler Report` header)",
            "give a .nsys-rep/.qdrep written by `nsys profile`, or its .sqlite export",
        )
    rest = head[len(HEADER_MAGIC) :]
    m = re.match(rb"(\d{4})@(\d+)@(\d+)@(\d+)", rest)
    if m:
        return ".".join(x.decode() for x in m.groups())
    return "before 2023.4"


def find_nsys() -> str | None:
    """The nsys binary (see :mod:`gpudiag.nsysbin`); a bad ``GPUDIAG_NSYS`` is an error."""
    path, why = nsysbin.locate()
    if path is None and os.environ.get("GPUDIAG_NSYS"):
        raise EnvironmentProblem(why, "point --nsys / GPUDIAG_NSYS at the nsys binary")
    return path


def nsys_version(nsys: str) -> str:
    """``2022.4.2.1`` from ``nsys --version`` (``?`` when it cannot be told)."""
    return nsysbin.version(nsys)


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def cache_dir() -> Path:
    """Where exports of reports are kept: ``$XDG_CACHE_HOME/gpudiag/nsys``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpudiag" / "nsys"


def cache_path(report: Path) -> Path:
    """The cached export of ``report``, keyed by its absolute path, size and mtime."""
    st = report.stat()
    key = f"{report.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return cache_dir() / f"{hashlib.sha256(key).hexdigest()[:24]}.sqlite"


def _export_cmd(report: Path, out: Path, nsys: str = "nsys") -> list[str]:
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--quiet", "true",
            "--output", str(out), str(report)]  # fmt: skip


def _manual(report: Path) -> str:
    """The command a user runs to export ``report`` beside itself."""
    return f"nsys export --type sqlite -o {report.with_suffix('.sqlite')} {report}"


def _needs(captured: str) -> str:
    """Which nsys opens a report (an nsys opens reports of its own version or older)."""
    if captured[:1].isdigit():
        return f"nsys {captured} or newer"
    return "nsys 2023.4 or newer (or the release that captured it)"


def resolve_report(report: Path) -> Path:
    """The SQLite export to read for a ``.nsys-rep``/``.qdrep``, exporting it if needed."""
    captured = report_version(report)
    beside = report.with_suffix(".sqlite")
    if beside.is_file() and beside.stat().st_mtime >= report.stat().st_mtime:
        return beside
    manual = _manual(report)
    nsys = find_nsys()
    if nsys is None:
        raise EnvironmentProblem(
            f"{report}: no nsys found to export this report (captured by nsys {captured}; "
            f"it needs {_needs(captured)})",
            f"run `{manual}` and analyse the .sqlite, or pass --nsys PATH / set GPUDIAG_NSYS",
        )
    cached = cache_path(report)
    if cached.is_file():
        return cached
    local = nsys_version(nsys)
    if captured[0].isdigit() and local != "?" and _vtuple(local) < _vtuple(captured):
        raise _mismatch(report, captured, local, manual)
    export_report(report, cached, nsys, local, captured)
    return cached


def _mismatch(report: Path, captured: str, local: str, manual: str) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"{report}: report captured by nsys {captured}, local nsys is {local} "
        f"(an nsys opens only reports of its own version or older)",
        f"export it on a machine with {_needs(captured)}: `{manual}`",
    )


def export_report(report: Path, out: Path, nsys: str, local: str, captured: str) -> None:
    """Run ``nsys export`` to a temporary name; rename on success, delete on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.sqlite")
    cmd = _export_cmd(report, tmp, nsys)
    spin = _Spinner(f"exporting {report.name} with nsys {local}")
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, errors="replace",
        )  # fmt: skip
    except OSError as e:
        raise EnvironmentProblem(f"cannot run {nsys} ({e})", "check --nsys / GPUDIAG_NSYS") from e
    deadline = time.monotonic() + EXPORT_TIMEOUT_S
    text = ""
    try:
        while True:
            try:
                text, _ = proc.communicate(timeout=0.15)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.communicate()
                    raise EnvironmentProblem(
                        f"{report}: nsys export did not finish in {EXPORT_TIMEOUT_S:.0f} s",
                        f"set GPUDIAG_NSYS_TIMEOUT=<seconds>, or run `{_manual(report)}` yourself",
                    ) from None
                spin.tick()
    finally:
        spin.done()
        if proc.returncode != 0:
            with contextlib.suppress(OSError):
                tmp.unlink()  # nsys can leave a partial export behind
    if proc.returncode != 0 or not tmp.is_file():
        manual = _manual(report)
        if any(s in text for s in _MISMATCH):
            raise _mismatch(report, captured, local, manual)
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        raise InputError(
            report,
            f"nsys {local} export failed (exit {proc.returncode}): {last[:200]}",
            f"try `{manual}` yourself to see the full message",
        )
    os.replace(tmp, out)


_SPIN = "|/-\\"


class _Spinner:
    """A one-line progress spinner on stderr, only when stderr is a terminal."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.on = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.i = 0

    def tick(self) -> None:
        if self.on:
            self.i += 1
            dt = time.monotonic() - self.t0
            sys.stderr.write(f"\rgpudiag: {self.what} {_SPIN[self.i % 4]} {dt:.0f}s")
            sys.stderr.flush()

    def done(self) -> None:
        if self.on and self.i:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


# ---------------------------------------------------------------- SQLite export → ranks


def _connect(path: Path) -> sqlite3.Connection:
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


class _Export:
    """An open export: its tables, columns and metadata."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = _connect(path)
        try:
            rows = self.con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            ).fetchall()
        except sqlite3.DatabaseError as e:
            raise InputError(path, f"corrupt SQLite database ({e})", _CORRUPT_HINT) from e
        self.tables = resolve_tables([r[0] for r in rows])
        self._cols: dict[str, set[str]] = {}

    def table(self, name: str) -> str | None:
        return self.tables.get(name)

    def cols(self, name: str) -> set[str]:
        t = self.tables.get(name)
        if t is None:
            return set()
        if t not in self._cols:
            self._cols[t] = {r[1] for r in self.con.execute(f'PRAGMA table_info("{t}")')}
        return self._cols[t]

    def rows(self, sql: str, *args: Any) -> list[Any]:
        return self.con.execute(sql, args).fetchall()

    def ints(self, sql: str, ncols: int) -> I64A:
        """An integer query as an (n, ncols) array, decoded in C (NULLs must be COALESCEd)."""
        cur = self.con.execute(sql)
        flat = np.fromiter(chain.from_iterable(cur), dtype=np.int64)
        return flat.reshape(-1, ncols)

    def meta(self) -> dict[str, str]:
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


_CORRUPT_HINT = "the file is damaged or truncated; export it again with `nsys export --type sqlite`"


def _check_schema(ex: _Export, meta: dict[str, str]) -> tuple[str, list[str]]:
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
        major = _vtuple(schema)[:1]
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


def _gpu_rows(ex: _Export) -> I64A:
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


def _runtime_rows(ex: _Export, by_pid: bool) -> I64A:
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


def _op_range(x: str) -> str:
    """SQL: the range is one operator of ``emit_nvtx`` / ``--pytorch=autograd-nvtx``.

    Those are most of an export's NVTX rows (``aten::mul, seq = 885, op_id = 314359``,
    ``MulBackward0, seq = 885``) and never steps, data or communication, so they are left
    in the file: the classification needs none of them. c10d's ``nccl:*, op_id = N`` stay.
    """
    return f"{x} GLOB 'aten::*' OR ({x} GLOB '*, seq = *' AND {x} NOT GLOB 'nccl:*')"


def _nvtx(ex: _Export, by_pid: bool) -> tuple[I64A, list[str]]:
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


def _strings(ex: _Export, ids: I64A) -> dict[int, str]:
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


def _pieces(rows: I64A, pid_col: int) -> dict[int, I64A]:
    """Rows already ordered by process, split per process."""
    if not len(rows):
        return {}
    pids, first = np.unique(rows[:, pid_col], return_index=True)
    bounds = [*first.tolist()[1:], len(rows)]
    return {
        int(p): rows[a:b] for p, a, b in zip(pids.tolist(), first.tolist(), bounds, strict=True)
    }


def _thread_rank(ex: _Export) -> dict[int, int]:
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


def _gpu_names(ex: _Export, nsys_dev: list[int]) -> dict[int, str]:
    t = ex.table("TARGET_INFO_GPU")
    if t is None or not {"id", "name"} <= ex.cols("TARGET_INFO_GPU"):
        return {}
    return {int(i): str(n) for i, n in ex.rows(f'SELECT id, name FROM "{t}"') if i in nsys_dev}


def _frequent(names: list[str], idx: I64A, top: int = 6) -> str:
    """The most frequent range names, digits folded (``Batch N``), for a --step-marker hint.

    Per-operator ranges (``aten::mul``, ``MulBackward0``, NCCL API calls) are left out when
    other ranges exist: they are never steps and would crowd the user's own ranges out.
    """
    counts: Counter[str] = Counter()
    per_name = np.bincount(idx, minlength=len(names))
    for i in np.flatnonzero(per_name).tolist():
        counts[re.sub(r"\d+", "N", names[i])] += int(per_name[i])
    user = [(n, c) for n, c in counts.items() if not _OP_RANGE.search(n)] or list(counts.items())
    # Numbered ranges (``Batch N``, ``iteration N``) first: steps are usually numbered.
    user.sort(key=lambda nc: (not _NUMBERED.search(nc[0]), -nc[1], nc[0]))
    return ", ".join(f"'{n}' ×{c}" for n, c in user[:top])


_OP_RANGE = re.compile(r"::|Backward(N|\d*)$|^nccl[A-Z]|^cuda[A-Z]|^record_param_comms$")
_NUMBERED = re.compile(r"(^|[\s#_:-])N$")


def _flags(names: list[str], *patterns: str) -> npt.NDArray[np.bool_]:
    rx = [re.compile(p) for p in patterns]
    return np.array([[bool(r.search(n)) for r in rx] for n in names], bool).reshape(
        len(names), len(rx)
    )


def load_nsys(
    path: Path, *, thresholds: Thresholds | None = None, source: str | None = None
) -> list[RankTimeline]:
    """Load an nsys SQLite export: one RankTimeline per profiled process with GPU work.

    ``source`` names the input in reports (the ``.nsys-rep`` an export was made from).
    """
    th = thresholds or Thresholds()
    path = Path(path)
    ex = _Export(path)
    try:
        return _load(ex, th, source or str(path))
    except sqlite3.DatabaseError as e:
        raise InputError(path, f"corrupt SQLite database ({e})", _CORRUPT_HINT) from e
    finally:
        ex.con.close()


def _load(ex: _Export, th: Thresholds, source: str) -> list[RankTimeline]:
    meta_rows = ex.meta()
    era, notes = _check_schema(ex, meta_rows)
    by_pid = "globalPid" in ex.cols("CUPTI_ACTIVITY_KIND_KERNEL")
    gpu = _gpu_rows(ex)
    if not len(gpu):
        raise InputError(
            ex.path, "export holds no GPU kernels, copies or memsets",
            "was the capture window empty? profile with `nsys profile -t cuda,nvtx …`",
        )  # fmt: skip
    rt = _runtime_rows(ex, by_pid)
    nv, nv_names = _nvtx(ex, by_pid)
    # Launch times of -1 mean "unknown" downstream: keep real times non-negative.
    lo = min(int(a[:, 2].min()) for a in (rt, nv) if len(a)) if len(rt) or len(nv) else 0
    lo = min(lo, int(gpu[:, 4].min()))
    if lo < 0:
        gpu[:, [4, 5]] -= lo
        gpu[gpu[:, 8] != -1, 8] -= lo
        rt[:, [2, 3]] -= lo
        nv[:, [2, 3]] -= lo
        notes.append(f"times shifted by {-lo} ns: the export has negative timestamps")

    # ---- names: one list for the file, deduplicated ----
    kern = gpu[:, 0] == Kind.COMPUTE
    ids = np.concatenate([gpu[kern, 6], rt[:, 4]])
    strings = _strings(ex, ids)
    sid_keys = np.array(sorted(strings), dtype=np.int64)
    copy_kinds = sorted(set(gpu[gpu[:, 0] == Kind.MEMCPY, 6].tolist()))
    raw_names = (
        [strings[k] for k in sid_keys.tolist()]
        + [re.sub(r"_v\d+$", "", strings[k]) for k in sid_keys.tolist()]
        + [f"Memcpy {MEMCPY_KINDS.get(k, str(k))}" for k in copy_kinds]
        + ["Memset", "(unnamed)"]
        + nv_names
    )
    uniq, inv = np.unique(np.array(raw_names, dtype=object), return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    names = [str(x) for x in uniq]
    n_sid = len(sid_keys)
    off_rt, off_cp = n_sid, 2 * n_sid
    off_ms = off_cp + len(copy_kinds)
    unnamed = int(inv[off_ms + 1])

    def sid_index(col: I64A, offset: int) -> I64A:
        pos = np.searchsorted(sid_keys, col)
        pos_c = np.minimum(pos, max(n_sid - 1, 0))
        hit = (sid_keys[pos_c] == col) if n_sid else np.zeros(len(col), bool)
        out = np.full(len(col), unnamed, np.int64)
        out[hit] = inv[offset + pos_c[hit]]
        return out

    gname = np.full(len(gpu), unnamed, np.int64)
    gname[kern] = sid_index(gpu[kern, 6], 0)
    cp = gpu[:, 0] == Kind.MEMCPY
    if copy_kinds:
        gname[cp] = inv[off_cp + np.searchsorted(np.array(copy_kinds), gpu[cp, 6])]
    gname[gpu[:, 0] == Kind.MEMSET] = inv[off_ms]
    rname = sid_index(rt[:, 4], off_rt)
    nname = inv[off_ms + 2 + nv[:, 4]] if len(nv) else np.zeros(0, np.int64)

    # ---- kinds by name ----
    explicit_step = th.step_re != DEFAULT_STEP_RE
    step_re = th.step_re if explicit_step else NSYS_STEP_RE
    fl = _flags(names, th.comm_kernel_re, th.comm_host_re, GPUDIAG_COMM_RE, th.data_re, step_re)
    gkind = gpu[:, 0].copy()
    gkind[kern & fl[gname, 0]] = Kind.COMM
    gkind[cp & (gpu[:, 6] == PEER_COPY)] = Kind.COMM  # peer copies are GPU-to-GPU traffic
    nkind = np.full(len(nv), int(Kind.ANNOTATION), np.int64)
    if len(nv):
        nf = fl[nname]
        nkind[nf[:, 1] | nf[:, 2] | (nv[:, 5] != 0)] = Kind.COMM
        nkind[nf[:, 3]] = Kind.DATALOADER
        nkind[nf[:, 4]] = Kind.STEP
    if explicit_step and not np.any(nkind == Kind.STEP):
        hint = _frequent(nv_names, nv[:, 4]) if len(nv) else ""
        raise InputError(
            ex.path,
            f"step marker '{th.step_re}' matches no NVTX range"
            + ("" if len(nv) else " (the export has no NVTX ranges)"),
            f"most frequent NVTX ranges: {hint}; pass a regex that matches one of them"
            if hint else "capture with NVTX tracing (`nsys profile -t cuda,nvtx`) and mark "
            "steps with torch.cuda.nvtx.range",
        )  # fmt: skip

    # ---- processes → ranks ----
    gp, rp, npc = _pieces(gpu, 1), _pieces(rt, 0), _pieces(nv, 0)
    gidx = {p: np.flatnonzero(gpu[:, 1] == p) for p in gp}
    ridx = {p: np.flatnonzero(rt[:, 0] == p) for p in rp}
    nidx = {p: np.flatnonzero(nv[:, 0] == p) for p in npc}
    pids = sorted(gp, key=lambda p: (int(gp[p][:, 2].min()), p))
    env = ex.env()
    threads = _thread_rank(ex)
    file_rank = rank_from_filename(Path(source))
    capture = ex.install_version() or env.get("NSIGHT_SYSTEMS_VERSION")
    gpu_names = _gpu_names(ex, sorted(set(gpu[:, 2].tolist())))
    metrics = _gpu_metrics(ex)
    out: list[RankTimeline] = []
    for order, pid in enumerate(pids):
        meta = RankMeta(source=source, fmt="nsys", era=era, notes=list(notes))
        rank, meta.rank_from = _rank(order, pid, len(pids), env, threads, file_rank)
        if len(pids) == 1:
            size = next((env[v] for v in SIZE_VARS if v in env), None)
            meta.world_size = int(size) if size and size.isdigit() else None
        elif rank is None:
            rank = order
        gi, ri, ni = gidx[pid], ridx.get(pid, _EMPTY), nidx.get(pid, _EMPTY)
        tl = _timeline(
            int(rank or 0), meta, gpu[gi], gkind[gi], gname[gi], rt[ri], rname[ri],
            nv[ni], nkind[ni], nname[ni], names,
        )  # fmt: skip
        devs = sorted(set(gpu[gi, 2].tolist()))
        meta.devices = [gpu_names[d] for d in devs if d in gpu_names]
        meta.extra.update({"pid": pid, "cuda_devices": devs, "step_re": step_re})
        mine = {m: tv for d in devs for m, tv in metrics.get(d, {}).items()}
        if not mine and len(pids) == 1 and len(metrics) == 1:
            mine = next(iter(metrics.values()))  # one process, one sampled GPU
        if mine:
            meta.extra["gpu_metrics"] = mine
        if capture:
            meta.extra["capture_version"] = capture
        _step_notes(tl, nv_names, nv[ni, 4], explicit_step)
        out.append(tl)
    warn = next((n for tl in out for n in tl.meta.notes if n.startswith(_NO_STEPS)), None)
    if warn:
        print(f"gpudiag: warning: {source}: {warn}", file=sys.stderr)
    if len(pids) > 1:
        others = len((set(rp) | set(npc)) - set(gp))
        if others:
            for tl in out:
                tl.meta.notes.append(f"{others} other process(es) in the report ran no GPU work")
    return out


# GPU_METRICS counters gpudiag joins to steps: key → metricName prefix (names vary by
# release and GPU: "SMs Active [Throughput %]", "SM Active", "Tensor Active [...]").
GPU_METRIC_NAMES = {"sm_active": ("SMs Active", "SM Active"), "sm_issue": ("SM Issue",),
                    "tensor_active": ("Tensor Active",)}  # fmt: skip


def _gpu_metrics(ex: _Export) -> dict[int, dict[str, list[list[float]]]]:
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
    out: dict[int, dict[str, list[list[float]]]] = {}
    for dev in np.unique(rows[:, 1]).tolist():
        for mid, key in ids.items():
            sel = rows[(rows[:, 1] == dev) & (rows[:, 2] == mid) & (rows[:, 3] >= 0)]
            if len(sel):
                out.setdefault(int(dev), {})[key] = [
                    sel[:, 0].tolist(),
                    (sel[:, 3] / 100.0).tolist(),
                ]
    return out


_EMPTY = np.zeros(0, np.int64)
_NO_STEPS = "no step markers among the NVTX ranges"


def _rank(
    order: int,
    pid: int,
    nproc: int,
    env: dict[str, str],
    threads: dict[int, int],
    file_rank: int | None,
) -> tuple[int | None, str]:
    """A process's rank and where it came from (docs/formats.md, "Rank")."""
    if pid in threads:
        return threads[pid], "nvtx thread name"
    if nproc == 1:
        for v in RANK_VARS:
            if env.get(v, "").isdigit():
                return int(env[v]), f"environment {v}"
        if file_rank is not None:
            return file_rank, "file name"
        return 0, "default"
    # One report per node: the captured environment is the launcher's; ranks in the
    # order of their CUDA device, then PID.
    return order, "process order"


def _timeline(
    rank: int,
    meta: RankMeta,
    gpu: I64A,
    gkind: I64A,
    gname: I64A,
    rt: I64A,
    rname: I64A,
    nv: I64A,
    nkind: I64A,
    nname: I64A,
    names: list[str],
) -> RankTimeline:
    """Columns of one process: GPU lanes ``gpu:<dev>:<stream>``, host lanes ``cpu:<tid>``."""
    gkey = (gpu[:, 2] << 32) | (gpu[:, 3] & 0xFFFFFFFF)
    gl, glane = np.unique(gkey, return_inverse=True)
    host_tid = np.concatenate([rt[:, 1], nv[:, 1]])
    hl, hlane = np.unique(host_tid, return_inverse=True)
    lanes = [f"gpu:{int(k) >> 32}:{int(k) & 0xFFFFFFFF}" for k in gl.tolist()]
    lanes += [f"cpu:{int(t)}" for t in hl.tolist()]
    ng, nr = len(gpu), len(rt)
    start = np.concatenate([gpu[:, 4], rt[:, 2], nv[:, 2]])
    end = np.concatenate([gpu[:, 5], rt[:, 3], nv[:, 3]])
    kind = np.concatenate([gkind, np.full(nr, int(Kind.RUNTIME), np.int64), nkind])
    lane = np.concatenate([glane.reshape(-1), len(gl) + hlane.reshape(-1)])
    name_g = np.concatenate([gname, rname, nname])
    used, name_local = np.unique(name_g, return_inverse=True)
    launch = np.full(len(start), -1, np.int64)
    launch[:ng] = gpu[:, 8]
    nbytes = np.full(len(start), -1, np.int64)
    nbytes[:ng] = np.where(gkind == Kind.COMPUTE, -1, gpu[:, 7])
    meta.has_gpu = True
    meta.main_lane = _main_lane(lanes, lane, kind, name_local, [names[i] for i in used], meta)
    linked = np.count_nonzero(gpu[:, 8] >= 0)
    if linked < 0.5 * ng:
        meta.notes.append(f"only {linked} of {ng} GPU ops have a launching runtime call in "
                          "the export; steps are assigned by time instead")  # fmt: skip
    return RankTimeline.from_columns(
        rank, start_ns=start, end_ns=end, kind=kind, lane=lane, name=name_local.reshape(-1),
        lanes=lanes, names=[names[i] for i in used.tolist()], launch_ns=launch, nbytes=nbytes,
        meta=meta,
    )  # fmt: skip


def _main_lane(
    lanes: list[str],
    lane: I64A,
    kind: I64A,
    name: I64A,
    names: list[str],
    meta: RankMeta,
) -> int:
    """The training thread: steps, else Optimizer.step ranges, else tid == pid, else busiest."""
    for mask in (
        kind == Kind.STEP,
        np.isin(name, [i for i, s in enumerate(names) if s.startswith("Optimizer.step#")])
        & (kind == Kind.ANNOTATION),
    ):
        if mask.any():
            return int(np.bincount(lane[mask]).argmax())
    pid = meta.extra.get("pid")
    if pid is not None and f"cpu:{pid}" in lanes:
        return lanes.index(f"cpu:{pid}")
    host = kind != Kind.COMPUTE
    host &= np.array([ln.startswith("cpu:") for ln in lanes], bool)[lane] if len(lane) else host
    if host.any():
        return int(np.bincount(lane[host]).argmax())
    return -1


def _step_notes(tl: RankTimeline, nv_names: list[str], nv_name: I64A, explicit: bool) -> None:
    """Say where steps will come from when no step range is present."""
    if np.any(tl.kind == Kind.STEP):
        return
    opt = any(s.startswith("Optimizer.step#") for s in tl.names)
    if opt:
        return
    if not len(nv_name):
        tl.meta.notes.append(
            "no NVTX ranges in the export, so no step markers: the capture is one window "
            "(capture with `nsys profile -t cuda,nvtx` and mark steps with "
            "torch.cuda.nvtx.range or `gpudiag run`)"
        )
        return
    tl.meta.notes.append(
        f"{_NO_STEPS} (most frequent: {_frequent(nv_names, nv_name)}); "
        "pick one with --step-marker REGEX"
    )
