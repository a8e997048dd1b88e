"""No gain from time the trace did not see (issue 20, items 3, 5–8), judged from raw events.

Each truth is read from the trace's own rows or events with plain loops, or built into a
hand-made trace: the copy-bound H100 slice is in test_host_causes.py.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import gpudiag

T0 = 1_700_000_000_000_000  # epoch µs
MAIN, BG, PID = 100, 200, 100


def _rows(path: Path, sql: str) -> list[Any]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_unseen_host_work_promises_no_gain_and_says_what_to_capture(shared_traces: Path) -> None:
    path = shared_traces / "nsys" / "ai-profiler" / "baseline.sqlite"
    tables = {r[0] for r in _rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "NVTX_EVENTS" not in tables  # nothing shows what the host does between kernels
    d = gpudiag.analyze(path, jobs=1)
    assert d.verdict.bottleneck == "host"
    assert "does not show" in d.verdict.headline and "NVTX" in d.verdict.headline
    stalls = next(r for r in d.recommendations if r.id == "host-stalls")
    assert stalls.estimated_gain_ns is None and stalls.estimated_gain_ratio is None
    assert "No gain is given" in stalls.detail and "NVTX" in stalls.detail


def _gpu_ops_kineto(path: Path) -> int:
    n = 0
    for f in path.iterdir():
        if f.name.endswith((".json", ".json.gz")):
            op = gzip.open if f.name.endswith(".gz") else open
            with op(f, "rt") as fh:
                ev = json.load(fh)["traceEvents"]
            n += sum(1 for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    return n


def _no_gain_anywhere(d: gpudiag.Diagnosis) -> None:
    assert d.verdict.limits and "too little to generalise" in d.verdict.limits[0]
    assert d.recommendations, "the advice is kept"
    for r in d.recommendations:
        assert r.estimated_gain_ns is None and r.estimated_gain_ratio is None
        assert "No gain is given" in r.detail
    assert d.what_if is None  # one story: no gain in remedies, no what-if number either


def test_too_little_activity_gives_advice_but_no_gain(shared_traces: Path) -> None:
    mi250 = shared_traces / "kineto" / "edge_amd_mi250"
    assert _gpu_ops_kineto(mi250) < 100
    _no_gain_anywhere(gpudiag.analyze(mi250, jobs=1))
    mock = shared_traces / "nsys" / "nsys-ai" / "mock.sqlite"
    ops = sum(
        _rows(mock, f"SELECT COUNT(*) FROM {t}")[0][0]
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY")
    )
    assert ops == 3
    _no_gain_anywhere(gpudiag.analyze(mock, jobs=1))


def test_a_cpu_only_step_with_few_events_is_qualified(shared_traces: Path) -> None:
    path = shared_traces / "kineto" / "edge_cpu_only"
    with gzip.open(next(path.glob("*.json.gz")), "rt") as fh:
        ev = json.load(fh)["traceEvents"]
    step = next(e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    a, b = step["ts"], step["ts"] + step["dur"]
    on_main = [
        e
        for e in ev
        if e.get("ph") == "X"
        and e.get("tid") == step["tid"]
        and e is not step
        and e["ts"] < b
        and e["ts"] + e.get("dur", 0) > a
    ]
    assert not on_main  # the step's thread holds no event inside the step
    d = gpudiag.analyze(path, jobs=1)
    assert d.verdict.limits and "too little to generalise" in d.verdict.limits[0]
    assert d.verdict.bottleneck != "communication"
    assert all(s.comm_wait_ns == 0 for s in d.steps)  # nothing shows the step waits
    assert all(r.estimated_gain_ns is None for r in d.recommendations)


def _cpu_trace(out: Path) -> Path:
    """4 steps of 10 ms; main thread ops [0.5, 3) and [4, 6) ms; gloo on a background
    thread [3, 9) ms. The main thread is inside the step from 0.5 to 6 ms: the collective
    is its wait only in its gap [3, 4) (1 ms); [4, 6) is overlapped (2 ms); [6, 9) after
    its last event is no wait of the step's."""
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "main"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": BG, "args": {"name": "gloo"}},
    ]
    ext = 1
    for i in range(4):
        t = T0 + i * 10_000
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i + 1}",
                "pid": PID,
                "tid": MAIN,
                "ts": t,
                "dur": 10_000,
            }
        )
        for s, e in ((500, 3_000), (4_000, 6_000)):
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::mm",
                    "pid": PID,
                    "tid": MAIN,
                    "ts": t + s,
                    "dur": e - s,
                    "args": {"External id": ext},
                }
            )
            ext += 1
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "pid": PID,
                "tid": BG,
                "ts": t + 3_000,
                "dur": 6_000,
            }
        )
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
        "traceEvents": ev,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "rank-0.json").write_text(json.dumps(doc))
    return out


def test_background_collectives_count_only_where_the_step_thread_shows_it_waits(
    tmp_path: Path,
) -> None:
    d = gpudiag.analyze(_cpu_trace(tmp_path / "cpu"), jobs=1)
    assert len(d.steps) == 4
    for s in d.steps:
        assert s.compute_ns == 4_500_000
        assert s.comm_wait_ns == 1_000_000
        assert s.comm_overlapped_ns == 2_000_000
