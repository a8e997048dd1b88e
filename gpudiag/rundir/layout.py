"""Run-directory layout and RunManifest read/write; stdlib only; shared by collect and traces.

A run directory is what ``gpudiag run`` leaves on disk and what ``gpudiag analyze``
reads back, possibly on another machine::

    runs/<id>/
      manifest.json                 RunManifest of this node (one per ``gpudiag run``)
      ranks/rank-<R>.pt.trace.json.gz   Kineto trace of rank R's profiled window
      ranks/rank-<R>.steps.jsonl    every step of rank R: append-only telemetry
      nvml/<host>.jsonl             NVML samples of this node's GPUs
      conditions/<host>.jsonl       what else the host and its GPUs were doing, ~1 Hz
      nsys/                         optional Nsight Systems report and export
      control.json                  requests to the running ranks (``attach --profile-next``)
      ranks/previous/               earlier profiler windows of a rank, moved aside

Several nodes writing into one shared directory each use ``node-<k>/`` with the same
layout inside; :func:`node_dirs` finds them all.

Every file is written either append-only with a flush per record (telemetry, samples:
a crash loses at most the record being written) or atomically through a temporary file
and :func:`os.replace` (manifest, reports), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import field
from pathlib import Path
from typing import IO, Any, cast

from gpudiag._support.records import asdict, dataclass
from gpudiag.rundir.conditions import RunConditions
from gpudiag.rundir.sections import ManifestExtra

MANIFEST = "manifest.json"
MANIFEST_SCHEMA_VERSION = 1
RANKS_DIR = "ranks"
NVML_DIR = "nvml"
NSYS_DIR = "nsys"
HANG_DIR = "hang"  # flight-recorder dumps and stacks (traces/flightrec.py, collect/hangdump.py)
CONDITIONS_DIR = "conditions"
CONTROL = "control.json"
ALERTS = "alerts.jsonl"  # the live alerts of `gpudiag run` (gpudiag/live/monitor.py)
MANIFEST_MAX_BYTES = 16 << 20  # a manifest is a few KB; thousands of ranks stay under 2 MB


def trace_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its profiler trace."""
    return run_dir / RANKS_DIR / f"rank-{rank}.pt.trace.json.gz"


def steps_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` appends its per-step telemetry."""
    return run_dir / RANKS_DIR / f"rank-{rank}.steps.jsonl"


def appended_step_lines(
    run_dir: Path, offsets: dict[Path, int]
) -> Iterator[tuple[int, list[bytes]]]:
    """(rank, complete lines appended since ``offsets``) for each rank's telemetry file.

    Advances ``offsets`` past the last complete line; a partly written line waits for the
    next call. Files that vanish or are not named ``rank-N.steps.jsonl`` are skipped.
    """
    for path in sorted((run_dir / RANKS_DIR).glob("rank-*.steps.jsonl")):
        try:
            rank = int(path.name.split(".")[0].split("-")[1])
            with open(path, "rb") as f:
                f.seek(offsets.get(path, 0))
                data = f.read()
        except (OSError, ValueError, IndexError):
            continue
        end = data.rfind(b"\n") + 1
        offsets[path] = offsets.get(path, 0) + end
        yield rank, data[:end].splitlines()


def nvml_path(run_dir: Path, host: str) -> Path:
    """Where the sampler of ``host`` appends NVML samples."""
    return run_dir / NVML_DIR / f"{host}.jsonl"


def conditions_path(run_dir: Path, host: str) -> Path:
    """Where the launcher of ``host`` appends run-condition samples."""
    return run_dir / CONDITIONS_DIR / f"{host}.jsonl"


def control_path(run_dir: Path) -> Path:
    """Where ``gpudiag attach --profile-next`` leaves requests that the rank hooks poll."""
    return run_dir / CONTROL


def previous_traces_dir(run_dir: Path) -> Path:
    """Where a rank moves its older trace when an on-demand window replaces it."""
    return run_dir / RANKS_DIR / "previous"


def node_dir(out: Path, node_rank: int) -> Path:
    """The directory one node of a multi-node run writes into."""
    return out / f"node-{node_rank}"


# The NVML source's reason on a host without the NVIDIA kernel driver: GPU telemetry does
# not apply (a note, not a finding; gpudiag run says nothing on stderr).
NO_NVIDIA_DRIVER = "no NVIDIA driver on this host (no /proc/driver/nvidia)"


@dataclass
class SourceStatus:
    """Whether one data source was captured, and why not when it was not."""

    captured: bool
    reason: str = ""
    files: list[str] = field(default_factory=list)


@dataclass
class RankInfo:
    """One rank as seen by the node that ran it."""

    rank: int
    local_rank: int = 0
    host: str = ""
    pid: int | None = None
    gpu_uuid: str | None = None
    device: str | None = None


@dataclass
class RunManifest:
    """What ``gpudiag run`` knows about a run: enough to re-analyse it anywhere."""

    schema_version: int = MANIFEST_SCHEMA_VERSION
    gpudiag_version: str = ""
    argv: list[str] = field(default_factory=list)
    started_ns: int | None = None
    ended_ns: int | None = None
    exit_code: int | None = None
    hosts: list[str] = field(default_factory=list)
    node_rank: int = 0
    world_size: int | None = None
    ranks: list[RankInfo] = field(default_factory=list)
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    profile_steps: str | None = None
    diagnosis_incomplete: list[str] = field(default_factory=list)
    # the sections gpudiag run and attach add (rundir/sections.py), as the JSON's ``extra``
    extra: ManifestExtra = field(default_factory=lambda: ManifestExtra())
    # summary of conditions/<host>.jsonl (docs/run-directory.md); None when not sampled
    conditions: RunConditions | None = None

    def to_json(self) -> dict[str, Any]:
        """A plain dict for ``manifest.json``."""
        out = asdict(self)
        out["conditions"] = self.conditions.to_json() if self.conditions is not None else None
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunManifest:
        """Parse ``manifest.json`` content; unknown keys are kept in ``extra``.

        Every known field is checked against its type (a manifest is edited by hand at
        times, or damaged): ValueError names the first bad one, ``ranks[2].rank: expected
        an integer ≥ 0, got a string``.
        """
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {_words(data)}")
        known = set(cls.__dataclass_fields__)
        kw: dict[str, Any] = {}
        for key, check in _MANIFEST_FIELDS.items():
            if key in data:
                kw[key] = check(data[key], key)
        ranks = _of(list, data.get("ranks", []), "ranks")
        kw["ranks"] = [
            RankInfo(**_known(RankInfo, _rank_info(r, f"ranks[{i}]"))) for i, r in enumerate(ranks)
        ]
        sources = _of(dict, data.get("sources", {}), "sources")
        kw["sources"] = {
            str(k): SourceStatus(**_known(SourceStatus, _source(v, f"sources.{k}")))
            for k, v in sources.items()
        }
        extra = dict(_of(dict, data.get("extra", {}), "extra"))
        extra.update({k: v for k, v in data.items() if k not in known})
        # the sections as read: their readers check the shapes they use (sections.py)
        kw["extra"] = cast(ManifestExtra, extra)
        return cls(**kw)


# ---- checking manifest fields: each returns the value or raises ValueError naming it

_INT64 = 2**63 - 1
_RANK_MAX = 2**31 - 1


def _words(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"{v!r:.40}"
    if isinstance(v, str):
        return "a string"
    return "a list" if isinstance(v, list) else "an object"


def _of(tp: type, v: Any, where: str) -> Any:
    if not isinstance(v, tp):
        want = "a list" if tp is list else "an object" if tp is dict else "a string"
        raise ValueError(f"{where}: expected {want}, got {_words(v)}")
    return v


def _int(v: Any, where: str, lo: int = -_INT64, hi: int = _INT64, null: bool = False) -> Any:
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        bound = f" {lo} … {hi}" if (lo, hi) != (-_INT64, _INT64) else ""
        raise ValueError(f"{where}: expected an integer{bound}, got {_words(v)}")
    return v


def _strs(v: Any, where: str) -> list[str]:
    for i, x in enumerate(_of(list, v, where)):
        _of(str, x, f"{where}[{i}]")
    return list(v)


def _opt_str(v: Any, where: str) -> str | None:
    return None if v is None else str(_of(str, v, where))


_MANIFEST_FIELDS: dict[str, Any] = {
    "schema_version": lambda v, w: _int(v, w, 0, _INT64),
    "gpudiag_version": lambda v, w: _of(str, v, w),
    "argv": _strs,
    "started_ns": lambda v, w: _int(v, w, 0, _INT64, null=True),
    "ended_ns": lambda v, w: _int(v, w, 0, _INT64, null=True),
    "exit_code": lambda v, w: _int(v, w, null=True),
    "hosts": _strs,
    "node_rank": lambda v, w: _int(v, w, 0, _RANK_MAX),
    "world_size": lambda v, w: _int(v, w, 1, _RANK_MAX, null=True),
    "profile_steps": _opt_str,
    "diagnosis_incomplete": _strs,
    "conditions": lambda v, w: None if v is None else RunConditions.from_json(v, w),
}


def _rank_info(r: Any, where: str) -> dict[str, Any]:
    _of(dict, r, where)
    if "rank" not in r:
        raise ValueError(f"{where}.rank: missing")
    _int(r["rank"], f"{where}.rank", 0, _RANK_MAX)
    if "local_rank" in r:
        _int(r["local_rank"], f"{where}.local_rank", 0, _RANK_MAX)
    if "pid" in r:
        _int(r["pid"], f"{where}.pid", 0, _INT64, null=True)
    if "host" in r:
        _of(str, r["host"], f"{where}.host")
    for k in ("gpu_uuid", "device"):
        if k in r:
            _opt_str(r[k], f"{where}.{k}")
    return dict(r)


def _source(v: Any, where: str) -> dict[str, Any]:
    _of(dict, v, where)
    if "captured" not in v:
        raise ValueError(f"{where}.captured: missing")
    if not isinstance(v["captured"], bool):
        raise ValueError(f"{where}.captured: expected true or false, got {_words(v['captured'])}")
    if "reason" in v:
        _of(str, v["reason"], f"{where}.reason")
    if "files" in v:
        _strs(v["files"], f"{where}.files")
    return dict(v)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    return {k: v for k, v in data.items() if k in names}


def write_manifest(run_dir: Path, manifest: RunManifest) -> Path:
    """Write ``manifest.json`` atomically."""
    path = run_dir / MANIFEST
    with atomic_write(path) as f:
        json.dump(manifest.to_json(), f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def read_manifest(path: Path) -> RunManifest:
    """Read a manifest; raises ValueError (with the reason) on anything unreadable.

    Only a regular file of at most :data:`MANIFEST_MAX_BYTES` is read (a FIFO or a link to
    a device is refused before it is opened), and every field is checked.
    """
    from gpudiag._support.fileio import read_input
    from gpudiag.errors import InputError

    try:
        data = json.loads(read_input(path, MANIFEST_MAX_BYTES, "manifest").decode("utf-8"))
    except InputError as e:
        raise ValueError(e.problem) from e
    except RecursionError as e:
        raise ValueError("unreadable manifest (JSON nested too deeply)") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"unreadable manifest ({e})") from e
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError("not a gpudiag manifest (no schema_version)")
    version = _int(data["schema_version"], "schema_version", 0, _INT64)
    if version > MANIFEST_SCHEMA_VERSION:
        raise ValueError(
            f"manifest schema {version} is newer than this gpudiag "
            f"understands ({MANIFEST_SCHEMA_VERSION})"
        )
    return RunManifest.from_json(data)


def is_run_dir(path: Path) -> bool:
    """True when ``path`` is a run directory of one node or of several."""
    return path.is_dir() and bool(node_dirs(path))


def node_dirs(run_dir: Path) -> list[Path]:
    """The directories holding a manifest: the run directory itself and/or its ``node-*``.

    Any entry named ``manifest.json`` counts (a FIFO or a dangling link too), so that
    :func:`read_manifest` refuses it by name rather than the directory being misread.
    """
    found = [run_dir] if os.path.lexists(run_dir / MANIFEST) else []
    found += sorted(p for p in run_dir.glob("node-*") if os.path.lexists(p / MANIFEST))
    return found


@contextmanager
def atomic_write(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path`` and rename it into place only on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    import tempfile  # only to write (random, which it imports, costs ~2 ms)

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
