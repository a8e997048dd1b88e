"""Reads a run directory (or loose trace files), picks loaders → RunTimeline.

Input discovery is shared by :func:`load_run` (the whole interval model, for the API) and
by the analysis pipeline, which loads and analyses each rank in a worker process so that
only small per-rank results cross process boundaries.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

from gpudiag import rundir
from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.traces.kineto import load_kineto, rank_from_filename
from gpudiag.traces.schema import RankTimeline, RunTimeline

KINETO_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")
T = TypeVar("T")


@dataclass
class TraceInput:
    """One trace file and the rank it is expected to hold (None: ask the file)."""

    path: Path
    fmt: str  # "kineto" or "nsys"
    rank: int | None = None
    origin: Path | None = None  # the .nsys-rep/.qdrep that ``path`` was exported from


@dataclass
class Inputs:
    """Everything found under the user's paths."""

    traces: list[TraceInput]
    run_dirs: list[Path] = field(default_factory=list)
    manifests: list[rundir.RunManifest] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _fmt_of(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(KINETO_SUFFIXES):
        return "kineto"
    if name.endswith(NSYS_SUFFIXES):
        return "nsys"
    return None


def discover(paths: Iterable[str | os.PathLike[str]]) -> Inputs:
    """Find the traces under ``paths``: files, directories of traces, or run directories."""
    found = Inputs(traces=[])
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(p, "no such file or directory", "check the path")
        if p.is_dir():
            _discover_dir(p, found)
        else:
            _add_file(p, found, explicit=True)
    if not found.traces:
        where = ", ".join(str(Path(p)) for p in paths) or "(nothing)"
        raise InputError(
            where,
            "no traces found",
            "give PyTorch Profiler traces (*.pt.trace.json[.gz]) or a gpudiag run directory",
        )
    return found


def _discover_dir(d: Path, found: Inputs) -> None:
    nodes = rundir.node_dirs(d)
    if nodes:
        found.run_dirs.append(d)
        for node in nodes:
            try:
                found.manifests.append(rundir.read_manifest(node / rundir.MANIFEST))
            except ValueError as e:
                raise InputError(
                    node / rundir.MANIFEST, str(e), "is this a gpudiag run directory?"
                ) from e
            for f in sorted((node / rundir.RANKS_DIR).glob("*")):
                if f.is_file() and _fmt_of(f) == "kineto":
                    _add_file(f, found, explicit=False)
        exports = sorted(p for node in nodes for p in (node / rundir.NSYS_DIR).glob("*.sqlite"))
        if exports and any(t.path.is_relative_to(d) for t in found.traces):
            # one source per rank: the profiler traces; the Nsight export stays available
            found.notes.append(
                f"Nsight Systems export(s) beside the traces, not merged: "
                f"{', '.join(str(p) for p in exports)} (analyse them on their own)"
            )
        elif exports:
            for p in exports:
                _add_file(p, found, explicit=False)
        if not any(t.path.is_relative_to(d) for t in found.traces):
            m = found.manifests[-1] if found.manifests else None
            window = f" --profile-steps {m.profile_steps}" if m and m.profile_steps else ""
            raise InputError(
                d,
                "run directory without profiler traces (did the job stop before its "
                f"profiled window{window}?)",
                "re-run with --profile-steps A:B inside the job's step count; the step "
                "telemetry in ranks/*.steps.jsonl is kept",
            )
        return
    files = sorted(
        f for f in d.rglob("*")
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(d).parts)
    )  # fmt: skip
    for f in files:
        if _fmt_of(f):
            _add_file(f, found, explicit=False)
    if not found.traces:
        raise InputError(
            d,
            "directory holds no traces",
            "expected *.json / *.json.gz PyTorch Profiler traces or a gpudiag run directory "
            "(with manifest.json)",
        )


def _add_file(f: Path, found: Inputs, explicit: bool) -> None:
    fmt = _fmt_of(f)
    if fmt == "kineto":
        found.traces.append(TraceInput(f, "kineto"))
        return
    if fmt == "nsys":
        from gpudiag.traces import nsys

        origin = None
        if f.name.lower().endswith(nsys.REPORT_SUFFIXES):
            if not explicit and f.with_suffix(".sqlite").is_file():
                return  # the export beside it is read instead
            f, origin = nsys.resolve_report(f), f
        if all(t.path != f for t in found.traces):
            found.traces.append(TraceInput(f, "nsys", origin=origin))
        return
    if explicit:
        raise InputError(
            f,
            f"unknown file type {f.suffix or '(no extension)'!r}",
            "gpudiag analyze reads Kineto traces (.json, .json.gz) and gpudiag run directories",
        )


def load_rank(inp: TraceInput, thresholds: Thresholds) -> RankTimeline:
    """Load one trace file with the loader for its format."""
    return load_kineto(inp.path, rank=inp.rank, thresholds=thresholds)


def load_ranks(inp: TraceInput, thresholds: Thresholds) -> list[RankTimeline]:
    """Load one input; an Nsight export holds one rank per profiled process."""
    if inp.fmt == "nsys":
        from gpudiag.traces.nsys import load_nsys

        return load_nsys(inp.path, thresholds=thresholds, source=str(inp.origin or inp.path))
    return [load_rank(inp, thresholds)]


def check_ranks(timelines: Sequence[Any], sources: Sequence[Path]) -> None:
    """Fail on two inputs claiming one rank, or several inputs with no rank at all.

    ``timelines`` are anything with ``rank`` and ``meta.rank_from`` (timelines or results).
    """
    by_rank: dict[int, Path] = {}
    defaulted = [
        src for t, src in zip(timelines, sources, strict=True) if t.meta.rank_from == "default"
    ]
    if len(defaulted) > 1:
        raise InputError(
            defaulted[1],
            f"no rank in the trace or its name, like {defaulted[0].name}",
            "rename the files rank-<N>.json.gz (or analyse them one at a time)",
        )
    for t, src in zip(timelines, sources, strict=True):
        if t.rank in by_rank:
            raise InputError(
                src,
                f"claims rank {t.rank}, as does {by_rank[t.rank]}",
                "give one trace per rank (several profiling windows of one rank: analyse "
                "each window separately)",
            )
        by_rank[t.rank] = src


def parallel_map(
    fn: Callable[..., T], items: Sequence[Any], jobs: int | None, *args: Any
) -> list[T]:
    """``[fn(item, *args) for item in items]``, fanned out over processes when worth it."""
    workers = min(len(items), jobs or os.cpu_count() or 1)
    if workers <= 1:
        return [fn(item, *args) for item in items]
    # Objects that exist before the fork are moved out of the collector's reach, so a
    # collection in a worker does not write to (and copy) every page it shares with us.
    gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as ex:
            futures = [ex.submit(fn, item, *args) for item in items]
            return [f.result() for f in futures]
    finally:
        gc.unfreeze()


def load_run(
    *paths: str | os.PathLike[str],
    thresholds: Thresholds | None = None,
    jobs: int | None = None,
) -> RunTimeline:
    """Load every rank under ``paths`` into one RunTimeline (ranks in parallel processes)."""
    th = thresholds or Thresholds()
    inputs = discover(paths)
    per_input = parallel_map(load_ranks, inputs.traces, jobs, th)
    ranks = [tl for tls in per_input for tl in tls]
    check_ranks(
        ranks, [t.path for t, tls in zip(inputs.traces, per_input, strict=True) for _ in tls]
    )
    ranks.sort(key=lambda t: t.rank)
    return RunTimeline(
        ranks=ranks,
        manifest=inputs.manifests[0] if inputs.manifests else None,
        notes=inputs.notes,
    )


__all__ = [
    "Inputs", "TraceInput", "discover", "load_rank", "load_ranks", "load_run", "rank_from_filename",
]  # fmt: skip
