"""Issue 20 item 8: a CPU trace whose step thread runs no operator in the step names no
host cause, and its remedy says what to capture rather than "Cut Python overhead".

Truth from outside gpudiag: hand-built CPU-only Kineto traces (gloo backend, no
``deviceProperties``) laid out like ``edge_cpu_only``: a ``ProfilerStep`` on the training
thread and ``gloo:all_reduce`` ranges on two background threads — with no operator on the
training thread, or with operators on it and gaps between them; and the shared
``edge_cpu_only``, whose step thread's events are read here by a plain loop.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import gpudiag

MAIN = 1074


def _trace(ops_on_step_thread: int, steps: int = 1) -> dict[str, Any]:
    ev: list[dict[str, Any]] = []

    def x(name: str, tid: int, ts: float, dur: float, cat: str = "cpu_op") -> None:
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": MAIN,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": {"External id": len(ev) + 1},
            }
        )

    for s in range(steps):
        t0 = 1_000.0 + s * 210_000.0
        x(f"ProfilerStep#{551 + s}", MAIN, t0, 210_000.0, cat="user_annotation")
        for tid, lag in ((3553, 18_000.0), (3554, 26_000.0)):
            x("gloo:all_reduce", tid, t0 + lag, 170_000.0, cat="user_annotation")
        for i in range(ops_on_step_thread):  # 100 µs operators, 1 ms apart
            x("aten::add", MAIN, t0 + 500.0 + i * 1_000.0, 100.0)
    return {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": "gloo", "rank": 34, "world_size": 300},
        "traceEvents": ev,
    }


def _analyze(tmp_path: Path, name: str, trace: dict[str, Any]) -> Any:
    d = tmp_path / name
    d.mkdir()
    (d / "rank-34.json").write_text(json.dumps(trace))
    return gpudiag.analyze(d, jobs=1, cache=False)


def _host_bound(diag: Any) -> Any:
    return next(f for f in diag.findings if f.kind == "host_bound")


def test_no_operator_on_the_step_thread_names_no_cause(tmp_path: Path) -> None:
    diag = _analyze(tmp_path, "empty", _trace(0))
    f = _host_bound(diag)
    assert f.metrics.cause.kind == "unknown"
    assert "Python" not in f.message and "does not show" in f.message
    assert "does not show" in diag.verdict.headline and "record_function" in diag.verdict.headline
    ids = [r.id for r in diag.recommendations]
    assert "host-overhead" not in ids and "host-unseen" in ids
    rec = next(r for r in diag.recommendations if r.id == "host-unseen")
    assert rec.estimated_gain_ns is None and "record_function" in rec.detail
    assert all("Python overhead" not in r.title for r in diag.recommendations)


def test_operators_on_the_step_thread_keep_the_python_overhead_remedy(tmp_path: Path) -> None:
    diag = _analyze(tmp_path, "busy", _trace(150, steps=3))
    f = _host_bound(diag)
    assert getattr(getattr(f.metrics, "cause", None), "kind", None) != "unknown"
    assert "Python/host overhead outside operators" in f.message
    ids = [r.id for r in diag.recommendations]
    assert "host-overhead" in ids and "host-unseen" not in ids


def test_edge_cpu_only(kineto_sets: Path) -> None:
    path = kineto_sets / "edge_cpu_only"
    with gzip.open(next(path.glob("*.json.gz"))) as fh:
        ev = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in ev if e["name"].startswith("ProfilerStep#"))
    inside = [
        e
        for e in ev
        if e["tid"] == step["tid"]
        and e.get("cat") == "cpu_op"
        and step["ts"] <= e["ts"] < step["ts"] + step["dur"]
    ]
    assert inside == []  # the step's thread runs no operator in its one step
    diag = gpudiag.analyze(path, jobs=1, cache=False)
    ids = [r.id for r in diag.recommendations]
    assert "host-overhead" not in ids and "host-unseen" in ids
