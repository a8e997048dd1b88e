"""Issue 13: the root causes of the mutation campaign, one regression each."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testpaths import nonempty

import gpudiag
from gpudiag.errors import InputError
from gpudiag.traces.kineto import load_kineto
from gpudiag.traces.load import load_run
from gpudiag.traces.nsys import load_nsys

SMALL = "kineto/edge_mi300x_triton_tiny/mi300x.json.gz"
STEPS = "kineto/sampled_2rank_a2a/rank-0.json.gz"
EXPORT = "nsys/nsys-ai/healthy_1pct.sqlite"


def _doc(shared: Path, rel: str = SMALL) -> dict[str, Any]:
    with gzip.open(shared / rel, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _x(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _save(tmp: Path, doc: dict[str, Any], name: str = "rank-0.json") -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return p


def test_extreme_timestamps_are_dropped_and_counted(shared_traces: Path, tmp_path: Path) -> None:
    """OverflowError in kineto._to_ns (-1e308) and 'an interval ends before it starts' (1e308)."""
    doc = _doc(shared_traces)
    n = len(load_kineto(shared_traces / SMALL))
    for e in [e for e in _x(doc) if e.get("cat") == "cpu_op"][:12]:
        e["ts"] = -1e308
    for e in [e for e in _x(doc) if e.get("cat") == "cpu_op"][12:15]:
        e["dur"] = 1e308
    tl = load_kineto(_save(tmp_path, doc))
    assert len(tl) == n - 15
    assert any(
        note.startswith("15 events with invalid timestamps ignored") for note in tl.meta.notes
    )
    tl.validate()
    assert (tl.end_ns >= tl.start_ns).all()


def test_missing_fields_are_counted_not_defaulted(shared_traces: Path, tmp_path: Path) -> None:
    doc = _doc(shared_traces)
    for e in _x(doc)[:2]:
        del e["ts"]
    for e in _x(doc)[2:5]:
        del e["pid"]
    for e in _x(doc)[5:9]:
        del e["name"]
    notes = load_kineto(_save(tmp_path, doc)).meta.notes
    assert "2 events without ts or dur ignored" in notes
    assert "3 events without pid or tid ignored" in notes
    assert "4 events without a name kept, named ''" in notes


def test_step_numbers_beyond_int32_are_refused_not_wrapped(
    shared_traces: Path, tmp_path: Path
) -> None:
    """OverflowError in the step numbering; 3 000 000 000 must not become -1294967296."""
    doc = _doc(shared_traces, STEPS)
    step = next(e for e in _x(doc) if e["name"].startswith("ProfilerStep#"))
    step["name"] = "ProfilerStep#3000000000"
    with pytest.raises(InputError, match="step number 3000000000 is out of range"):
        gpudiag.analyze(_save(tmp_path, doc), jobs=1)


def test_collective_sizes_beyond_int64_are_unknown(shared_traces: Path, tmp_path: Path) -> None:
    """OverflowError in the Kineto column reducer: nelems × dtype size beyond int64."""
    doc = _doc(shared_traces, STEPS)
    for e in _x(doc):
        if "Collective name" in e.get("args", {}):
            e["args"]["In msg nelems"] = 2**62
            e["args"]["Out msg nelems"] = 2**63 - 1
    tl = load_kineto(_save(tmp_path, doc))
    assert tl.nbytes.dtype == np.int64 and (tl.nbytes >= -1).all()


@pytest.mark.parametrize("value", [-1, 2**70, True, "3"])
def test_impossible_ranks_are_refused(shared_traces: Path, tmp_path: Path, value: Any) -> None:
    doc = _doc(shared_traces)
    doc["distributedInfo"] = {"rank": value, "world_size": 2}
    with pytest.raises(InputError, match=r"distributedInfo\.rank is .*: not a rank"):
        load_kineto(_save(tmp_path, doc))


@pytest.mark.parametrize("value", [2**63 - 1, 2**70, -5, "0"])
def test_impossible_base_times_are_refused(shared_traces: Path, tmp_path: Path, value: Any) -> None:
    doc = _doc(shared_traces)
    doc["baseTimeNanoseconds"] = value
    with pytest.raises(InputError, match=r"baseTimeNanoseconds is .*: not a time"):
        load_kineto(_save(tmp_path, doc))


def test_manifest_fields_are_named(shared_traces: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    shutil.copyfile(shared_traces / STEPS, run / "ranks" / "rank-0.pt.trace.json.gz")
    for manifest, words in (
        ({"schema_version": None}, "schema_version: expected an integer"),
        ({"schema_version": 1, "ranks": "0"}, "ranks: expected a list, got a string"),
        ({"schema_version": 1, "ranks": [0, 1]}, "ranks[0]: expected an object, got 0"),
        ({"schema_version": 1, "sources": ["nvml"]}, "sources: expected an object, got a list"),
    ):
        (run / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(InputError, match=None) as e:
            load_run(run)
        assert e.value.path.endswith("manifest.json") and words in e.value.problem


def _kernels(p: Path) -> int:
    return sum(int(np.count_nonzero(t.gpu_lane_mask()[t.lane])) for t in load_nsys(p))


def test_nsys_non_integer_cells_are_dropped_and_counted(
    shared_traces: Path, tmp_path: Path
) -> None:
    """ValueError/TypeError from non-integer cells in Export.ints."""
    p = tmp_path / "report.sqlite"
    shutil.copyfile(shared_traces / EXPORT, p)
    with sqlite3.connect(p) as con:
        before = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'x' WHERE rowid <= 3")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = x'00' WHERE rowid = 4")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = NULL WHERE rowid = 5")
    con.close()
    (tl,) = load_nsys(p)
    assert _kernels(p) == before - 5
    assert any(n.startswith("5 rows of CUPTI_ACTIVITY_KIND_KERNEL ignored") for n in tl.meta.notes)


def test_nsys_wal_export_is_read_without_creating_files(
    shared_traces: Path, tmp_path: Path
) -> None:
    """mode=ro created -wal/-shm beside the input; the WAL's rows must still be read."""
    work = tmp_path / "work.sqlite"
    shutil.copyfile(shared_traces / EXPORT, work)
    con = sqlite3.connect(work)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    total = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 4 = 0")
    con.commit()
    left = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    export = tmp_path / "in" / "report.sqlite"
    export.parent.mkdir()
    shutil.copyfile(work, export)  # the main file still holds every kernel …
    shutil.copyfile(f"{work}-wal", f"{export}-wal")  # … the WAL deletes a quarter
    con.close()
    export.parent.chmod(0o555)
    try:
        before = sorted(p.name for p in export.parent.iterdir())
        assert _kernels(export) == left < total
        assert sorted(p.name for p in export.parent.iterdir()) == before
    finally:
        export.parent.chmod(0o755)


def test_nsys_export_in_place_creates_nothing(shared_traces: Path, tmp_path: Path) -> None:
    p = tmp_path / "report.sqlite"
    shutil.copyfile(shared_traces / EXPORT, p)
    with sqlite3.connect(p) as con:
        con.execute("PRAGMA journal_mode=WAL")  # WAL mode, no -wal file: read in place
    con.close()
    assert load_nsys(p)
    assert [x.name for x in tmp_path.iterdir()] == ["report.sqlite"]


def _streams(path: Path) -> None:
    """Read ``path`` on the streaming path; ``Fallback`` if it would decode the whole file."""
    from gpudiag.traces.core.common import LoadOptions, NamePatterns
    from gpudiag.traces.kineto.columns import Columns
    from gpudiag.traces.kineto.stream import stream_trace

    stream_trace(path, Columns(NamePatterns(LoadOptions())))


def test_well_formed_traces_are_streamed(kineto_sets: Path) -> None:
    """A cut in the wrong place falls back to the whole-file path silently; real traces
    (every era, gzip or not) must never need it."""
    for p in nonempty(kineto_sets.glob("*/*.json.gz"), "shared Kineto traces"):
        _streams(p)


def _load_cpu_s(path: Path) -> float:
    t = time.process_time()
    load_kineto(path)
    return time.process_time() - t


def test_streaming_is_linear_in_one_huge_string(shared_traces: Path, tmp_path: Path) -> None:
    """One string field without a `},{` for tens of MB: the old reader was quadratic
    (0.2 s for 25 MB, 12 s for 200 MB); 8x the size must cost far less than 64x."""
    doc = _doc(shared_traces)
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    _x(doc)[0].setdefault("args", {})["note"] = "a" * 8_000_000
    small.write_text(json.dumps(doc))
    _x(doc)[0]["args"]["note"] = "a" * 64_000_000
    big.write_text(json.dumps(doc))
    _streams(big)  # read event by event, not by the whole-file fallback
    t_small = min(_load_cpu_s(small) for _ in range(3))
    t_big = min(_load_cpu_s(big) for _ in range(2))
    assert t_big < 20 * max(t_small, 0.01), (t_small, t_big)


def test_endless_event_is_refused_while_streaming(
    shared_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzip bomb of one endless string stops at the limit, not when memory runs out
    (the limit is 1 GiB; lowered here so that the test writes 8 MB, not gigabytes)."""
    from gpudiag.traces.kineto import stream

    monkeypatch.setattr(stream, "MAX_EVENT_BYTES", 4 << 20)
    doc = _doc(shared_traces)
    _x(doc)[0].setdefault("args", {})["note"] = "a" * 8_000_000
    p = tmp_path / "rank-0.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    with pytest.raises(InputError, match="without an event boundary"):
        load_kineto(p)
