"""The Diagnosis and the frozen dataclasses it is made of; ``to_json`` with ``schema_version``.

This is the contract between analysis and every renderer, and (as JSON) with users'
scripts and CI systems. docs/json-schema.md documents it and
``gpudiag/schema/diagnosis.schema.json`` checks it; bump :data:`SCHEMA_VERSION` on any
incompatible change. Kinds, severities, causes, modes and step sources are string enums
(:mod:`gpudiag.analysis.model.kinds`): they compare equal to, and serialise as, the plain
strings of the JSON. Each finding kind's metrics are a class of
:mod:`gpudiag.analysis.model.metrics`. Reading a saved document back is
:func:`gpudiag.api.saved.diagnosis_from_json`; rendering and frames are above analysis.
"""

from collections.abc import Iterable
from dataclasses import field
from typing import Any, TypedDict, TypeVar

from gpudiag._support.records import asdict, dataclass
from gpudiag.analysis.model.efficiency import ComputeEfficiency
from gpudiag.analysis.model.evidence import (
    CopiesAlone,
    Coverage,
    DeviceFormats,
    HostApiEntry,
    HostOps,
    KernelsByStep,
    PythonSites,
    RankReading,
    WorkloadTag,
)
from gpudiag.analysis.model.kinds import (
    Bottleneck,
    EfficiencyGap,
    MatchMethod,
    TimeUnit,
    VerdictBasis,
)
from gpudiag.analysis.model.kinds import Cause as Cause
from gpudiag.analysis.model.kinds import FindingKind as FindingKind
from gpudiag.analysis.model.kinds import Mode as Mode
from gpudiag.analysis.model.kinds import Severity as Severity
from gpudiag.analysis.model.kinds import StepSource as StepSource
from gpudiag.analysis.model.kinds import StrEnum as StrEnum
from gpudiag.analysis.model.metrics import (
    OMIT_IF_NONE,
    FindingMetrics,
    JsonObject,
    NoMetrics,
    without_omitted,
)
from gpudiag.analysis.model.metrics import PipelineSummary as PipelineSummary

SCHEMA_VERSION = 1
SHARE_KEYS = ("compute", "comm_wait", "data_wait", "other")
M = TypeVar("M", bound=FindingMetrics)


@dataclass(frozen=True)
class StepBreakdown:
    """One (rank, step): its period and how it splits. The four parts sum to ``duration_ns``."""

    rank: int
    step: int
    start_ns: int
    duration_ns: int
    compute_ns: int
    comm_wait_ns: int
    data_wait_ns: int
    other_ns: int
    comm_overlapped_ns: int
    gpu_ops: int | None = None
    gpu_idle_ns: int | None = None  # no kernel, copy or memset of any kind (GPU traces)

    @property
    def idle_ratio(self) -> float:
        """1 − compute / step time: the non-compute idle."""
        return 1.0 - self.compute_ns / self.duration_ns if self.duration_ns else 0.0


def by_rank(steps: Iterable[Any]) -> dict[int, list[Any]]:
    """Steps (anything with ``rank``) grouped by rank in one pass, order kept."""
    out: dict[int, list[Any]] = {}
    for s in steps:
        out.setdefault(s.rank, []).append(s)
    return out


@dataclass(frozen=True)
class Shares:
    """Fractions of step time; they sum to 1.

    ``comm_measured`` is False when nothing measured the communication wait: step
    telemetry alone, which does not see DDP's C++ reducer, and saw no collective wait.
    ``comm_wait`` then holds 0 for the arithmetic, and the outputs say "not measured"
    (``comm_wait_shown`` and JSON: null).
    """

    compute: float
    comm_wait: float
    data_wait: float
    other: float
    comm_measured: bool = True

    @property
    def comm_wait_shown(self) -> float | None:
        """The comm-wait share as the outputs show it: None when not measured."""
        return self.comm_wait if self.comm_measured else None

    def as_dict(self) -> dict[str, float | None]:
        """Plain dict for JSON (``comm_wait`` null when not measured)."""
        return {k: getattr(self, k) for k in SHARE_KEYS} | {"comm_wait": self.comm_wait_shown}


@dataclass(frozen=True)
class TopEntry:
    """One kernel (or operator) name and its time."""

    name: str
    family: str
    time_ns: int
    count: int
    share: float  # of all kernel (operator) time of the rank or run


@dataclass(frozen=True)
class KernelBreakdown:
    """The kernels (GPU) or operators (CPU) behind compute, by name and by family."""

    unit: TimeUnit
    total_ns: int
    top: list[TopEntry]
    families: dict[str, float]  # family → share of total_ns, largest first
    fp32_gemm_share: float  # of GEMM time, in full fp32
    fp32_matrix_share: float = 0.0  # of GEMM, convolution and attention time, in full fp32


@dataclass(frozen=True)
class GpuIdleInSteps:
    """GPU-idle gaps while the host is inside its steps (short ones: launch overhead)."""

    total_ns: int
    short_gaps: int
    short_gaps_ns: int
    long_gaps: int
    long_gap_ns_median: int | None


@dataclass(frozen=True)
class BetweenSteps:
    """What the training thread did in the input gaps between its step ranges."""

    gap_ns: int
    blocked_in: dict[str, float]  # blocking OS call → share of the gap time
    ranges: dict[str, float]  # host range → share of the gap time


@dataclass(frozen=True)
class RankEvidence:
    """Names and counts that messages and remedies quote; ``None``: not seen (not in the JSON)."""

    data_range: str | None = None  # the dominant data-loading range
    comm_top: str | None = None  # the dominant collective …
    comm_names: list[str] | None = None  # … and the top three
    gpu_ops: int | None = None
    backend: str | None = None  # the process group's backend
    gpu_metrics: dict[str, float | None] | None = None  # Nsight's sampled GPU metrics …
    gpu_metrics_per_step: dict[str, list[float | None]] | None = None  # … and per step
    between_steps: BetweenSteps | None = None
    copies_alone_ns: int | None = None  # copies with nothing beside them
    gpu_idle_in_steps: GpuIdleInSteps | None = None
    kernels: KernelBreakdown | None = None
    comm_types: dict[str, float] | None = None  # collective type → share
    p2p_recv_wait_ns: int | None = None  # blocked in receives, computing nothing …
    p2p_recv_wait_ns_per_step: list[int] | None = None  # … and per step
    host_comm_types: dict[str, float] | None = None  # by host-side operation
    # what the trace holds, for the evidence limits (analysis/evidence.py)
    coverage: Coverage | None = None
    # issue 20: what the rank runs and on what, and where its host time goes
    workload: dict[str, WorkloadTag] | None = None  # tag → {count, names}
    device: DeviceFormats | None = None  # the GPUs' generation and formats
    host_api: dict[str, HostApiEntry] | None = None  # runtime-call class → its time
    host_op_share: float | None = None  # of the steps, an operator open on a host thread
    # per step: inside operators on the training/other threads, inside or between them idle
    host_ops: HostOps | None = None
    # per step: the Python functions the training thread is in, between operators, GPU idle
    # (not in the JSON: the Python cause's call_sites quote it)
    python_sites: PythonSites | None = None
    # per step: kernels, and the compute kernels whose time varies most (name → ns a step)
    kernels_by_step: KernelsByStep | None = None
    kernels_per_step: float | None = None
    kernel_ns_median: int | None = None
    low_precision_share: float | None = None  # of compute kernel time, half precision
    copy_ns: int | None = None  # GPU copy time in the steps …
    pageable_copy_ns: int | None = None  # … from or to pageable memory
    copies_alone: CopiesAlone | None = None  # host-device copies alone, per step
    # collective type → calls per analysed step and median message bytes (-1: unknown)
    collective_calls: dict[str, dict[str, float]] | None = None
    # blocking host communication calls (MPI_*, gloo:*) → ns inside the analysed steps
    comm_calls: dict[str, int] | None = None
    # collective type → element type (bf16, fp32 …) → share of that type's time
    comm_dtypes: dict[str, dict[str, float]] | None = None
    # achieved FLOP/s and bandwidth of the modelled operators against the device's peak
    efficiency: ComputeEfficiency | None = None
    efficiency_gap: EfficiencyGap | None = None  # a GPU rank without it: why
    # what the trace was taken to be: start-up, edges, iterations (analysis/reading)
    reading: RankReading | None = None

    @classmethod
    def of(cls, parts: "EvidenceParts") -> "RankEvidence":
        """From the per-rank analysis' named parts (those it did not find stay None)."""
        return cls(**parts)

    def top_kernels(self) -> list[TopEntry]:
        """The kernels (operators) of :attr:`kernels` that took the most time; [] if unseen."""
        return self.kernels.top if self.kernels is not None else []

    def to_json(self) -> JsonObject:
        """The ``evidence`` object of a JSON rank: only what was seen (no nulls)."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        # read by the host cause, whose call_sites carry what it names (issue 29): a trace's
        # Python frames alone add nothing to the JSON
        out.pop("python_sites", None)
        if self.reading is not None:
            out["reading"] = self.reading.to_json()
        return out


class EvidenceParts(TypedDict, total=False):
    """The per-rank analysis' parts of :class:`RankEvidence`, by field, as it finds them."""

    data_range: str
    comm_top: str
    comm_names: list[str]
    gpu_ops: int
    backend: str
    gpu_metrics: dict[str, float | None]
    gpu_metrics_per_step: dict[str, list[float | None]]
    between_steps: BetweenSteps
    copies_alone_ns: int
    gpu_idle_in_steps: GpuIdleInSteps
    kernels: KernelBreakdown
    comm_types: dict[str, float]
    p2p_recv_wait_ns: int
    p2p_recv_wait_ns_per_step: list[int]
    host_comm_types: dict[str, float]
    coverage: Coverage
    workload: dict[str, WorkloadTag]
    device: DeviceFormats
    host_api: dict[str, HostApiEntry]
    host_op_share: float
    host_ops: HostOps
    python_sites: PythonSites
    kernels_by_step: KernelsByStep
    kernels_per_step: float
    kernel_ns_median: int
    low_precision_share: float
    copy_ns: int
    pageable_copy_ns: int
    copies_alone: CopiesAlone
    collective_calls: dict[str, dict[str, float]]
    comm_calls: dict[str, int]
    comm_dtypes: dict[str, dict[str, float]]
    efficiency: ComputeEfficiency
    efficiency_gap: EfficiencyGap
    reading: RankReading


@dataclass(frozen=True)
class RankSummary:
    """One rank over all its analysed steps (time-weighted)."""

    rank: int
    steps: int
    step_time_ns_median: int
    step_time_ns_p90: int
    shares: Shares
    comm_overlapped_ratio: float
    comm_hidden_ratio: float | None
    idle_ratio: float
    mode: Mode
    step_source: StepSource
    source: str
    devices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evidence: RankEvidence = field(default_factory=RankEvidence)
    gpu_idle_ratio: float | None = None  # HTA's / nvidia-smi's idle: no GPU activity at all


@dataclass(frozen=True)
class RunSummary:
    """The whole run: every rank's steps together."""

    ranks: int
    world_size: int | None
    steps: int
    step_time_ns_median: int
    step_time_ns_p90: int
    shares: Shares
    comm_overlapped_ratio: float
    idle_ratio: float
    mode: Mode
    gpu_idle_ratio: float | None = None  # HTA's / nvidia-smi's idle: no GPU activity at all


@dataclass(frozen=True)
class Finding:
    """Something worth a user's attention, with the numbers that triggered it."""

    kind: FindingKind
    severity: Severity
    message: str
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    metrics: FindingMetrics = field(default_factory=NoMetrics)
    # stragglers only: why the rank is slow, whether it is slow in most steps, and the
    # total time the other ranks spent waiting for it
    cause: Cause | None = None
    persistent: bool | None = None
    wait_caused_ns: int | None = None

    def metrics_as(self, cls: type[M]) -> M:
        """The metrics as the kind's class (TypeError if they are another's)."""
        if not isinstance(self.metrics, cls):
            raise TypeError(
                f"{self.kind} finding has {type(self.metrics).__name__}, not {cls.__name__}"
            )
        return self.metrics


@dataclass(frozen=True)
class Recommendation:
    """A remedy, the finding it answers and the evidence for it."""

    id: str
    title: str
    detail: str
    finding: FindingKind
    # free-form: the numbers each remedy quotes (analysis/remedies), by its own names
    evidence: JsonObject = field(default_factory=dict)
    estimated_gain_ns: int | None = None
    estimated_gain_ratio: float | None = None
    overlaps_with: list[str] = field(default_factory=list)  # remedies for the same time


@dataclass(frozen=True)
class SpreadEntry:
    """Megatron-style min and max of one metric across ranks, with the rank holding each."""

    min: float
    min_rank: int
    max: float
    max_rank: int


@dataclass(frozen=True)
class WhatIfFigures:
    """First-order step times under three changes, on one step statistic (analysis/whatif.py)."""

    step_time_ns: int
    if_comm_overlapped_ns: int | None  # None: comm-wait not measured (telemetry only)
    if_no_data_wait_ns: int
    if_straggler_at_median_speed_ns: int | None = None
    if_all_ns: int | None = None  # the three changes together
    # the statistic over the steps: the median, the headline's ("mean" in files written
    # before it was; also ``on_mean``'s)
    statistic: str = "mean"
    critical_path_ns: int | None = None  # the slowest non-straggler rank's own work
    critical_rank: int | None = None


@dataclass(frozen=True)
class WhatIf(WhatIfFigures):
    """The what-if: its figures on the median step, and on the mean step where they differ."""

    # the same figures on the mean step, where a change's saving there differs from the
    # median's by advice.what_if_mean_gap_ratio of a step (analysis/run/whatif.py)
    on_mean: WhatIfFigures | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class CollectiveRow:
    """Matched collectives of one type and message-size bucket."""

    type: str
    size_bucket: str
    count: int
    bytes_median: int | None
    transfer_ns_median: int
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    peak_gbps: float | None = None
    efficiency: float | None = None
    link: str | None = None  # the link the peak is of (NVLink 3, PCIe 4.0 x16 …)
    likely_cause: str | None = None  # why a share of peak is low, as far as the trace tells


@dataclass(frozen=True)
class RankSync:
    """One rank's time in matched collectives: waiting for the last rank, and transferring.

    ``sync_wait_ns`` runs from the rank's entry into each collective to the last rank's;
    where the collective runs beside compute (DDP's buckets on gloo's thread during
    backward) compute hides part of it. ``exposed_wait_ns`` is the part that held the step:
    per step, the least of that wait and the rank's comm-wait (None in older files).
    """

    sync_wait_ns: int
    transfer_ns: int
    exposed_wait_ns: int | None = None


@dataclass(frozen=True)
class LateArrival:
    """How often a rank was the last to reach a matched collective, and what it cost."""

    last: int  # matched collectives at which it arrived last (the others waited for it)
    waited_ns: int  # the other ranks' synchronisation wait at those collectives, summed
    waited_ns_min: int  # per collective, the others' mean wait: smallest …
    waited_ns_max: int  # … and largest


@dataclass(frozen=True)
class CollectivesSummary:
    """Collectives matched across ranks: transfer vs synchronisation, bandwidth per bucket."""

    method: MatchMethod
    matched: int
    bandwidth_is_lower_bound: bool
    by_type: list[CollectiveRow]
    per_rank: dict[str, RankSync] = field(default_factory=dict)
    pipeline: PipelineSummary | None = None
    late_arrival: dict[str, LateArrival] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        """The JSON section; ``pipeline`` only when stages were found."""
        d = asdict(self)
        if self.pipeline is None:
            del d["pipeline"]
        return d


@dataclass(frozen=True)
class RunStep:
    """One step of one rank from ``gpudiag run``'s always-on telemetry.

    Every step, not only the profiled ones. Waits are ``None`` where not measured. The
    phases (``pre_forward_ns``: the step's start to its first module call, input and host
    work; ``forward_ns``; ``optimizer_ns``) are ``None`` where the step did not show them;
    ``data_wait_ns`` is the input wait, the DataLoader's own (``loader_wait_ns``) or the
    pre-forward phase's growth over the rank's floor when larger
    (:func:`gpudiag.analysis.run.phases.with_input_wait`).
    ``cpu_ns`` is the training thread's CPU time in the step (``None``: not measured).
    """

    rank: int
    step: int
    start_ns: int
    duration_ns: int
    data_wait_ns: int | None
    comm_wait_ns: int | None
    backward_ns: int | None
    profiled: bool
    pre_forward_ns: int | None = None
    forward_ns: int | None = None
    optimizer_ns: int | None = None
    loader_wait_ns: int | None = None
    cpu_ns: int | None = None


@dataclass(frozen=True)
class LiveAlert:
    """An alert ``gpudiag run`` raised (or cleared) while the job ran (analysis/online.py).

    ``time_ns`` is when the monitor judged it (epoch ns, the telemetry's clock), ``step``
    the step it judged, ``state`` ``raised`` or ``cleared``.
    """

    time_ns: int
    step: int
    kind: str
    ranks: list[int]
    message: str
    # free-form: the numbers the live rule judged (analysis/run/online.py), by rule
    metrics: JsonObject = field(default_factory=dict)
    state: str = "raised"

    def line(self) -> str:
        """The stderr line (after ``gpudiag: ``)."""
        what = "alert" if self.state == "raised" else "alert cleared"
        return f"{what}: step {self.step}: {self.message}"


@dataclass(frozen=True)
class WholeRunRank:
    """One rank over every step of the run (telemetry)."""

    rank: int
    steps: int
    step_time_ns_median: int
    step_time_ns_p90: int
    step_time_ns_max: int
    data_wait_ratio: float | None
    comm_wait_ratio: float | None
    host: str = ""


@dataclass(frozen=True)
class GpuStats:
    """NVML samples of one GPU over the run's steps; ``None`` where NVML could not say."""

    gpu_uuid: str
    rank: int | None
    host: str
    samples: int
    util_ratio: float | None
    mem_util_ratio: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    temp_c_max: float | None
    slowdown_ratio: float | None  # share of samples with a hardware/thermal/power slowdown
    slowdown_reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PhaseFrontier:
    """The rank and step phase that hold the others back most often (analysis/run/phases.py)."""

    rank: int
    phase: str  # "pre_forward" (input and host work) or "forward"
    steps: int  # steady steps in which it did
    steps_compared: int
    excess_ns_median: int  # its excess in that phase over the other ranks' median, then


@dataclass(frozen=True)
class WholeRun:
    """What a run directory adds to the profiled window: every step, and the GPUs' samples."""

    ranks: list[WholeRunRank]
    steps: list[RunStep]
    gpus: list[GpuStats] = field(default_factory=list)
    job_exit_code: int | None = None
    frontier: PhaseFrontier | None = None  # None: the telemetry has no step phases


@dataclass(frozen=True)
class Verdict:
    """The one line every renderer shows first (analysis/verdict.py, docs/definitions.md)."""

    headline: str
    bottleneck: Bottleneck
    share: float  # of step time; for "none" the compute share
    ranks: list[int]
    basis: VerdictBasis
    # what the traces cannot support (analysis/evidence.py): each sentence withholds the
    # verdict ("unknown") or qualifies it; absent from the JSON when there is none
    limits: list[str] | None = field(default=None, metadata=OMIT_IF_NONE)
    finding: int | None = None  # the index in Diagnosis.findings of the finding it quotes
    # the run was interrupted (Ctrl-C): the rest is the bottleneck of the steps it finished
    interrupted: bool | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class Reading:
    """What gpudiag took the trace to be (analysis/reading): phases, edges, iterations.

    Of the rank the line describes (the one with the largest start-up share, else the
    first): its window, start-up (its items by name and by kind: calls, compilation,
    autotuning, first calls), teardown, the idle head and tail left out, and the
    iterations found and analysed.
    """

    line: str
    rank: int
    window_ns: int
    startup_ns: int
    startup_calls: dict[str, int]
    idle_head_ns: int
    idle_tail_ns: int
    steps_found: int
    steps_analysed: int
    source: str
    holds: dict[str, int]
    startup_dominant: bool = False
    startup_kinds: dict[str, int] = field(default_factory=dict)
    teardown_ns: int = 0
    teardown_calls: dict[str, int] = field(default_factory=dict)
    # a trace of host ranges alone: the four longest names' time and the ranges' span
    ranges: dict[str, int] = field(default_factory=dict)
    ranges_span_ns: int = 0


@dataclass(frozen=True)
class Diagnosis:
    """Everything gpudiag concluded about a run; renderers only format it."""

    run: RunSummary
    ranks: list[RankSummary]
    steps: list[StepBreakdown]
    findings: list[Finding]
    recommendations: list[Recommendation] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    thresholds: JsonObject = field(default_factory=dict)  # Thresholds.as_dict(): the rules
    notes: list[str] = field(default_factory=list)
    gpudiag_version: str = ""
    schema_version: int = SCHEMA_VERSION
    whole_run: WholeRun | None = None
    spread: dict[str, SpreadEntry] = field(default_factory=dict)
    what_if: WhatIf | None = None
    collectives: CollectivesSummary | None = None
    # the one-line verdict every renderer shows first (analysis/verdict.py)
    verdict: Verdict | None = None  # None only for a Diagnosis built by hand
    # the kernels (GPU) or operators (CPU) behind compute, over every rank (analysis/kernels.py)
    kernels: KernelBreakdown | None = None
    # the live alerts `gpudiag run` raised and cleared while the job ran (alerts.jsonl)
    alerts: list[LiveAlert] = field(default_factory=list)
    # every rank's compute efficiency together (analysis/efficiency/measure.py)
    efficiency: ComputeEfficiency | None = None
    # what gpudiag took the trace to be before judging it (analysis/reading)
    reading: Reading | None = None

    def to_json(self) -> JsonObject:
        """The public JSON document (see docs/json-schema.md)."""
        d = asdict(self)
        d["run"]["shares"] = self.run.shares.as_dict()
        for r, rs in zip(d["ranks"], self.ranks, strict=True):
            r["shares"] = rs.shares.as_dict()
            r["evidence"] = rs.evidence.to_json()
        d["what_if"] = without_omitted(self.what_if) if self.what_if else {}
        d["collectives"] = self.collectives.to_json() if self.collectives else {}
        d["verdict"] = without_omitted(self.verdict) if self.verdict else {}
        d["kernels"] = d["kernels"] or {}
        d["efficiency"] = d["efficiency"] or {}
        d["reading"] = d["reading"] or {}
        for fd, f in zip(d["findings"], self.findings, strict=True):
            fd["metrics"] = f.metrics.to_json()
        order = [
            "schema_version",
            "gpudiag_version",
            "inputs",
            "verdict",
            "run",
            "ranks",
            "steps",
            "findings",
            "recommendations",
            "spread",
            "what_if",
            "collectives",
            "kernels",
            "efficiency",
            "reading",
            "whole_run",
            "thresholds",
            "notes",
        ]
        if self.alerts:  # only runs watched live have them
            order.append("alerts")
        return {k: d[k] for k in order}
