"""The Interval schema (rank, lane, kind, name, start_ns, end_ns, step), timelines, validation.

Every loader (Kineto, Nsight, telemetry) returns a :class:`RankTimeline`: one table of
intervals held as parallel numpy arrays, so the analysis can do set arithmetic on whole
columns at once. Strings are interned: ``name`` and ``lane`` are indices into the
``names`` and ``lanes`` lists.

Columns (all the same length):

============  ========  ===============================================================
column        dtype     meaning
============  ========  ===============================================================
start_ns      int64     start, integer nanoseconds on the rank's clock
end_ns        int64     end (≥ start_ns)
kind          int8      a :class:`Kind`
lane          int32     index into ``lanes``: ``cpu:<tid>`` or ``gpu:<device>:<stream>``
name          int32     index into ``names``
step          int32     step ranges: their step number; other intervals -1 (the analysis
                        assigns work to steps, :mod:`gpudiag.analysis.reading.steps`)
launch_ns     int64     for GPU work: host time of the launching runtime call, else -1
nbytes        int64     bytes moved by a copy or collective when known, else -1
coll_id       int64     collectives: an id equal on every rank for the same collective
                        (``Comms Id``, or group + ``Seq``), else -1
coll_name     int32     collectives: index into ``names`` of the collective's type as the
                        trace names it (``allreduce``, ``send`` …), else -1
coll_dtype    int32     collectives: index into ``names`` of the element type the trace
                        gives them (Kineto's ``dtype``: ``BFloat16``, ``Float`` …), else -1
shape         int32     operators recorded with their inputs (``record_shapes``) whose family
                        has a performance model (matrix, attention, normalisation,
                        elementwise, communication): index into ``shapes``, else -1
============  ========  ===============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from gpudiag._support.records import dataclass
from gpudiag.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from gpudiag.rundir.conditions import ContentionSample
    from gpudiag.rundir.layout import RunManifest
    from gpudiag.traces.runfiles.runend import RunEnd

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]


class Kind(IntEnum):
    """What an interval is. GPU kinds live on ``gpu:`` lanes, host kinds on ``cpu:`` lanes."""

    COMPUTE = 0  # a GPU kernel that is not communication
    COMM = 1  # a communication kernel (GPU lane) or a collective range (CPU lane)
    MEMCPY = 2
    MEMSET = 3
    RUNTIME = 4  # CUDA/HIP runtime or driver call, or a synchronisation marker
    DATALOADER = 5  # the training thread fetching a batch (DataLoader __next__, user data range)
    STEP = 6  # a training-step range (ProfilerStep#N, gpudiag's own step range)
    ANNOTATION = 7  # any other user or framework range
    CPU_OP = 8  # an operator on a host thread
    OS_WAIT = 9  # a blocking OS call on a host thread (Nsight OSRT: cond waits, poll, futex …)


KIND_NAMES = [k.name.lower() for k in Kind]
GPU_BUSY_KINDS = (Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET)


@dataclass
class HostSteps:
    """The training steps of a rank on its host timeline, resolved by the loader core.

    ``start_ns``/``end_ns`` are the host step ranges (sorted, non-overlapping) and
    ``number`` their step numbers; ``source`` says where they came from (``ProfilerStep``:
    step markers, ``marker``: the ranges ``--step-marker`` matched, ``user_range``: the
    user's own iteration range, found automatically,
    ``optimizer``: inferred from the ends of ``Optimizer.step`` ranges, ``kernels``: a
    repeating kernel sequence, ``whole``: no steps,
    the trace is one window) and ``notes`` how; ``range_name`` is the user range's name
    with digits folded (``step N``).
    """

    start_ns: I64
    end_ns: I64
    number: I64
    source: str
    notes: list[str] = field(default_factory=list)
    range_name: str = ""

    @property
    def user_ranges(self) -> bool:
        """The steps are the user's own ranges (found, or named by ``--step-marker``).

        Unlike the profiler's contiguous ``ProfilerStep#N``, such a range usually opens
        after the batch has arrived: the time between two of them is the input pipeline.
        """
        return self.source in ("marker", "user_range")

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])

    def gaps(self) -> tuple[I64, I64]:
        """The host time between consecutive step ranges: [end of N, start of N+1)."""
        if len(self) < 2:
            z = np.zeros(0, np.int64)
            return z, z.copy()
        s, e = self.end_ns[:-1], self.start_ns[1:]
        keep = e > s
        return s[keep], e[keep]


def no_steps() -> HostSteps:
    """An empty step table (a timeline whose loader has not resolved its steps)."""
    z = np.zeros(0, np.int64)
    return HostSteps(z, z.copy(), z.copy(), "whole")


@dataclass
class RankMeta:
    """What a loader learnt about the rank besides its intervals."""

    source: str = ""
    fmt: str = ""  # "kineto", "nsys"
    era: str = ""  # detected format era, e.g. "kineto-2024"
    world_size: int | None = None
    backend: str | None = None
    devices: list[str] = field(default_factory=list)  # GPU names
    # per device, when the trace records them: "major.minor" and multiprocessors (SMs/CUs)
    compute_capability: list[str] = field(default_factory=list)
    multiprocessors: list[int] = field(default_factory=list)
    main_lane: int = -1  # lane of the training thread, -1 when unknown
    rank_from: str = ""  # "distributedInfo", "file name", "default", "manifest", ...
    has_gpu: bool = False
    notes: list[str] = field(default_factory=list)  # things missing or assumed
    skipped_events: int = 0
    thread_names: dict[str, list[str]] = field(default_factory=dict)  # lane → thread names
    # Nsight GPU_METRICS: counter → (sample times ns, values as ratios)
    gpu_metrics: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    pid: int | None = None  # the profiled process, when the format names it
    cuda_devices: list[int] = field(default_factory=list)
    capture_version: str | None = None  # the profiler release that captured the trace
    # GPU/CPU clocks (traces.rank_builder.check_clocks): the shift applied to GPU times per device,
    # and whether the clocks disagree beyond correction (then compute and host time are not
    # split)
    clock_shift_ns: dict[int, int] = field(default_factory=dict)
    clock_unreliable: bool = False
    # what the trace can support (traces.common): host-operator id holes (sampling), GPU
    # devices listed without any GPU activity, events dropped or clamped by reason
    coverage: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)


def gpu_lanes(lanes: Sequence[str]) -> npt.NDArray[np.bool_]:
    """Per lane index: true for the device lanes (``gpu:<device>:<stream>``)."""
    return np.array([ln.startswith("gpu:") for ln in lanes], dtype=bool)


@dataclass(frozen=True)
class PythonFrames:
    """A rank's Python-function calls (Kineto ``python_function``) not chosen as steps.

    Kept beside the intervals, not among them (one per Python call, they would weigh on
    every rule): what the host-cause evidence reads to name where Python time goes.
    ``lane`` and ``name`` index the timeline's ``lanes`` and ``names``.
    """

    start_ns: I64
    end_ns: I64
    lane: I32
    name: I32

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])


@dataclass
class RankTimeline:
    """All intervals of one rank, column-wise."""

    rank: int
    start_ns: I64
    end_ns: I64
    kind: I8
    lane: I32
    name: I32
    step: I32
    launch_ns: I64
    nbytes: I64
    lanes: list[str]
    names: list[str]
    meta: RankMeta = field(default_factory=RankMeta)
    coll_id: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    coll_name: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    coll_dtype: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    steps: HostSteps = field(default_factory=no_steps)
    shape: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    # ``Input Dims``, ``Input type``, ``Concrete Inputs`` and ``Input Strides`` of an operator
    # as the trace wrote them (JSON, the last two empty when absent), one line each
    shapes: list[str] = field(default_factory=list)
    # Python-function calls, when the trace records them (None: none)
    python: PythonFrames | None = None

    def __post_init__(self) -> None:
        n = int(self.start_ns.shape[0])
        if self.coll_id.shape[0] != n:
            self.coll_id = np.full(n, -1, np.int64)
        if self.coll_name.shape[0] != n:
            self.coll_name = np.full(n, -1, np.int32)
        if self.coll_dtype.shape[0] != n:
            self.coll_dtype = np.full(n, -1, np.int32)
        if self.shape.shape[0] != n:
            self.shape = np.full(n, -1, np.int32)

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])

    def validate(self) -> RankTimeline:
        """Check the fixed schema; loaders call this before returning. Raises ValueError."""
        n = len(self)
        cols: dict[str, tuple[npt.NDArray[Any], Any]] = {
            "start_ns": (self.start_ns, np.int64),
            "end_ns": (self.end_ns, np.int64),
            "kind": (self.kind, np.int8),
            "lane": (self.lane, np.int32),
            "name": (self.name, np.int32),
            "step": (self.step, np.int32),
            "launch_ns": (self.launch_ns, np.int64),
            "nbytes": (self.nbytes, np.int64),
            "coll_id": (self.coll_id, np.int64),
            "coll_name": (self.coll_name, np.int32),
            "coll_dtype": (self.coll_dtype, np.int32),
            "shape": (self.shape, np.int32),
        }
        for col, (arr, dt) in cols.items():
            if arr.dtype != dt or arr.shape != (n,):
                raise ValueError(
                    f"column {col}: expected {np.dtype(dt)}[{n}], got {arr.dtype}{arr.shape}"
                )
        if n:
            if np.any(self.end_ns < self.start_ns):
                raise ValueError("an interval ends before it starts")
            if self.kind.min() < 0 or self.kind.max() >= len(Kind):
                raise ValueError("unknown interval kind")
            if self.lane.min() < 0 or self.lane.max() >= len(self.lanes):
                raise ValueError("lane index out of range")
            if self.name.min() < 0 or self.name.max() >= len(self.names):
                raise ValueError("name index out of range")
            if self.shape.max() >= len(self.shapes) or self.shape.min() < -1:
                raise ValueError("shape index out of range")
        return self

    def select(self, mask: npt.NDArray[np.bool_]) -> RankTimeline:
        """The intervals where ``mask`` is true (lanes and names are shared, not copied)."""
        return RankTimeline(
            rank=self.rank,
            start_ns=self.start_ns[mask],
            end_ns=self.end_ns[mask],
            kind=self.kind[mask],
            lane=self.lane[mask],
            name=self.name[mask],
            step=self.step[mask],
            launch_ns=self.launch_ns[mask],
            nbytes=self.nbytes[mask],
            lanes=self.lanes,
            names=self.names,
            meta=self.meta,
            coll_id=self.coll_id[mask],
            coll_name=self.coll_name[mask],
            coll_dtype=self.coll_dtype[mask],
            steps=self.steps,
            shape=self.shape[mask],
            shapes=self.shapes,
            python=self.python,
        )

    def gpu_lane_mask(self) -> npt.NDArray[np.bool_]:
        """Per lane index: true for ``gpu:`` lanes."""
        return gpu_lanes(self.lanes)

    def to_frame(self) -> Any:
        """The interval table as a pandas DataFrame with string columns (for users and tests)."""
        import pandas as pd

        kinds = np.array(KIND_NAMES, dtype=object)
        return pd.DataFrame(
            {
                "rank": self.rank,
                "lane": np.asarray(self.lanes, dtype=object)[self.lane] if len(self) else [],
                "kind": kinds[self.kind] if len(self) else [],
                "name": np.asarray(self.names, dtype=object)[self.name] if len(self) else [],
                "start_ns": self.start_ns,
                "end_ns": self.end_ns,
                "step": self.step,
                "launch_ns": self.launch_ns,
                "nbytes": self.nbytes,
            }
        )

    @classmethod
    def from_columns(
        cls,
        rank: int,
        *,
        start_ns: Any,
        end_ns: Any,
        kind: Any,
        lane: Any,
        name: Any,
        lanes: list[str],
        names: list[str],
        step: Any = None,
        launch_ns: Any = None,
        nbytes: Any = None,
        coll_id: Any = None,
        coll_name: Any = None,
        coll_dtype: Any = None,
        meta: RankMeta | None = None,
        steps: HostSteps | None = None,
        shape: Any = None,
        shapes: list[str] | None = None,
        python: PythonFrames | None = None,
    ) -> RankTimeline:
        """Build and validate a timeline, filling optional columns with their defaults."""
        s = np.asarray(start_ns, dtype=np.int64)
        n = s.shape[0]

        def col(v: Any, dt: Any, fill: int) -> Any:
            return np.full(n, fill, dtype=dt) if v is None else np.asarray(v, dtype=dt)

        return cls(
            rank=rank,
            start_ns=s,
            end_ns=np.asarray(end_ns, dtype=np.int64),
            kind=np.asarray(kind, dtype=np.int8),
            lane=np.asarray(lane, dtype=np.int32),
            name=np.asarray(name, dtype=np.int32),
            step=col(step, np.int32, -1),
            launch_ns=col(launch_ns, np.int64, -1),
            nbytes=col(nbytes, np.int64, -1),
            lanes=lanes,
            names=names,
            meta=meta or RankMeta(),
            coll_id=col(coll_id, np.int64, -1),
            coll_name=col(coll_name, np.int32, -1),
            coll_dtype=col(coll_dtype, np.int32, -1),
            steps=steps or no_steps(),
            shape=col(shape, np.int32, -1),
            shapes=shapes or [],
            python=python,
        ).validate()


class RankSource(Protocol):
    """Where one or more ranks come from; loads them on demand (in a worker process).

    Sources are small and picklable, so a process pool or a Dask cluster can ship them to
    the worker that reads the file: the intervals never cross a process boundary.
    """

    @property
    def label(self) -> str:
        """The input as users name it (a path), for messages and ``Diagnosis.inputs``."""
        ...

    def load(self) -> list[RankTimeline]:
        """Read the ranks (one file can hold several)."""
        ...


@dataclass(frozen=True)
class LoadedSource:
    """Timelines already in memory (built by hand, by a test or by another tool)."""

    timelines: tuple[RankTimeline, ...]
    name: str = "memory"

    @property
    def label(self) -> str:
        """The name given, or the timelines' own sources."""
        own = sorted({t.meta.source for t in self.timelines if t.meta.source})
        return ", ".join(own) if own else self.name

    def load(self) -> list[RankTimeline]:
        """The timelines themselves."""
        return list(self.timelines)


@dataclass
class RunTimeline:
    """Every rank of one run, plus what a run directory adds (manifest, samples, telemetry).

    ``sources`` load lazily: :func:`gpudiag.analysis.diagnose.diagnose` loads each in a
    worker and ships back only compact per-rank results; :attr:`ranks` loads them all here
    (the interval model, for users' own analyses).
    """

    sources: list[RankSource]
    manifest: RunManifest | None = None
    telemetry: pd.DataFrame | None = None  # per (rank, step): traces/telemetry.py COLUMNS
    samples: pd.DataFrame | None = None  # NVML samples: traces/samples.py COLUMNS
    notes: list[str] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)  # traces/alerts.py records
    # how the ranks ended and the hang evidence (traces/runend.py); None: a run that
    # ended well without any, or loose traces
    run_end: RunEnd | None = None
    # the host's CPU contention over time (conditions/<host>.jsonl): what the blame rule
    # correlates a straggler's excess with (analysis/stragglers/busy_host.py)
    contention: list[ContentionSample] = field(default_factory=list)
    _loaded: list[RankTimeline] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, ranks: list[RankTimeline], **kw: Any) -> RunTimeline:
        """A run made of timelines already in memory."""
        return cls(sources=[LoadedSource(tuple(ranks))], **kw)

    @property
    def inputs(self) -> list[str]:
        """The label of every source."""
        return [s.label for s in self.sources]

    @property
    def ranks(self) -> list[RankTimeline]:
        """Every rank's timeline, loaded on first use (in this process), sorted by rank.

        Diagnosis never asks for this: the API loads each source where the fan-out runs it.
        """
        if self._loaded is None:
            loaded = [t for s in self.sources for t in _load_source(s)]
            check_ranks(loaded, [t.meta.source for t in loaded])
            self._loaded = sorted(loaded, key=lambda t: t.rank)
        return self._loaded


def check_ranks(ranks: Sequence[Any], sources: Sequence[str]) -> None:
    """Fail on two inputs claiming one rank, or several inputs with no rank at all.

    ``ranks`` are anything with ``rank`` and ``meta.rank_from`` (timelines or results);
    ``sources`` name the input each came from.
    """
    by_rank: dict[int, str] = {}
    defaulted = [
        src for t, src in zip(ranks, sources, strict=True) if t.meta.rank_from == "default"
    ]
    if len(defaulted) > 1:
        raise InputError(
            defaulted[1],
            f"no rank found, as in {Path(defaulted[0]).name}: looked for distributedInfo.rank "
            "in the trace, 'RANK r' process names or args.rank (merged files), and "
            "rank<N> / rank-<N> / rank_<N> in the file name",
            "rename the files rank-<N>.json.gz, or analyse them one at a time",
        )
    for t, src in zip(ranks, sources, strict=True):
        if t.rank in by_rank:
            raise InputError(
                src,
                f"claims rank {t.rank}, as does {by_rank[t.rank]}",
                "give one trace per rank (several profiling windows of one rank: analyse "
                "each window separately)",
            )
        by_rank[t.rank] = src


def _load_source(source: RankSource) -> list[RankTimeline]:
    return source.load()
