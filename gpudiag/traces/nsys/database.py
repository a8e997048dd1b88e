"""An Nsight Systems SQLite export opened for reading: its tables, columns, metadata and schema.

The file is opened with ``immutable=1``, so that SQLite never creates a
``-wal``/``-shm``/``-journal`` file beside the user's export; an export in WAL mode with a
``-wal`` file beside it is read from a private copy of both (:func:`connect`). Schema drift
(``docs/formats.md``, shared ``reference/nsys-export.md`` §2) is handled by resolving tables
by name (exact, else the highest ``_V<n>`` suffix), checking columns before using optional
ones and treating a missing table as "not captured" (:class:`Export`,
:func:`check_schema`); only tables are read (a view could compute anything, forever). The
rows gpudiag maps are queried in :mod:`gpudiag.traces.nsys.sql`.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from gpudiag._support.fileio import open_input
from gpudiag.errors import InputError

SQLITE_MAGIC = b"SQLite format 3\x00"


# EXPORT_SCHEMA_VERSION → the nsys release that wrote it (reference §2). Other minor
# versions of a known major are read with the same rules and noted.
KNOWN_SCHEMAS = {
    "2.9.1": "2022.2",
    "3.0.0": "2022.4",
    "3.4.0": "2023.3",
    "3.7.2": "2023.4",
    "3.16.1": "2024.6",
    "3.17.1": "2025.1",
    "3.24.0": "2025.5",
    "3.24.14": "2026.1",
    "3.25.0": "2026.2",
    "3.28.1": "2026.4",
}


SUPPORTED_MAJORS = (2, 3)


# Launcher variables naming the global rank, most specific first: under srun + mpirun,
# SLURM_PROCID is 0 while OMPI_COMM_WORLD_RANK is the rank.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")


# The program's own world (torchrun, MPI), never the scheduler's task count: SLURM_NTASKS=8
# may run one process that drives several GPUs.
SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


I64A = npt.NDArray[np.int64]


def vtuple(v: str) -> tuple[int, ...]:
    """A version string as a tuple of up to four integers."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def connect(path: Path) -> tuple[sqlite3.Connection, Path | None]:
    """Open an export read-only: (connection, private copy directory to remove or None).

    InputError for anything that is not a regular SQLite file. Nothing is ever created
    beside ``path``: it is opened ``immutable=1`` (no locks, no journal, no WAL index);
    a WAL-mode export whose ``-wal`` file holds data is copied with it to a private
    directory first, where SQLite may replay the WAL.
    """
    try:
        with open_input(path) as f:
            head = f.read(100)
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from e
    if head[:16] != SQLITE_MAGIC:
        raise InputError(
            path,
            "not a SQLite database",
            "give an Nsight Systems export (`nsys export --type sqlite`) or the .nsys-rep",
        )
    wal = Path(f"{path}-wal")
    private: Path | None = None
    target = path.resolve()
    uri = f"file:{quote(str(target))}?mode=ro&immutable=1"
    if len(head) >= 20 and 2 in (head[18], head[19]) and wal.is_file() and wal.stat().st_size:
        private = Path(tempfile.mkdtemp(prefix="gpudiag-nsys-"))
        try:
            shutil.copyfile(path, private / "export.sqlite")
            shutil.copyfile(wal, private / "export.sqlite-wal")
        except OSError as e:
            shutil.rmtree(private, ignore_errors=True)
            raise InputError(path, f"cannot copy the export and its WAL file ({e})") from e
        uri = f"file:{quote(str(private / 'export.sqlite'))}"
    try:
        con = sqlite3.connect(uri, uri=True)
    except (sqlite3.Error, UnicodeDecodeError) as e:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
        raise InputError(path, f"cannot open as SQLite ({one_line(e)})", CORRUPT_HINT) from e
    # Some 2021–2022 exports hold text that is not UTF-8.
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con, private


def one_line(e: BaseException) -> str:
    """An exception's text on one line (SQLite quotes a damaged schema's SQL, newlines too)."""
    return " ".join(str(e).split())[:300]


def corrupt(path: Path, e: BaseException) -> InputError:
    """The error for a database SQLite cannot read."""
    return InputError(path, f"corrupt SQLite database ({one_line(e)})", CORRUPT_HINT)


def quoted(name: str) -> str:
    """A table or column name quoted for SQL (a damaged file may name it anything)."""
    return '"' + name.replace('"', '""') + '"'


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
    """An open export: its tables, columns and metadata, and notes on what was not read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con, self._private = connect(path)
        self.notes: list[str] = []
        self.dropped_rows: dict[str, int] = {}  # "<what> ignored (<why>)" → rows
        try:
            rows = self.con.execute("SELECT type, name FROM sqlite_master").fetchall()
        except (sqlite3.Error, UnicodeDecodeError) as e:  # see load_nsys
            self.close()
            raise corrupt(path, e) from e
        names = [str(n) for t, n in rows if t == "table" and isinstance(n, str)]
        self.tables = resolve_tables(names)
        views = resolve_tables([str(n) for t, n in rows if t == "view" and isinstance(n, str)])
        self.views = {b: v for b, v in views.items() if b not in self.tables}
        self._cols: dict[str, set[str]] = {}

    def close(self) -> None:
        """Close the connection and remove the private copy, if one was made."""
        self.con.close()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)

    def table(self, name: str) -> str | None:
        """The file's name for a canonical table, None when it is absent (or only a view)."""
        return self.tables.get(name)

    def cols(self, name: str) -> set[str]:
        """The columns of a table (empty when the table is absent)."""
        t = self.tables.get(name)
        if t is None:
            return set()
        if t not in self._cols:
            self._cols[t] = {str(r[1]) for r in self.con.execute(f"PRAGMA table_info({quoted(t)})")}
        return self._cols[t]

    def rows(self, sql: str, *args: Any) -> list[Any]:
        """All rows of a query."""
        return self.con.execute(sql, args).fetchall()

    def ints(self, sql: str, ncols: int) -> I64A:
        """An integer query as an (n, ncols) array, decoded in C.

        The queries make every cell a number in range (``BETWEEN`` filters, ``CASE``
        defaults); anything else reaching here is a damaged file, named as such.
        """
        cur = self.con.execute(sql)
        try:
            flat = np.fromiter(chain.from_iterable(cur), dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as e:
            raise InputError(self.path, f"a cell that is not an integer ({e})", CORRUPT_HINT) from e
        return flat.reshape(-1, ncols)

    def count(self, name: str, where: str = "") -> int:
        """Rows of a canonical table (``where``: an SQL condition), 0 when it is absent."""
        t = self.tables.get(name)
        if t is None:
            return 0
        (n,) = self.con.execute(
            f"SELECT COUNT(*) FROM {quoted(t)}" + (f" WHERE {where}" if where else "")
        ).fetchone()
        return int(n)

    def usable(self, name: str, needed: set[str]) -> str | None:
        """The file's name of a canonical table that has the ``needed`` columns, else None.

        A table that exists without them is noted (a renamed column is not read silently).
        """
        t = self.tables.get(name)
        if t is None:
            return None
        lacking = sorted(needed - self.cols(name))
        if lacking:
            self.notes.append(f"{t} has no column {', '.join(lacking)} (renamed?): not read")
            return None
        return t

    def dropped(self, what: str, n: int, why: str) -> None:
        """Count ``n`` rows that were not read in a note."""
        if n > 0:
            self.notes.append(f"{n} {what} ignored ({why})")
            reason = f"{what} ignored ({why})"
            self.dropped_rows[reason] = self.dropped_rows.get(reason, 0) + n

    def meta(self) -> dict[str, str]:
        """The export's metadata table (schema and product versions)."""
        for canon in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            t = self.usable(canon, {"name", "value"})
            if t:
                return {
                    str(k): str(v) for k, v in self.rows(f"SELECT name, value FROM {quoted(t)}")
                }
        return {}

    def env(self) -> dict[str, str]:
        """The launch environment's rank variables (values of other variables are not kept)."""
        want = set(RANK_VARS) | set(SIZE_VARS) | {"NSIGHT_SYSTEMS_VERSION"}
        out: dict[str, str] = {}
        t = self.usable("META_DATA_CAPTURE", {"name", "value"})
        if t:
            for (v,) in self.rows(
                f"SELECT value FROM {quoted(t)} WHERE name LIKE '%ENVIRONMENT_VARIABLE'"
            ):
                k, _, val = str(v).partition("=")
                if k in want:
                    out[k] = val.strip('"')
        t = self.usable("TARGET_INFO_SYSTEM_ENV", {"name", "value"})
        if t:
            for (v,) in self.rows(
                f"SELECT value FROM {quoted(t)} WHERE name = 'DeviceEnvironment'"
            ):
                for item in str(v).split(";"):
                    k, _, val = item.partition("=")
                    if k in want:
                        out[k] = val.strip('"')
        return out

    def install_version(self) -> str | None:
        """The capturing nsys, from ``TargetInstallDir`` (the path names the release)."""
        t = self.tables.get("TARGET_INFO_SYSTEM_ENV")
        if not t or not {"name", "value"} <= self.cols("TARGET_INFO_SYSTEM_ENV"):
            return None  # noted by env()
        for (v,) in self.rows(f"SELECT value FROM {quoted(t)} WHERE name = 'TargetInstallDir'"):
            m = re.search(r"/(\d{4}\.\d+\.\d+)", str(v))
            if m:
                return m.group(1)
        return None


CORRUPT_HINT = "the file is damaged or truncated; export it again with `nsys export --type sqlite`"


def check_schema(ex: Export, meta: dict[str, str]) -> tuple[str, list[str]]:
    """The era label; InputError for exports gpudiag cannot read."""
    notes: list[str] = []
    for needed in ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL"):
        if needed in ex.views:
            raise InputError(
                ex.path,
                f"{ex.views[needed]} is a view, not a table (the export was edited?)",
                "gpudiag reads the tables `nsys export --type sqlite` writes; export again",
            )
    for base, name in sorted(ex.views.items()):
        if base in READ_TABLES:
            notes.append(f"{name} is a view, not a table: not read")
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
            notes.append(
                f"export schema {schema} is not one gpudiag was tested with; "
                "read with the rules of schema 3"
            )
    if not ex.table("CUPTI_ACTIVITY_KIND_KERNEL"):
        from gpudiag.traces.nsys.holds import no_kernels, ranges_only  # they read Export

        if ranges_only(ex):  # read as host ranges (holds.range_timelines)
            return f"nsys {product or '≤2021.3'}" + (f" schema {schema}" if schema else ""), notes
        raise InputError(ex.path, *no_kernels(ex))
    missing = sorted(GPU_COLUMNS - ex.cols("CUPTI_ACTIVITY_KIND_KERNEL"))
    if missing:
        raise InputError(
            ex.path,
            f"the kernel table {ex.table('CUPTI_ACTIVITY_KIND_KERNEL')} has no column "
            f"{', '.join(missing)} (renamed?), so no kernel can be placed",
            "the export is damaged or edited; export the report again with `nsys export`",
        )
    era = f"nsys {product or '≤2021.3'}" + (f" schema {schema}" if schema else "")
    return era, notes


# The tables gpudiag reads; a view in their place is noted (or refused, for the kernels).
READ_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "StringIds",
    "TARGET_INFO_GPU",
    "GPU_METRICS",
    "TARGET_INFO_GPU_METRICS",
    "META_DATA_EXPORT",
    "EXPORT_META_DATA",
    "META_DATA_CAPTURE",
    "TARGET_INFO_SYSTEM_ENV",
}


GPU_COLUMNS = {"start", "end", "deviceId", "streamId"}
