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
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

MANIFEST = "manifest.json"
MANIFEST_SCHEMA_VERSION = 1
RANKS_DIR = "ranks"
NVML_DIR = "nvml"
NSYS_DIR = "nsys"
CONDITIONS_DIR = "conditions"
CONTROL = "control.json"


def trace_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its profiler trace."""
    return run_dir / RANKS_DIR / f"rank-{rank}.pt.trace.json.gz"


def steps_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` appends its per-step telemetry."""
    return run_dir / RANKS_DIR / f"rank-{rank}.steps.jsonl"


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
    extra: dict[str, Any] = field(default_factory=dict)
    # summary of conditions/<host>.jsonl (docs/run-directory.md); None when not sampled
    conditions: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """A plain dict for ``manifest.json``."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunManifest:
        """Parse ``manifest.json`` content; unknown keys are kept in ``extra``."""
        known = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in data.items() if k in known}
        kw["ranks"] = [RankInfo(**_known(RankInfo, r)) for r in data.get("ranks", [])]
        kw["sources"] = {
            k: SourceStatus(**_known(SourceStatus, v)) for k, v in data.get("sources", {}).items()
        }
        extra = dict(data.get("extra", {}))
        extra.update({k: v for k, v in data.items() if k not in known})
        kw["extra"] = extra
        return cls(**kw)


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
    """Read a manifest; raises ValueError (with the reason) on anything unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"unreadable manifest ({e})") from e
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError("not a gpudiag manifest (no schema_version)")
    if int(data["schema_version"]) > MANIFEST_SCHEMA_VERSION:
        raise ValueError(
            f"manifest schema {data['schema_version']} is newer than this gpudiag "
            f"understands ({MANIFEST_SCHEMA_VERSION})"
        )
    return RunManifest.from_json(data)


def is_run_dir(path: Path) -> bool:
    """True when ``path`` is a run directory of one node or of several."""
    return path.is_dir() and bool(node_dirs(path))


def node_dirs(run_dir: Path) -> list[Path]:
    """The directories holding a manifest: the run directory itself and/or its ``node-*``."""
    found = [run_dir] if (run_dir / MANIFEST).is_file() else []
    found += sorted(p for p in run_dir.glob("node-*") if (p / MANIFEST).is_file())
    return found


@contextmanager
def atomic_write(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path`` and rename it into place only on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
