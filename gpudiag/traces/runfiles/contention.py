"""The host's contention over time (``conditions/<host>.jsonl`` samples) → ContentionSamples.

Each ``"type": "sample"`` line (docs/run-directory.md) with a measured interval gives the
CPU share that other processes and the hypervisor took over it (``other_cpu_ratio`` +
``steal_ratio``, a null steal counting as none); samples without a measured CPU share (the
first of each file) are skipped. A truncated last line is ignored; a sample whose
``time_ns`` or ``interval_ns`` is not an integer, or whose ratios are not numbers, is an
:class:`~gpudiag.errors.InputError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudiag.errors import InputError
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.conditions import ContentionSample
from gpudiag.traces.runfiles.jsonl import records

_HINT = "the file is not gpudiag's run conditions; remove it, or re-run with `gpudiag run`"


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _sample(host: str, rec: dict[str, Any]) -> ContentionSample | str | None:
    """The sample, a problem (text), or None (nothing measured in it)."""
    t, dt = rec.get("time_ns"), rec.get("interval_ns")
    if not isinstance(t, int) or isinstance(t, bool):
        return "time_ns is not an integer"
    if dt is not None and (not isinstance(dt, int) or isinstance(dt, bool)):
        return "interval_ns is not an integer"
    other, steal = rec.get("other_cpu_ratio"), rec.get("steal_ratio")
    if not _number(other) or not _number(steal):
        return "other_cpu_ratio or steal_ratio is not a number"
    if dt is None or dt <= 0 or other is None:
        return None
    return ContentionSample(host, t - dt, t, float(other) + float(steal or 0.0))


def load_contention(run_dir: Path) -> list[ContentionSample]:
    """Every node's contention samples of a run directory, oldest first; [] without any."""
    out: list[ContentionSample] = []
    for base in rundir.node_dirs(Path(run_dir)) or [Path(run_dir)]:
        folder = base / rundir.CONDITIONS_DIR
        for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
            for n, rec in records(path, "run-conditions", _HINT):
                if rec.get("type") != "sample":
                    continue
                s = _sample(path.stem, rec)
                if isinstance(s, str):
                    raise InputError(path, f"line {n}: {s}", _HINT)
                if s is not None:
                    out.append(s)
    return sorted(out, key=lambda s: s.start_ns)
