"""The live alerts a run recorded (``alerts.jsonl``, written by ``gpudiag run``'s monitor).

One JSON object per line, ``"type": "alert"`` (docs/run-directory.md): ``time_ns`` and
``step`` integers, ``kind`` and ``message`` strings, ``ranks`` a list of integers,
``state`` ``raised`` or ``cleared``, ``metrics`` an object. A truncated last line is
ignored; a record without those fields is an :class:`~gpudiag.errors.InputError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudiag.errors import InputError
from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.jsonl import records

_HINT = "the file is not gpudiag's live alerts; remove it, or re-run with `gpudiag run`"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _problem(rec: dict[str, Any]) -> str | None:
    for key in ("time_ns", "step"):
        if not _int(rec.get(key)):
            return f"{key} is not an integer"
    for key in ("kind", "message"):
        if not isinstance(rec.get(key), str):
            return f"{key} is not a string"
    ranks = rec.get("ranks")
    if not isinstance(ranks, list) or not all(_int(r) for r in ranks):
        return "ranks is not a list of integers"
    if rec.get("state") not in ("raised", "cleared"):
        return "state is not raised or cleared"
    if not isinstance(rec.get("metrics", {}), dict):
        return "metrics is not an object"
    return None


def load_alerts(run_dir: Path) -> list[dict[str, Any]]:
    """Every alert record of a run directory (each node's), oldest first; [] without any."""
    out: list[dict[str, Any]] = []
    for base in rundir.node_dirs(Path(run_dir)) or [Path(run_dir)]:
        path = base / rundir.ALERTS
        if not path.exists():
            continue
        for n, rec in records(path, "alert", _HINT):
            if rec["type"] != "alert":
                continue
            problem = _problem(rec)
            if problem:
                raise InputError(path, f"line {n}: {problem}", _HINT)
            out.append(rec)
    return sorted(out, key=lambda r: r["time_ns"])
