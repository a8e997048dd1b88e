"""Hand-made bad inputs, one function each: Kineto traces, Nsight exports, run directories,
saved diagnoses and special files, each written into its own directory.

Every case says what it must end in: ``error`` (a GpudiagError whose message holds
``expect``), ``diagnosis`` (with ``expect`` in one of its notes, when given) or ``either``.
The inputs are built from the shared traces and exports (``../shared/traces``) where a
real file is the better starting point, and by hand otherwise.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEEP = 100_000
DEEP_JSON = "[" * DEEP + "]" * DEEP
SMALL_TRACE = "kineto/edge_mi300x_triton_tiny/mi300x.json.gz"  # 113 events
STEP_TRACE = "kineto/sampled_2rank_a2a/rank-0.json.gz"  # ProfilerStep ranges, 2 ranks
EXPORT = "nsys/nsys-ai/healthy_1pct.sqlite"  # 114 KB: kernels and runtime calls
NVTX_EXPORT = "nsys/nsys-ai/mfu_2gpu_before.sqlite"  # 2.7 MB: 2 ranks, NCCL, NVTX ranges


@dataclass
class Case:
    """A bad input: ``build(dir)`` writes it and returns the paths to analyse."""

    name: str
    build: Callable[[Path], list[Path]]
    outcome: str = "error"  # "error", "diagnosis" or "either"
    expect: str = ""  # text the error message (or a note of the diagnosis) holds
    cli: bool = False  # also run through the CLI subprocess
    exit_code: int = 4


CASES: list[Case] = []
_shared: Path = Path()


def case(
    outcome: str = "error", expect: str = "", cli: bool = False, exit_code: int = 4
) -> Callable[[Callable[[Path], list[Path]]], Callable[[Path], list[Path]]]:
    """Register a builder as a case named after the function."""

    def add(fn: Callable[[Path], list[Path]]) -> Callable[[Path], list[Path]]:
        CASES.append(Case(fn.__name__, fn, outcome, expect, cli, exit_code))
        return fn

    return add


def use_shared(shared: Path) -> list[Case]:
    """The cases, reading base files from ``shared`` (the ``../shared/traces`` folder)."""
    global _shared
    _shared = shared
    return CASES


def trace(rel: str = SMALL_TRACE) -> dict[str, Any]:
    """A shared Kineto trace as a dict."""
    with gzip.open(_shared / rel, "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def write(d: Path, name: str, data: bytes | str | dict[str, Any]) -> Path:
    """Write a file (a dict as JSON, gzipped for .gz); returns its path."""
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, dict):  # "@@DEEP@@" marks a value nested DEEP levels (too deep to dump)
        data = json.dumps(data, allow_nan=True).replace('"@@DEEP@@"', DEEP_JSON)
    raw = data.encode() if isinstance(data, str) else data
    p.write_bytes(gzip.compress(raw, mtime=0) if name.endswith(".gz") else raw)
    return p


def x_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def with_event_change(
    change: Callable[[dict[str, Any]], None], k: int = 3
) -> Callable[[Path], list[Path]]:
    """A builder: the small trace with ``change`` applied to its first ``k`` X events."""

    def build(d: Path) -> list[Path]:
        doc = trace()
        for e in x_events(doc)[:k]:
            change(e)
        return [write(d, "rank-0.json", doc)]

    return build


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(e: dict[str, Any]) -> None:
        e[key] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(e: dict[str, Any]) -> None:
        e.pop(key, None)

    return change


def _arg(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(e: dict[str, Any]) -> None:
        e.setdefault("args", {})[key] = value

    return change


def _top(key: str, value: Any, rel: str = SMALL_TRACE) -> Callable[[Path], list[Path]]:
    def build(d: Path) -> list[Path]:
        doc = trace(rel)
        if "." in key:
            a, b = key.split(".")
            doc.setdefault(a, {})[b] = value
        else:
            doc[key] = value
        return [write(d, "trace.json", doc)]

    return build


# ---- Kineto: files that are not traces


@case(expect="empty file", cli=True)
def kineto_empty(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", b"")]


@case(expect="empty file")
def kineto_whitespace(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", b" \n\t " * 100)]


@case(expect="not JSON")
def kineto_binary(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", bytes(range(256)) * 40)]


@case(expect="does not look like a PyTorch Profiler trace")
def kineto_top_level_list(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", "[1, 2, 3]")]


@case(expect="without `traceEvents`")
def kineto_no_events_key(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", '{"schemaVersion": 1}')]


@case(expect="`traceEvents` is not a list")
def kineto_events_not_list(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", '{"traceEvents": {"ph": "X"}}')]


@case(expect="holds no events")
def kineto_events_empty(d: Path) -> list[Path]:
    return [write(d, "rank-0.json", '{"traceEvents": []}')]


@case(expect="malformed or truncated JSON", cli=True)
def kineto_truncated(d: Path) -> list[Path]:
    text = json.dumps(trace())
    return [write(d, "rank-0.json", text[: len(text) // 2])]


@case(expect="truncated or corrupt gzip")
def kineto_truncated_gzip(d: Path) -> list[Path]:
    data = gzip.compress(json.dumps(trace()).encode(), mtime=0)
    p = d / "rank-0.json.gz"
    p.write_bytes(data[: len(data) // 2])
    return [p]


@case(expect="not JSON")
def kineto_gzip_bomb_of_zeros(d: Path) -> list[Path]:
    # 256 MiB of zeros in 256 KiB of gzip: refused after the first block, not read whole.
    p = d / "rank-0.json.gz"
    with gzip.open(p, "wb", compresslevel=9) as f:
        block = b"\0" * (1 << 20)
        for _ in range(256):
            f.write(block)
    return [p]


@case(expect="malformed or truncated JSON")
def kineto_nan_token(d: Path) -> list[Path]:
    doc = trace()
    x_events(doc)[0]["ts"] = float("nan")
    return [write(d, "rank-0.json", doc)]  # json.dumps writes NaN: not JSON


# ---- Kineto: damaged events (dropped and counted; the rest analysed)

CASES += [
    Case(
        "kineto_ts_minus_1e308",
        with_event_change(_set("ts", -1e308)),
        "diagnosis",
        "invalid timestamps",
        cli=True,
    ),
    Case(
        "kineto_dur_1e308", with_event_change(_set("dur", 1e308)), "diagnosis", "invalid timestamps"
    ),
    Case(
        "kineto_ts_1e400",
        with_event_change(_set("ts", 10**400)),
        "diagnosis",
        "`ts` of the wrong type or out of range",
    ),
    Case(
        "kineto_dur_negative", with_event_change(_set("dur", -5)), "diagnosis", "invalid timestamps"
    ),
    Case(
        "kineto_ts_string",
        with_event_change(_set("ts", "12.5")),
        "diagnosis",
        "`ts` of the wrong type",
    ),
    Case(
        "kineto_dur_list",
        with_event_change(_set("dur", [1])),
        "diagnosis",
        "`dur` of the wrong type",
    ),
    Case(
        "kineto_pid_list",
        with_event_change(_set("pid", [1, 2])),
        "diagnosis",
        "`pid` of the wrong type",
    ),
    Case(
        "kineto_pid_2_70",
        with_event_change(_set("pid", 2**70)),
        "diagnosis",
        "`pid` of the wrong type or out of range",
    ),
    Case(
        "kineto_name_number",
        with_event_change(_set("name", 7)),
        "diagnosis",
        "`name` of the wrong type",
    ),
    Case(
        "kineto_cat_null",
        with_event_change(_set("cat", None)),
        "diagnosis",
        "`cat` of the wrong type",
    ),
    Case("kineto_no_ts", with_event_change(_drop("ts")), "diagnosis", "without ts or dur"),
    Case("kineto_no_dur", with_event_change(_drop("dur")), "diagnosis", "without ts or dur"),
    Case("kineto_no_pid", with_event_change(_drop("pid")), "diagnosis", "without pid or tid"),
    Case("kineto_no_name", with_event_change(_drop("name")), "diagnosis", "without a name"),
    Case("kineto_no_ph", with_event_change(_drop("ph")), "diagnosis", "without ph"),
    Case("kineto_unknown_ph", with_event_change(_set("ph", "Q")), "diagnosis", "unknown phase"),
    Case("kineto_args_list", with_event_change(_set("args", [1])), "diagnosis", "`args` values"),
    Case(
        "kineto_correlation_2_64",
        with_event_change(_arg("correlation", 2**64)),
        "diagnosis",
        "`args.correlation` values",
    ),
    Case("kineto_nelems_huge", with_event_change(_arg("In msg nelems", 2**62), k=200), "diagnosis"),
    Case("kineto_deep_args", with_event_change(_arg("x", "@@DEEP@@")), "error", "nested deeper"),
    Case(
        "kineto_deep_unknown_key",
        with_event_change(_set("zz", "@@DEEP@@")),
        "error",
        "nested deeper",
        cli=True,
    ),
    Case(
        "kineto_all_ts_invalid",
        with_event_change(_set("ts", -1e308), k=10**6),
        "error",
        "no usable events",
    ),
    Case(
        "kineto_base_2_63_minus_1",
        _top("baseTimeNanoseconds", 2**63 - 1),
        "error",
        "baseTimeNanoseconds is 9223372036854775807",
    ),
    Case(
        "kineto_base_2_70",
        _top("baseTimeNanoseconds", 2**70),
        "error",
        "baseTimeNanoseconds is 1180591620717411303424",
        cli=True,
    ),
    Case(
        "kineto_base_string",
        _top("baseTimeNanoseconds", "0"),
        "error",
        "baseTimeNanoseconds is a string",
    ),
    Case(
        "kineto_rank_minus_1",
        _top("distributedInfo.rank", -1),
        "error",
        "distributedInfo.rank is -1",
    ),
    Case(
        "kineto_rank_2_70",
        _top("distributedInfo.rank", 2**70),
        "error",
        "distributedInfo.rank is 1180591620717411303424",
    ),
    Case(
        "kineto_rank_true",
        _top("distributedInfo.rank", True),
        "error",
        "distributedInfo.rank is true",
        cli=True,
    ),
    Case(
        "kineto_world_size_zero",
        _top("distributedInfo.world_size", 0),
        "error",
        "distributedInfo.world_size is 0",
    ),
    Case(
        "kineto_distinfo_list",
        _top("distributedInfo", [1]),
        "diagnosis",
        "distributedInfo is a list",
    ),
    Case(
        "kineto_device_props_string",
        _top("deviceProperties", "x"),
        "diagnosis",
        "deviceProperties is a string",
    ),
    Case("kineto_deep_top_level", _top("zz", "@@DEEP@@"), "error", "nested deeper"),
]


def _steps_named(number: str) -> Callable[[Path], list[Path]]:
    def build(d: Path) -> list[Path]:
        doc = trace(STEP_TRACE)
        for e in x_events(doc):
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{number}"
                break
        return [write(d, "rank-0.json", doc)]

    return build


CASES += [
    Case(
        "kineto_step_3e9",
        _steps_named("3000000000"),
        "error",
        "step number 3000000000 is out of range",
        cli=True,
    ),
    Case("kineto_step_2_70", _steps_named(str(2**70)), "error", "is out of range"),
]


@case(outcome="diagnosis", expect="`traceEvents` arrays besides the last")
def kineto_duplicate_events_key(d: Path) -> list[Path]:
    doc = trace()
    text = json.dumps(doc).replace('"traceEvents":', '"traceEvents": [], "traceEvents":', 1)
    return [write(d, "rank-0.json", text)]


@case(outcome="diagnosis", expect="entries of `traceEvents` that are not objects")
def kineto_events_not_objects(d: Path) -> list[Path]:
    doc = trace()
    doc["traceEvents"] += [1, "x", None, [], True]
    return [write(d, "rank-0.json", doc)]


@case(outcome="diagnosis", expect="more than 7 days away")
def kineto_outlier_event(d: Path) -> list[Path]:
    doc = trace()
    x_events(doc)[0]["ts"] = 1.0  # 1970, the others are in 2024
    return [write(d, "rank-0.json", doc)]


@case(expect="the rank in the file name is 99999999999")
def kineto_rank_in_name_huge(d: Path) -> list[Path]:
    doc = trace()
    doc.pop("distributedInfo", None)
    return [write(d, "rank-99999999999.json", doc)]


@case(outcome="diagnosis")
def kineto_huge_string_field(d: Path) -> list[Path]:
    # one 20 MB string argument: streamed in linear time, no boundary for 20 blocks
    doc = trace()
    x_events(doc)[0].setdefault("args", {})["note"] = "a" * 20_000_000
    return [write(d, "rank-0.json", doc)]


@case(outcome="diagnosis")
def kineto_braces_in_strings(d: Path) -> list[Path]:
    # `},{` inside strings: every streaming cut there is rejected, the file still loads
    doc = trace()
    for e in x_events(doc):
        e.setdefault("args", {})["note"] = '"},{"ph":"X"} ' * 50
    return [write(d, "rank-0.json", doc)]


# ---- special files


@case(expect="not a regular file (a FIFO", cli=True)
def fifo_named_json(d: Path) -> list[Path]:
    p = d / "rank-0.json"
    os.mkfifo(p)
    return [p]


@case(expect="not a regular file (a character device, through a symbolic link")
def link_to_dev_zero(d: Path) -> list[Path]:
    p = d / "rank-0.json.gz"
    p.symlink_to("/dev/zero")
    return [p]


@case(expect="not a regular file (a character device")
def link_to_dev_urandom_sqlite(d: Path) -> list[Path]:
    p = d / "report.sqlite"
    p.symlink_to("/dev/urandom")
    return [p]


@case(expect="not a regular file (a socket")
def socket_named_json(d: Path) -> list[Path]:
    p = d / "s.json"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.close()  # the socket file stays
    return [p]


@case(expect="no such file or directory")
def dangling_link(d: Path) -> list[Path]:
    p = d / "rank-0.json"
    p.symlink_to(d / "missing.json")
    return [p]


@case(outcome="diagnosis", expect="a FIFO (named pipe), not a regular file")
def dir_with_fifo_and_trace(d: Path) -> list[Path]:
    t = d / "traces"
    write(t, "rank-0.json", trace())
    os.mkfifo(t / "rank-1.json")
    (t / "rank-2.json.gz").symlink_to("/dev/zero")
    (t / "rank-3.json").symlink_to(t / "gone.json")
    return [t]


@case(outcome="either", expect="permission denied")
def unreadable_file(d: Path) -> list[Path]:
    p = write(d, "rank-0.json", trace())
    p.chmod(0)  # root reads it anyway: either outcome is right there
    return [p]


@case(outcome="either", expect="permission denied")
def unreadable_subdirectory(d: Path) -> list[Path]:
    t = d / "traces"
    write(t, "rank-0.json", trace())
    write(t / "more", "rank-1.json", trace())
    (t / "more").chmod(0)
    return [t]


# ---- Nsight exports


def export_copy(d: Path, name: str = "report.sqlite", base: str = EXPORT) -> Path:
    p = d / name
    shutil.copyfile(_shared / base, p)
    return p


def sql_case(
    name: str,
    statements: list[str],
    outcome: str = "error",
    expect: str = "",
    cli: bool = False,
    base: str = EXPORT,
) -> None:
    """A case: a shared export with ``statements`` applied to a copy."""

    def build(d: Path) -> list[Path]:
        p = export_copy(d, base=base)
        con = sqlite3.connect(p)
        for s in statements:
            con.execute(s)
        con.commit()
        con.close()
        return [p]

    CASES.append(Case(name, build, outcome, expect, cli))


K = "CUPTI_ACTIVITY_KIND_KERNEL"
R = "CUPTI_ACTIVITY_KIND_RUNTIME"
sql_case("nsys_no_kernel_table", [f"DROP TABLE {K}"], expect="no CUDA kernel table")
sql_case("nsys_no_stringids", ["DROP TABLE StringIds"], expect="not an Nsight Systems export")
sql_case(
    "nsys_kernel_start_renamed",
    [f"ALTER TABLE {K} RENAME COLUMN start TO begin"],
    expect="has no column start (renamed?)",
    cli=True,
)
sql_case(
    "nsys_kernel_device_renamed",
    [f"ALTER TABLE {K} RENAME COLUMN deviceId TO dev"],
    expect="has no column deviceId",
)
sql_case(
    "nsys_kernel_view",
    [f"ALTER TABLE {K} RENAME TO K_REAL", f"CREATE VIEW {K} AS SELECT * FROM K_REAL"],
    expect="is a view, not a table",
)
sql_case(
    "nsys_runtime_view",
    [f"ALTER TABLE {R} RENAME TO R_REAL", f"CREATE VIEW {R} AS SELECT * FROM R_REAL"],
    outcome="diagnosis",
    expect="is a view, not a table: not read",
)
sql_case(
    "nsys_kernel_text_cells",
    [
        f"UPDATE {K} SET start = 'abc' WHERE rowid % 7 = 0",
        f"UPDATE {K} SET deviceId = '' WHERE rowid % 11 = 0",
    ],
    outcome="diagnosis",
    expect="not integers, or out of range",
)
sql_case(
    "nsys_kernel_blob_cells",
    [f"UPDATE {K} SET \"end\" = x'00ff' WHERE rowid % 5 = 0"],
    outcome="diagnosis",
    expect="rows of CUPTI_ACTIVITY_KIND_KERNEL ignored",
)
sql_case(
    "nsys_kernel_null_cells",
    [f"UPDATE {K} SET streamId = NULL WHERE rowid % 3 = 0"],
    outcome="diagnosis",
    expect="rows of CUPTI_ACTIVITY_KIND_KERNEL ignored",
)
sql_case(
    "nsys_kernel_int64_extremes",
    [
        f"UPDATE {K} SET start = -9223372036854775808 WHERE rowid % 4 = 0",
        f'UPDATE {K} SET "end" = 9223372036854775807 WHERE rowid % 4 = 1',
    ],
    outcome="diagnosis",
    expect="out of range",
)
sql_case(
    "nsys_kernel_all_text", [f"UPDATE {K} SET start = 'x'"], expect="export holds no GPU kernels"
)
sql_case("nsys_kernel_name_text", [f"UPDATE {K} SET shortName = 'abc'"], outcome="diagnosis")
sql_case(
    "nsys_runtime_text_tid",
    [f"UPDATE {R} SET globalTid = 'abc' WHERE rowid % 2 = 0"],
    outcome="diagnosis",
    expect="rows of CUPTI_ACTIVITY_KIND_RUNTIME ignored",
)
sql_case(
    "nsys_runtime_renamed",
    [f"ALTER TABLE {R} RENAME COLUMN globalTid TO gtid"],
    outcome="diagnosis",
    expect="runtime calls are not read",
)
sql_case(
    "nsys_nvtx_text_start",
    ["UPDATE NVTX_EVENTS SET start = 'x' WHERE rowid % 2 = 0"],
    outcome="diagnosis",
    expect="NVTX ranges of NVTX_EVENTS ignored",
    base=NVTX_EXPORT,
)
sql_case(
    "nsys_nvtx_renamed",
    ["ALTER TABLE NVTX_EVENTS RENAME COLUMN globalTid TO gtid"],
    outcome="diagnosis",
    expect="NVTX ranges are not read",
    base=NVTX_EXPORT,
)
sql_case(
    "nsys_nvtx_null_tid",
    [
        "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid % 3 = 0",
        "UPDATE NVTX_EVENTS SET domainId = NULL",
    ],
    outcome="diagnosis",
    base=NVTX_EXPORT,
)
sql_case(
    "nsys_stringids_blob",
    [
        "UPDATE StringIds SET value = x'ff00' WHERE id % 2 = 0",
        "UPDATE StringIds SET value = NULL WHERE id % 2 = 1",
    ],
    outcome="diagnosis",
)
sql_case(
    "nsys_schema_9",
    ["UPDATE META_DATA_EXPORT SET value = '9.0.0' WHERE name = 'EXPORT_SCHEMA_VERSION'"],
    expect="not supported",
)
sql_case(
    "nsys_env_rank_superscript",
    [
        "CREATE TABLE IF NOT EXISTS META_DATA_CAPTURE (name TEXT, value TEXT)",
        "INSERT INTO META_DATA_CAPTURE VALUES ('ENVIRONMENT_VARIABLE', 'RANK=²')",
    ],
    outcome="diagnosis",
)
sql_case(
    "nsys_mpi_rank_huge",
    [
        "INSERT INTO NVTX_EVENTS (start, eventType, globalTid, text) "
        "VALUES (0, 39, 281474976710656, 'MPI Rank 99999999999')"
    ],
    expect="not a rank",
    base=NVTX_EXPORT,
)
sql_case("nsys_quote_in_table_name", ['CREATE TABLE "NVTX""_EVENTS" (x)'], outcome="diagnosis")


@case(expect="corrupt SQLite database")
def nsys_zeroed_pages(d: Path) -> list[Path]:
    p = export_copy(d)
    data = bytearray(p.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    data[2 * page : 12 * page] = bytes(10 * page)
    p.write_bytes(bytes(data))
    return [p]


@case(expect="corrupt SQLite database")
def nsys_truncated(d: Path) -> list[Path]:
    p = export_copy(d)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    return [p]


@case(expect="not a SQLite database")
def nsys_not_sqlite(d: Path) -> list[Path]:
    return [write(d, "report.sqlite", b"SQLite format 2\0" + b"x" * 1000)]


@case(expect="not an Nsight Systems export")
def nsys_other_database(d: Path) -> list[Path]:
    p = d / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    return [p]


@case(outcome="diagnosis")
def nsys_wal_mode_with_wal_file(d: Path) -> list[Path]:
    # A writer still open: the export in WAL mode, its -wal file holding new rows.
    src = export_copy(d, "work.sqlite")
    con = sqlite3.connect(src)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute(f"DELETE FROM {K} WHERE rowid % 2 = 0")
    con.commit()
    p = d / "report.sqlite"
    shutil.copyfile(src, p)
    shutil.copyfile(f"{src}-wal", f"{p}-wal")
    con.close()
    src.unlink()
    return [p]


@case(outcome="diagnosis")
def nsys_wal_mode_in_read_only_dir(d: Path) -> list[Path]:
    sub = d / "ro"
    sub.mkdir()
    p = export_copy(sub)
    con = sqlite3.connect(p)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    sub.chmod(0o555)
    return [p]


# ---- run directories


def run_dir(d: Path, **manifest: Any) -> Path:
    """A small valid run directory: manifest, one rank's trace, telemetry, NVML samples."""
    r = d / "run"
    doc = {
        "schema_version": 1,
        "gpudiag_version": "0.1.0",
        "argv": ["train.py"],
        "hosts": ["h"],
        "world_size": 1,
        "ranks": [{"rank": 0, "host": "h"}],
        "sources": {"kineto": {"captured": True}, "nvml": {"captured": True}},
    }
    doc.update(manifest)
    write(r, "manifest.json", json.dumps(doc))
    write(r, "ranks/rank-0.pt.trace.json.gz", json.dumps(trace(STEP_TRACE)))
    hdr = {"type": "header", "format": "gpudiag.steps", "version": 1, "rank": 0, "host": "h"}
    t0 = 1_700_000_000_000_000_000
    steps = [
        {
            "type": "step",
            "step": i,
            "start_ns": t0 + i * 10**8,
            "end_ns": t0 + (i + 1) * 10**8,
            "data_wait_ns": 10**6,
            "comm_wait_ns": None,
            "backward_ns": None,
            "profiled": False,
        }
        for i in range(12)
    ]
    write(r, "ranks/rank-0.steps.jsonl", "\n".join(json.dumps(x) for x in [hdr, *steps]) + "\n")
    nv = {"type": "header", "format": "gpudiag.nvml", "version": 1, "host": "h"}
    samples = [
        {
            "type": "sample",
            "time_ns": t0 + i * 10**8,
            "gpu_uuid": "GPU-1",
            "index": 0,
            "util_ratio": 0.9,
        }
        for i in range(12)
    ]
    write(r, "nvml/h.jsonl", "\n".join(json.dumps(x) for x in [nv, *samples]) + "\n")
    return r


def _manifest(**fields: Any) -> Callable[[Path], list[Path]]:
    return lambda d: [run_dir(d, **fields)]


CASES += [
    Case("run_dir_valid", _manifest(), "diagnosis"),
    Case(
        "manifest_schema_null",
        _manifest(schema_version=None),
        "error",
        "schema_version: expected an integer",
        cli=True,
    ),
    Case("manifest_schema_list", _manifest(schema_version=[1]), "error", "schema_version"),
    Case("manifest_schema_newer", _manifest(schema_version=99), "error", "newer than"),
    Case(
        "manifest_ranks_string",
        _manifest(ranks="0,1"),
        "error",
        "ranks: expected a list, got a string",
    ),
    Case(
        "manifest_ranks_numbers", _manifest(ranks=[0, 1]), "error", "ranks[0]: expected an object"
    ),
    Case(
        "manifest_rank_negative",
        _manifest(ranks=[{"rank": -1}]),
        "error",
        "ranks[0].rank: expected an integer 0",
    ),
    Case(
        "manifest_sources_list",
        _manifest(sources=["kineto"]),
        "error",
        "sources: expected an object, got a list",
    ),
    Case("manifest_world_size_string", _manifest(world_size="2"), "error", "world_size"),
    Case("manifest_exit_code_float", _manifest(exit_code=1.5), "error", "exit_code"),
]


def _run_dir_edit(edit: Callable[[Path], None]) -> Callable[[Path], list[Path]]:
    def build(d: Path) -> list[Path]:
        r = run_dir(d)
        edit(r)
        return [r]

    return build


def _replace(rel: str, data: bytes | str) -> Callable[[Path], None]:
    def edit(r: Path) -> None:
        (r / rel).unlink()
        write(r, rel, data)

    return edit


def _special(rel: str, kind: str) -> Callable[[Path], None]:
    def edit(r: Path) -> None:
        p = r / rel
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        else:
            p.symlink_to(kind)

    return edit


def _lines(rel: str, extra: list[str]) -> Callable[[Path], None]:
    def edit(r: Path) -> None:
        p = r / rel
        p.write_text(p.read_text() + "\n".join(extra) + "\n")

    return edit


def _step(**kw: Any) -> str:
    rec = {
        "type": "step",
        "step": 20,
        "start_ns": 1_700_000_010_000_000_000,
        "end_ns": 1_700_000_010_100_000_000,
        "profiled": False,
    }
    rec.update(kw)
    return json.dumps(rec)


T = "ranks/rank-0.steps.jsonl"
N = "nvml/h.jsonl"
CASES += [
    Case(
        "manifest_deep",
        _run_dir_edit(
            _replace("manifest.json", '{"schema_version": 1, "extra": ' + DEEP_JSON + "}")
        ),
        "error",
        "nested too deeply",
    ),
    Case(
        "manifest_not_json",
        _run_dir_edit(_replace("manifest.json", "{schema")),
        "error",
        "unreadable manifest",
    ),
    Case(
        "manifest_huge",
        _run_dir_edit(
            _replace("manifest.json", '{"schema_version": 1, "x": "' + "a" * (17 << 20) + '"}')
        ),
        "error",
        "larger than",
    ),
    Case(
        "manifest_fifo",
        _run_dir_edit(_special("manifest.json", "fifo")),
        "error",
        "not a regular file (a FIFO",
        cli=True,
    ),
    Case(
        "manifest_dev_zero",
        _run_dir_edit(_special("manifest.json", "/dev/zero")),
        "error",
        "not a regular file",
    ),
    Case(
        "telemetry_rank_negative",
        _run_dir_edit(
            _replace(
                T,
                json.dumps({"type": "header", "format": "gpudiag.steps", "version": 1, "rank": -1})
                + "\n",
            )
        ),
        "error",
        "the header's rank is -1",
    ),
    Case(
        "telemetry_step_3e9",
        _run_dir_edit(_lines(T, [_step(step=3_000_000_000)])),
        "error",
        "step number 3000000000 is out of range",
    ),
    Case(
        "telemetry_step_strings",
        _run_dir_edit(
            _lines(
                T,
                [
                    _step(start_ns="x"),
                    _step(end_ns=None),
                    _step(step="3"),
                    _step(data_wait_ns="slow"),
                ],
            )
        ),
        "diagnosis",
        "step records without a valid step",
    ),
    Case(
        "telemetry_step_no_start",
        _run_dir_edit(_lines(T, [json.dumps({"type": "step", "step": 21})])),
        "diagnosis",
        "ignored",
    ),
    Case(
        "telemetry_deep_line",
        _run_dir_edit(_lines(T, ['{"type": "step", "x": ' + DEEP_JSON + "}"])),
        "error",
        "nested too deeply",
    ),
    Case(
        "telemetry_long_line",
        _run_dir_edit(_lines(T, ['{"type": "step", "x": "' + "a" * (2 << 20) + '"}'])),
        "error",
        "longer than",
    ),
    Case(
        "telemetry_dev_zero", _run_dir_edit(_special(T, "/dev/zero")), "error", "not a regular file"
    ),
    Case(
        "telemetry_type_list",
        _run_dir_edit(_lines(T, ['{"type": ["step"]}'])),
        "error",
        "is not a telemetry record",
    ),
    Case(
        "nvml_no_time",
        _run_dir_edit(
            _lines(N, [json.dumps({"type": "sample", "gpu_uuid": "GPU-1", "util_ratio": 0.5})])
        ),
        "diagnosis",
        "samples without a valid time_ns",
    ),
    Case(
        "nvml_strings",
        _run_dir_edit(
            _lines(
                N,
                [
                    json.dumps({"type": "sample", "time_ns": "now", "gpu_uuid": "GPU-1"}),
                    json.dumps(
                        {
                            "type": "sample",
                            "time_ns": 1_700_000_000_500_000_000,
                            "gpu_uuid": "GPU-1",
                            "util_ratio": "high",
                            "index": "0",
                            "throttle_reasons": -1,
                        }
                    ),
                ],
            )
        ),
        "diagnosis",
        "util_ratio values that are not numbers",
    ),
    Case("nvml_fifo", _run_dir_edit(_special(N, "fifo")), "error", "not a regular file"),
]


# ---- saved diagnoses (inputs of analyze, gate, diff, report)


def saved_diagnosis(d: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A real Diagnosis of the small trace, saved as JSON after ``edit``."""
    import gpudiag

    diag = gpudiag.analyze(write(d / "src", "rank-0.json", trace(STEP_TRACE)), jobs=1)
    doc = diag.to_json()
    shutil.rmtree(d / "src")
    edit(doc)
    p = d / "saved.json"
    p.write_text(json.dumps(doc, indent=1))
    return p


def _diag(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], list[Path]]:
    return lambda d: [saved_diagnosis(d, edit)]


def _put(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
        target: Any = doc
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value

    return edit


SCRIPT = "<script>alert(1)</script>"
CASES += [
    Case("diagnosis_valid", _diag(lambda doc: None), "diagnosis"),
    Case(
        "diagnosis_script_in_step",
        _diag(_put("steps.0.step", SCRIPT)),
        "error",
        "steps[0].step: expected an integer, got a string",
        cli=True,
    ),
    Case(
        "diagnosis_script_in_rank",
        _diag(_put("steps.0.rank", SCRIPT)),
        "error",
        "steps[0].rank: expected an integer",
    ),
    Case(
        "diagnosis_script_in_run_ranks",
        _diag(_put("run.ranks", SCRIPT)),
        "error",
        "run.ranks: expected an integer",
    ),
    Case(
        "diagnosis_script_in_rank_steps",
        _diag(_put("ranks.0.steps", SCRIPT)),
        "error",
        "ranks[0].steps: expected an integer",
    ),
    Case(
        "diagnosis_list_for_object",
        _diag(_put("run", [1, 2])),
        "error",
        "run: expected an object, got a list",
    ),
    Case("diagnosis_string_for_list", _diag(_put("findings", "none")), "error", "findings"),
    Case("diagnosis_newer_schema", _diag(_put("schema_version", 99)), "error", "newer than"),
    Case(
        "diagnosis_unknown_kind",
        _diag(
            _put(
                "findings",
                [
                    {
                        "kind": "bogus",
                        "severity": "info",
                        "message": "m",
                        "ranks": [],
                        "steps": [],
                        "metrics": {},
                        "cause": None,
                        "persistent": None,
                        "wait_caused_ns": None,
                    }
                ],
            )
        ),
        "error",
        "findings[0].kind",
    ),
    Case(
        "diagnosis_what_if_partial", _diag(_put("what_if", {"step_time_ns": 5})), "error", "what_if"
    ),
    Case(
        "diagnosis_comm_names_numbers",
        _diag(_put("ranks.0.evidence", {"comm_names": [1]})),
        "error",
        "ranks[0].evidence.comm_names[0]",
    ),
    Case("diagnosis_nan", _diag(_put("run.idle_ratio", float("nan"))), "error", "run.idle_ratio"),
    Case(
        "diagnosis_deep",
        lambda d: [
            write(
                d,
                "saved.json",
                '{"gpudiag_version": "x", "schema_version": 1, "a": ' + DEEP_JSON + "}",
            )
        ],
        "error",
        "nested too deeply",
    ),
]


@case(expect="corrupt SQLite database")
def nsys_schema_not_utf8(d: Path) -> list[Path]:
    # SQLite quotes the damaged schema in its error message, which Python cannot decode
    p = export_copy(d)
    data = bytearray(p.read_bytes())
    i = data.find(b"CREATE TABLE", data.find(b"CREATE TABLE") + 1)
    data[i + 6 : i + 8] = b"\xbc\xd7"
    p.write_bytes(bytes(data))
    return [p]
