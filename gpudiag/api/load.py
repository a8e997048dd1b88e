"""The Python API: one call from paths to a Diagnosis, the same path the CLI takes.

``analyze(paths)`` is ``diagnose(load_run(paths))``, per rank in local processes or on an
existing Dask cluster (``scheduler=``); a saved diagnosis JSON (``gpudiag analyze … -f
json``) is read back instead of analysed. ``to_markdown(d)`` renders a Diagnosis as the
Markdown report; the pandas frames are in :mod:`gpudiag.report.frames`.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag._support.fileio import read_input
from gpudiag.analysis import diagnose as pipeline
from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.analysis.rank.analyse import RankResult
from gpudiag.analysis.rank.timeline import Timeline
from gpudiag.config import GateConfig, Thresholds, gate_config
from gpudiag.errors import InputError, UsageError
from gpudiag.fanout.pool import Mapper, Progress, dask_map, local_map
from gpudiag.fanout.work import RankWork, TimelineMode
from gpudiag.traces.core.common import LoadOptions
from gpudiag.traces.load import load_run
from gpudiag.traces.schema import RunTimeline

DIAGNOSIS_HEAD_BYTES = 4096
# A saved diagnosis is a few MB even for thousands of ranks and steps.
DIAGNOSIS_MAX_BYTES = 512 << 20
_SAVE_HINT = (
    "save one with `gpudiag analyze RUN --format json -o FILE` "
    "or `gpudiag gate RUN --save-baseline FILE`"
)


def is_diagnosis_file(path: Path) -> bool:
    """True for a plain JSON file whose first bytes look like ``Diagnosis.to_json`` output.

    Only the head is read: Kineto traces are also ``.json`` and may be huge. A Diagnosis
    document starts with ``schema_version`` then ``gpudiag_version``; a trace has
    ``traceEvents``.
    """
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    try:
        with path.open("rb") as f:
            head = f.read(DIAGNOSIS_HEAD_BYTES)
    except OSError:
        return False
    return b'"gpudiag_version"' in head and b'"traceEvents"' not in head


def load_diagnosis(path: str | os.PathLike[str]) -> Diagnosis:
    """A Diagnosis saved by ``gpudiag analyze --format json`` or ``gate --save-baseline``.

    The document is checked against the Diagnosis JSON schema and its field types; an
    InputError names the file and the first bad field by its JSON path.
    """
    p = Path(path)
    data = read_input(p, DIAGNOSIS_MAX_BYTES, "saved diagnosis")
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError as e:
        raise InputError(p, "JSON nested too deeply to be a gpudiag diagnosis", _SAVE_HINT) from e
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(p, f"not a readable gpudiag diagnosis ({e})", _SAVE_HINT) from e
    try:
        from gpudiag.api.saved import diagnosis_from_json  # its schema is read only here

        return diagnosis_from_json(doc)
    except RecursionError as e:
        raise InputError(p, "JSON nested too deeply to be a gpudiag diagnosis", _SAVE_HINT) from e
    except ValueError as e:
        raise InputError(p, f"not a valid gpudiag diagnosis: {e}", _SAVE_HINT) from e


def to_markdown(d: Diagnosis) -> str:
    """The Markdown report (``gpudiag analyze … --format markdown``) as a string."""
    from gpudiag.report.markdown import render

    buf = io.StringIO()
    render(d, buf)
    return buf.getvalue()


def diagnose(
    run: RunTimeline, thresholds: Thresholds | None = None, map: Mapper | None = None
) -> Diagnosis:
    """Diagnose a loaded run, its sources analysed in local worker processes unless ``map``."""
    th = thresholds or Thresholds()
    return pipeline.diagnose(run, rank_results(run, th, map or local_map()), th, _limits(th))


def diagnose_with_timeline(
    run: RunTimeline,
    thresholds: Thresholds | None = None,
    map: Mapper | None = None,
    full: bool = False,
) -> tuple[Diagnosis, Timeline]:
    """:func:`diagnose`, and the classified timeline of every rank (the Perfetto view).

    ``full`` keeps the raw kernels (operators on CPU traces) as well.
    """
    th = thresholds or Thresholds()
    results = rank_results(run, th, map or local_map(), "full" if full else "parts")
    return pipeline.diagnose_with_timeline(run, results, th, _limits(th))


def rank_results(
    run: RunTimeline, th: Thresholds, map: Mapper, timeline: TimelineMode | None = None
) -> list[RankResult]:
    """Every rank of the run read and analysed: :class:`RankWork` on each source, by ``map``."""
    return [r for rs in map(RankWork(th, timeline), run.sources) for r in rs]


def _limits(th: Thresholds) -> GateConfig:
    """The gate's settings (``[tool.gpudiag.gate]``, kept in ``th.extra``), typed once."""
    return gate_config(th.extra.get("gate"))


def analyze(
    *paths: str | os.PathLike[str],
    thresholds: Thresholds | None = None,
    step_marker: str | None = None,
    jobs: int | None = None,
    nsys: str | None = None,
    map: Mapper | None = None,
    scheduler: str | Any | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    timeline: str | os.PathLike[str] | None = None,
    timeline_full: bool = False,
    cache: bool | str | os.PathLike[str] = False,
) -> Diagnosis:
    """Analyse run directories, trace files or directories of traces → Diagnosis.

    ``step_marker`` (a regex, group 1 = the step number) overrides automatic step
    detection; ``jobs`` bounds the worker processes; ``nsys`` names the binary used to
    export ``.nsys-rep`` reports; ``map`` replaces the local process pool. ``scheduler``
    (``tcp://HOST:PORT`` or a ``distributed.Client``) runs each rank file on that Dask
    cluster's workers instead, which read the files at the same, absolute, paths.
    ``progress(files_done, files_total, events_done)`` is called as trace files finish.
    ``timeline`` writes the annotated timeline there (Chrome/Perfetto trace JSON, gzipped
    when the name ends in ``.gz``; ``timeline_full`` adds the raw kernels). One saved
    diagnosis JSON is read back as it is. ``cache`` keeps each trace file's per-rank
    results on disk for the next analysis of the same, unchanged, file (:mod:`gpudiag.fanout.cache`;
    ``True``: in the run directory or the user cache directory, a path: there instead of
    the user cache directory); ``GPUDIAG_NO_CACHE=1`` turns it off.
    """
    if len(paths) == 1 and is_diagnosis_file(Path(paths[0])):
        if timeline is not None:
            raise UsageError(
                f"{paths[0]} is a saved diagnosis: it holds no intervals to draw a timeline from",
                "analyse the traces or the run directory to write a timeline",
            )
        return load_diagnosis(paths[0])
    if scheduler is not None and (map is not None or jobs is not None):
        raise UsageError("a Dask scheduler excludes jobs= and map=", "give one of them")
    th = thresholds or Thresholds()
    if step_marker is not None:
        th = th.replace(step_re=step_marker)
    hook = _count_events(progress) if progress is not None else None
    if scheduler is not None:
        # The workers have their own working directories: name every file absolutely.
        paths = tuple(Path(p).absolute() for p in paths)
        mapper = dask_map(scheduler, progress=hook)
    else:
        mapper = map or local_map(jobs, progress=hook)
    if cache is not False:
        from gpudiag.fanout import cache as rank_cache

        if rank_cache.enabled():
            own = None if cache is True else Path(cache)
            mapper = rank_cache.cached_map(mapper, user_dir=own)
    run = load_run(*paths, options=LoadOptions.from_thresholds(th, nsys))
    if timeline is None:
        return diagnose(run, th, map=mapper)
    from gpudiag.report.timeline import write

    d, tl = diagnose_with_timeline(run, th, map=mapper, full=timeline_full)
    write(d, tl, Path(timeline))
    return d


def _count_events(progress: Callable[[int, int, int], None]) -> Progress:
    """A mapper progress hook that reports the events analysed so far."""
    events = 0

    def hook(done: int, total: int, result: Any) -> None:
        nonlocal events
        events += sum(getattr(r, "events", 0) for r in result or ())
        progress(done, total, events)

    return hook
