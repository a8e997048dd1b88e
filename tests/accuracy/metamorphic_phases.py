"""Transformations of a real Kineto trace whose effect on the reading is known (issue 29).

Each changes the loaded document in place and returns it; the test compares the analysis
of the original file with that of the transformed one. Times are
Kineto's µs. The training thread is the one with the step markers, else the one with the
most runtime calls.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

US = 1_000_000  # µs in a second


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return json.load(f)


def save(doc: dict[str, Any], path: Path) -> Path:
    # json.dumps, not json.dump: dump streams through the pure-Python encoder (10x slower)
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(json.dumps(doc))
    return path


def _timed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e and "dur" in e]


def main_thread(doc: dict[str, Any]) -> tuple[Any, Any]:
    """(pid, tid) of the step markers, else of the most runtime calls, else of the most events."""
    ev = _timed(doc)
    steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]
    if steps:
        return steps[0]["pid"], steps[0]["tid"]
    rt = Counter((e["pid"], e["tid"]) for e in ev if e.get("cat") == "cuda_runtime")
    if rt:
        return rt.most_common(1)[0][0]
    host = Counter(
        (e["pid"], e["tid"]) for e in ev if e.get("cat") in ("cpu_op", "user_annotation")
    )
    return host.most_common(1)[0][0]


# the categories of work (not the profiler's own ``Trace`` span, nor Python functions)
WORK = {
    "cpu_op",
    "operator",
    "user_annotation",
    "cuda_runtime",
    "runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "memcpy",
    "gpu_memset",
    "memset",
}


def span(doc: dict[str, Any]) -> tuple[float, float]:
    """First start and last end of the work events, in µs."""
    ev = [e for e in _timed(doc) if str(e.get("cat", "")).lower() in WORK]
    return min(float(e["ts"]) for e in ev), max(float(e["ts"]) + float(e["dur"]) for e in ev)


def prepend_startup(doc: dict[str, Any], seconds: float, name: str) -> dict[str, Any]:
    """A one-off runtime call of ``seconds`` on the training thread before anything else."""
    out = doc
    pid, tid = main_thread(out)
    t0, _ = span(out)
    dur = round(seconds * US)
    out["traceEvents"].append(
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": t0 - dur - 1000,
            "dur": dur,
            "args": {"cbid": 0},
        }
    )
    return out


def pad_edges(doc: dict[str, Any], head_s: float, tail_s: float) -> dict[str, Any]:
    """A 10 µs host operator ``head_s`` before the first and ``tail_s`` after the last event."""
    out = doc
    pid, tid = main_thread(out)
    t0, t1 = span(out)
    for ts in (t0 - round(head_s * US) - 10, t1 + round(tail_s * US)):
        out["traceEvents"].append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::empty",
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": 10,
                "args": {},
            }
        )
    return out


def rename_markers(doc: dict[str, Any], fmt: str, cat: str | None = None) -> dict[str, Any]:
    """``ProfilerStep#N`` ranges renamed by ``fmt`` (``fmt.format(n=N)``), optionally recategorised.

    Their copies on the GPU streams (``gpu_user_annotation``) are renamed the same way.
    """
    out = doc
    for e in out["traceEvents"]:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith("ProfilerStep#"):
            e["name"] = fmt.format(n=name.removeprefix("ProfilerStep#"))
            if cat is not None and e.get("cat") != "gpu_user_annotation":
                e["cat"] = cat
    return out
