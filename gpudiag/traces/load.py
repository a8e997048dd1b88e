"""Reads a run directory (or loose trace files), picks loaders → RunTimeline.

:func:`load_run` is the one entry point for every input: Kineto files and directories,
Nsight reports and exports, run directories with their telemetry, NVML samples and every
node's manifest. Traces become lazy :class:`FileSource` objects, so that the analysis
loads and classifies each one in a worker and only small per-rank results cross process
(or machine) boundaries.
"""

from __future__ import annotations

import copy
import gzip
import os
import stat
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag._support.fileio import check_regular, kind_of, list_dir, walk_dir
from gpudiag._support.records import dataclass
from gpudiag.errors import InputError
from gpudiag.rundir import conditions as runconditions
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.conditions import ContentionSample
from gpudiag.traces.core.common import LoadOptions, rank_from_filename
from gpudiag.traces.schema import RankTimeline, RunTimeline, check_ranks

if TYPE_CHECKING:
    from gpudiag.traces.runfiles.runend import RunEnd

KINETO_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")


@dataclass(frozen=True)
class FileSource:
    """One trace file (a :class:`~gpudiag.traces.schema.RankSource`): read where it is loaded.

    ``origin`` is the ``.nsys-rep``/``.qdrep`` that ``path`` was exported from; ``rank``
    overrides what the file says.
    """

    path: Path
    fmt: str  # "kineto" or "nsys"
    options: LoadOptions = field(default_factory=LoadOptions)
    origin: Path | None = None
    rank: int | None = None

    @property
    def label(self) -> str:
        """The file as the user named it."""
        return str(self.origin or self.path)

    def load(self) -> list[RankTimeline]:
        """The ranks of the file: one for a Kineto trace, one per process for an export."""
        if self.fmt == "nsys":
            from gpudiag.traces.nsys import load_nsys

            return load_nsys(self.path, options=self.options, source=self.label)
        from gpudiag.traces.kineto import load_kineto_ranks  # not needed when results are cached

        return load_kineto_ranks(self.path, rank=self.rank, options=self.options)


@dataclass
class Inputs:
    """Everything found under the user's paths."""

    traces: list[FileSource]
    run_dirs: list[Path] = field(default_factory=list)
    manifests: list[rundir.RunManifest] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    telemetry_only: list[Path] = field(default_factory=list)  # run dirs with no trace at all
    fr_files: list[Path] = field(default_factory=list)  # flight-recorder dumps (traces/flightrec)
    evidence_only: list[Path] = field(default_factory=list)  # run dirs with hang evidence alone


def _fmt_of(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(KINETO_SUFFIXES):
        return "kineto"
    if name.endswith(NSYS_SUFFIXES):
        return "nsys"
    return None


def discover(paths: Iterable[str | os.PathLike[str]], options: LoadOptions | None = None) -> Inputs:
    """Find the traces under ``paths``: files, directories of traces, or run directories."""
    opts = options or LoadOptions()
    found = Inputs(traces=[])
    for raw in paths:
        p = Path(raw)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise InputError(p, "no such file or directory", "check the path") from None
        except OSError as e:
            raise InputError(p, f"cannot read ({e.strerror or e})", "check its permissions") from e
        if stat.S_ISDIR(st.st_mode):
            _discover_dir(p, found, opts)
        else:
            check_regular(p)  # a FIFO or a device is refused before anything opens it
            _add_file(p, found, opts, explicit=True)
    if not (found.traces or found.telemetry_only or found.fr_files or found.evidence_only):
        where = ", ".join(str(Path(p)) for p in paths) or "(nothing)"
        raise InputError(
            where,
            "no traces found",
            "give PyTorch Profiler traces (*.pt.trace.json[.gz]) or a gpudiag run directory",
        )
    return found


def _discover_dir(d: Path, found: Inputs, opts: LoadOptions) -> None:
    nodes = rundir.node_dirs(d)
    if nodes:
        _discover_run_dir(d, nodes, found, opts)
        return
    skipped = []
    for f in sorted(walk_dir(d)):  # by whole path, as before: the order of `inputs`
        if not _fmt_of(f) and _regular(f, found) and looks_like_dump(f):
            found.fr_files.append(f)
            continue
        if not _fmt_of(f) or not _regular(f, found):
            continue
        if _fmt_of(f) == "kineto" and not looks_like_trace(f):
            if looks_like_dump(f):
                found.fr_files.append(f)
                continue
            skipped.append(f.name)
        else:
            _add_file(f, found, opts, explicit=False)
    if skipped:
        found.notes.append(
            f"{len(skipped)} JSON file(s) in {d} that are not profiler traces were skipped: "
            + ", ".join(skipped[:5])
            + ("…" if len(skipped) > 5 else "")
        )
    if not found.traces and not found.fr_files:
        raise InputError(
            d,
            "directory holds no traces",
            "expected *.json / *.json.gz PyTorch Profiler traces or a gpudiag run directory "
            "(with manifest.json)",
        )


def _discover_run_dir(d: Path, nodes: list[Path], found: Inputs, opts: LoadOptions) -> None:
    found.run_dirs.append(d)
    for node in nodes:
        try:
            found.manifests.append(rundir.read_manifest(node / rundir.MANIFEST))
        except ValueError as e:
            raise InputError(
                node / rundir.MANIFEST, str(e), "is this a gpudiag run directory?"
            ) from e
        for f in list_dir(node / rundir.RANKS_DIR):
            if f.name.startswith("."):
                # a rank's temporary export, left behind when it died while writing: its
                # trace is lost (the manifest says so), not a trace to read
                found.notes.append(f"skipped {f}: an unfinished trace export (the rank died)")
                continue
            if _fmt_of(f) == "kineto" and _regular(f, found):
                _add_file(f, found, opts, explicit=False)
    exports = [
        p
        for node in nodes
        for p in list_dir(node / rundir.NSYS_DIR)
        if p.name.endswith(".sqlite") and _regular(p, found)
    ]
    if exports and any(t.path.is_relative_to(d) for t in found.traces):
        # one source per rank: the profiler traces; the Nsight export stays available
        found.notes.append(
            f"Nsight Systems export(s) beside the traces, not merged: "
            f"{', '.join(str(p) for p in exports)} (analyse them on their own)"
        )
    elif exports:
        for p in exports:
            _add_file(p, found, opts, explicit=False)
    if not any(t.path.is_relative_to(d) for t in found.traces):
        _without_traces(d, nodes, found, opts)


def _without_traces(d: Path, nodes: list[Path], found: Inputs, opts: LoadOptions) -> None:
    """A run directory without gpudiag's traces: the job's own, else the telemetry alone."""
    m = found.manifests[-1] if found.manifests else None
    own = [t for t in (m.extra.get("job_traces", []) if m else []) if isinstance(t, dict)]
    added = 0
    for t in own:
        p = Path(str(t.get("path", "")))
        if not p.is_absolute():
            p = d / p
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if f.is_file() and _fmt_of(f) == "kineto" and looks_like_trace(f):
                rank = t.get("rank")
                found.traces.append(
                    FileSource(f, "kineto", opts, rank=rank if isinstance(rank, int) else None)
                )
                added += 1
    if added:
        found.notes.append(
            f"no trace from gpudiag's window: analysed the job's own profiler "
            f"traces ({added} file(s), as the manifest lists them)"
        )
        return
    from gpudiag.traces.runfiles.telemetry import steps_files

    if steps_files(d):
        found.telemetry_only.append(d)
        return
    if any((node / rundir.RANKS_DIR / rundir.HANG_DIR).is_dir() for node in nodes):
        found.notes.append(f"{d}: no step finished; what the ranks left when stuck is analysed")
        found.evidence_only.append(d)
        return
    window = f" --profile-steps {m.profile_steps}" if m and m.profile_steps else ""
    raise InputError(
        d,
        "run directory without profiler traces or step telemetry (did the job stop "
        f"before its first step{window}?)",
        "re-run with --profile-steps A:B inside the job's step count",
    )


SNIFF_BYTES = 1 << 20
SNIFF_BLOCK = 64 << 10


def looks_like_trace(path: Path) -> bool:
    """Whether a ``.json``/``.json.gz`` found in a directory holds a ``traceEvents`` key.

    At most its first MiB is read (gunzipped), up to the key: Kineto writes it after a few small
    metadata blocks. Other JSON documents beside the traces (configs, a saved diagnosis, a
    job's own notes) are skipped rather than refused; a file named ``*.pt.trace.json``,
    an empty one or one that is not JSON at all is kept, so its loader says what is wrong.
    """
    if path.name.lower().endswith((".pt.trace.json", ".pt.trace.json.gz")):
        return True
    try:
        with path.open("rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        text = b""
        with opener(path, "rb") as f:
            # block by block, stopping at the key: a trace has it in its first few KB, and a
            # directory may hold thousands of them (a cached analysis reads nothing else)
            while len(text) < SNIFF_BYTES and (
                block := f.read(min(SNIFF_BLOCK, SNIFF_BYTES - len(text)))
            ):
                seen = len(text)
                text += block
                if b'"traceEvents"' in text[max(0, seen - 16) :]:
                    return True
    except (OSError, EOFError, zlib.error):
        return True  # unreadable: let the loader say why, naming the file
    # an empty or cut-off file is a broken trace, not some other JSON document
    return not text.strip() or text.lstrip()[:1] not in (b"{", b"[") or b'"traceEvents"' in text


def _regular(f: Path, found: Inputs) -> bool:
    """True for a regular file; anything else found in a directory is skipped with a note."""
    try:
        mode = os.stat(f).st_mode
    except FileNotFoundError:
        found.notes.append(f"skipped {f}: a broken symbolic link")
        return False
    except OSError as e:
        raise InputError(f, f"cannot read ({e.strerror or e})", "check its permissions") from e
    if stat.S_ISREG(mode):
        return True
    if not stat.S_ISDIR(mode):
        found.notes.append(f"skipped {f}: {kind_of(mode)}, not a regular file")
    return False


def _add_file(f: Path, found: Inputs, opts: LoadOptions, explicit: bool) -> None:
    fmt = _fmt_of(f)
    if fmt == "kineto":
        found.traces.append(FileSource(f, "kineto", opts))
        return
    if fmt == "nsys":
        from gpudiag.traces import nsys

        origin = None
        if f.name.lower().endswith(nsys.REPORT_SUFFIXES):
            if not explicit and f.with_suffix(".sqlite").is_file():
                return  # the export beside it is read instead
            f, origin = nsys.resolve_report(f, opts.nsys), f
        if all(t.path != f for t in found.traces):
            found.traces.append(FileSource(f, "nsys", opts, origin=origin))
        return
    if explicit and looks_like_dump(f):
        found.fr_files.append(f)
        return
    if explicit:
        raise InputError(
            f,
            f"unknown file type {f.suffix or '(no extension)'!r}",
            "gpudiag analyze reads Kineto traces (.json, .json.gz), Nsight Systems reports "
            "(.nsys-rep, .sqlite) and gpudiag run directories",
        )


def merge_manifests(manifests: Sequence[rundir.RunManifest]) -> rundir.RunManifest | None:
    """One manifest for a multi-node run: ranks and sources of every node together."""
    if len(manifests) <= 1:
        return manifests[0] if manifests else None
    m = copy.deepcopy(manifests[0])
    for other in manifests[1:]:
        m.ranks = m.ranks + list(other.ranks)
        for name, src in other.sources.items():
            mine = m.sources.get(name)
            if mine is None or (not mine.captured and src.captured):
                m.sources[name] = src
        m.diagnosis_incomplete = m.diagnosis_incomplete + list(other.diagnosis_incomplete)
        if other.exit_code not in (None, 0):
            m.exit_code = other.exit_code
    m.conditions = runconditions.merge(x.conditions for x in manifests)
    return m


def _alerts(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    if not run_dirs:  # the readers of run directories' files are imported for them only
        return []
    from gpudiag.traces.runfiles.alerts import load_alerts

    return [a for d in run_dirs for a in load_alerts(d)]


def _run_end(inputs: Inputs, manifest: rundir.RunManifest | None) -> RunEnd | None:
    """How the run ended: run directories and flight-recorder dumps only (else None)."""
    if not inputs.run_dirs and not inputs.fr_files:
        return None
    from gpudiag.traces.runfiles.runend import load_run_end  # with the flight-recorder reader

    return load_run_end(inputs, manifest)


def looks_like_dump(path: Path) -> bool:
    """:func:`gpudiag.traces.runfiles.flightrec.looks_like_dump`, imported on first use."""
    from gpudiag.traces.runfiles.flightrec import looks_like_dump as check

    return check(path)


def _contention(run_dirs: Sequence[Path]) -> list[ContentionSample]:
    """The run directories' host contention samples over time (traces/runfiles/contention.py)."""
    if not run_dirs:
        return []
    from gpudiag.traces.runfiles.contention import load_contention

    return sorted((s for d in run_dirs for s in load_contention(d)), key=lambda s: s.start_ns)


def load_run(*paths: str | os.PathLike[str], options: LoadOptions | None = None) -> RunTimeline:
    """Everything under ``paths`` as one RunTimeline.

    The run directories' manifests, step telemetry and NVML samples are read here (they
    are small); the traces become sources that load where they are analysed.
    """
    inputs = discover(paths, options)
    manifest = merge_manifests(inputs.manifests)
    run = RunTimeline(
        sources=list(inputs.traces),
        manifest=manifest,
        notes=inputs.notes,
        alerts=_alerts(inputs.run_dirs),
        run_end=_run_end(inputs, manifest),
        contention=_contention(inputs.run_dirs),
    )
    if inputs.run_dirs:  # only run directories have telemetry (and need pandas for it)
        import pandas as pd

        from gpudiag.traces.runfiles.samples import load_samples
        from gpudiag.traces.runfiles.telemetry import load_steps, steps_files

        tele = [load_steps(d, inputs.notes) for d in inputs.run_dirs if steps_files(d)]
        samples = [load_samples(d, inputs.notes) for d in inputs.run_dirs]
        run.telemetry = pd.concat(tele, ignore_index=True) if tele else None
        run.samples = pd.concat(samples, ignore_index=True) if samples else None
    return run


__all__ = [
    "FileSource",
    "Inputs",
    "LoadOptions",
    "check_ranks",
    "discover",
    "load_run",
    "merge_manifests",
    "rank_from_filename",
]
