"""The numbers behind each finding: one frozen dataclass per finding kind (``Finding.metrics``).

A kind's metrics class names the kinds it serves in ``kinds``; defining the class
registers it (:data:`BY_KIND`), which is all a new finding kind needs to be written to
JSON and read back. ``to_json`` gives the fields in declaration order, leaving out those
declared with :data:`OMIT_IF_NONE` while they are ``None``; the JSON is the one
docs/json-schema.md documents. ``share`` and ``mean_share`` are the share of step time a
finding is about (its largest and mean per-rank value), which the verdict ranks by.
"""

from dataclasses import field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypedDict

from gpudiag._support.records import asdict, dataclass
from gpudiag.analysis.model.causes import HostCause, KernelsGrew
from gpudiag.analysis.model.efficiency import Opportunity
from gpudiag.analysis.model.kinds import (
    FindingKind,
    HangEvidence,
    LimitEffect,
    LimitKind,
    PipelineSchedule,
    StragglerSource,
    TimeUnit,
    VariabilityPattern,
)

_OMIT = "omit_if_none"
# field metadata: the field is left out of the JSON while it is ``None`` (absent, not null)
OMIT_IF_NONE = MappingProxyType({_OMIT: True})


# A JSON value as ``json.dumps`` writes it, and a JSON object: what ``to_json`` methods give
# and free-form sections hold. At run time any value (a saved diagnosis reads them as they are).
if TYPE_CHECKING:
    JsonValue: TypeAlias = (
        "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
    )
else:
    JsonValue = Any
JsonObject: TypeAlias = dict[str, JsonValue]


def without_omitted(obj: Any) -> JsonObject:
    """A dataclass as a JSON object, less its :data:`OMIT_IF_NONE` fields that are None."""
    omit = {f.name for f in fields(obj) if f.metadata.get(_OMIT)}
    d = asdict(obj)
    for f in fields(obj):
        if isinstance(v := getattr(obj, f.name), HostCause):
            d[f.name] = v.to_json()  # the fields its kind sets
    return {k: v for k, v in d.items() if not (v is None and k in omit)}


BY_KIND: "dict[FindingKind, list[type[FindingMetrics]]]" = {}


@dataclass(frozen=True)
class FindingMetrics:
    """The base of every kind's metrics; on its own, a finding without numbers."""

    kinds: ClassVar[tuple[FindingKind, ...]] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for k in cls.__dict__.get("kinds", ()):
            BY_KIND.setdefault(k, []).append(cls)

    def to_json(self) -> JsonObject:
        """The ``metrics`` object of the JSON finding."""
        return without_omitted(self)

    def share(self) -> float:
        """The share of step time the finding is about: its largest per-rank value."""
        return 0.0

    def mean_share(self) -> float:
        """The mean per-rank share of step time (``share`` when there is one value)."""
        return self.share()


@dataclass(frozen=True)
class NoMetrics(FindingMetrics):
    """A finding whose message says it all (``truncated_step``)."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.TRUNCATED_STEP,)


@dataclass(frozen=True)
class ShareMetrics(FindingMetrics):
    """A share of step time over a threshold: each flagged rank's value (``host_bound``)."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.HOST_BOUND,)

    per_rank: dict[str, float]  # rank (a JSON key: a string) → its share
    threshold: float

    def share(self) -> float:  # noqa: D102
        return max(self.per_rank.values(), default=0.0)

    def mean_share(self) -> float:  # noqa: D102
        vals = list(self.per_rank.values())
        return sum(vals) / len(vals) if vals else self.share()


@dataclass(frozen=True)
class IdleMetrics(ShareMetrics):
    """``idle_ratio``: 1 − compute / step time; ``source`` is ``nvml`` without a trace."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.IDLE_RATIO,)

    source: str | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class DataBoundMetrics(ShareMetrics):
    """``data_bound``: the data-wait share, and the host range the ranks waited in."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.DATA_BOUND,)

    data_range: str | None = None


@dataclass(frozen=True)
class CommBoundMetrics(ShareMetrics):
    """``comm_bound``: the exposed comm-wait share, how much of it was hidden, and synced."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.COMM_BOUND,)

    comm_hidden_ratio: dict[str, float | None] = field(default_factory=dict)
    # of the wait, the share spent waiting for a slower rank (matched collectives)
    sync_wait_share: float | None = field(default=None, metadata=OMIT_IF_NONE)
    # of the ranks' communication time, the share in point-to-point operations (send,
    # recv, MPI_Sendrecv …); None when the trace does not say
    p2p_share: float | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class HostMetrics(ShareMetrics):
    """``host_bound``: the share, and the host-side cause (causes.py; CPU traces: unknown only)."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.HOST_BOUND,)

    cause: HostCause = field(default_factory=HostCause)


@dataclass(frozen=True)
class ExposedCopiesMetrics(ShareMetrics):
    """``exposed_copies``: host-device copies with nothing beside them, and their memory."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.EXPOSED_COPIES,)

    pageable: bool = False


@dataclass(frozen=True)
class VariabilityMetrics(FindingMetrics):
    """``step_variability``: how the job's step times spread, and what fills slow steps."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.STEP_VARIABILITY,)

    pattern: VariabilityPattern
    median_ns: int
    p90_ns: int
    min_ns: int
    max_ns: int
    p90_median_ratio: float
    p90_p10_ratio: float
    steps_ns: dict[str, int]
    excess_share: float  # of the window, the slow steps' time above the median
    change_at_step: int | None = field(default=None, metadata=OMIT_IF_NONE)
    regime_ratio: float | None = field(default=None, metadata=OMIT_IF_NONE)
    median_before_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    median_after_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    cause: HostCause | None = field(default=None, metadata=OMIT_IF_NONE)
    # otherwise the part of the step that grows in the slow steps ("data_wait", …)
    grows: str | None = field(default=None, metadata=OMIT_IF_NONE)
    # compute grows: kernels a slow step and usually, and those whose time grew (ns more)
    kernels: KernelsGrew | None = field(default=None, metadata=OMIT_IF_NONE)
    # a blocking call that waits for the GPU work in the slow steps (a note, not the cause)
    blocking_call: HostCause | None = field(default=None, metadata=OMIT_IF_NONE)
    # two kinds of step (analysis/modes.py): each kind's steps, median_ns, min_ns, max_ns
    modes: list[dict[str, int]] | None = field(default=None, metadata=OMIT_IF_NONE)

    def share(self) -> float:  # noqa: D102
        return self.excess_share


@dataclass(frozen=True)
class StragglerMetrics(FindingMetrics):
    """A straggler from the step-time rule (profiled window or step telemetry)."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.STRAGGLER,)

    source: StragglerSource
    wait_attribution: str
    score: float
    median_excess_ns: int
    median_excess_ratio: float
    slow_steps: int
    steps_compared: int
    excess_by_part_ns: dict[str, int]
    also: list[str]
    step_time_ns_median: int
    step_time_ns_if_median_speed: int  # the mean step were it as fast as the others
    short_window: bool
    # the mean step now, the base of the cost (step_time_ns_mean − …_if_median_speed) that
    # the message, the verdict, the what-if and the remedy quote (analysis/stragglers.py)
    step_time_ns_mean: int | None = field(default=None, metadata=OMIT_IF_NONE)
    # the run's recorded host CPU contention that likely explains it (other_cpu_ratio,
    # steal_ratio over the gate's limits): absent on a quiet or unrecorded host
    host_contention: dict[str, float] | None = field(default=None, metadata=OMIT_IF_NONE)
    # a persistent straggler's blame evidence (docs/definitions.md, "Who is to blame"): the
    # share of compared steps in which another rank was slow (the excess moving between
    # ranks), and the robust spread (MAD × 1.4826) of its excess over the compared steps ÷ median
    moved_steps_ratio: float | None = field(default=None, metadata=OMIT_IF_NONE)
    excess_spread_ratio: float | None = field(default=None, metadata=OMIT_IF_NONE)
    # on a busy host with the contention recorded over time: whether the excess follows it
    # (``rho``: Spearman's, ``range``: the contention's p90 − p10, ``steps``: how many)
    contention_follow: dict[str, float] | None = field(default=None, metadata=OMIT_IF_NONE)

    def share(self) -> float:  # noqa: D102
        return self.median_excess_ratio

    def cost_ratio(self) -> float:
        """What it costs the mean step (the what-if's straggler at median speed), over it."""
        if not self.step_time_ns_mean:
            return self.median_excess_ratio  # a file written before the cost was recorded
        return (self.step_time_ns_mean - self.step_time_ns_if_median_speed) / self.step_time_ns_mean


@dataclass(frozen=True)
class LateArrivalMetrics(FindingMetrics):
    """A straggler from matched collectives: the rank the others wait for (late arrival)."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.STRAGGLER,)

    source: str  # "late_arrival"
    last_at: int
    collectives_matched: int
    next_rank_last_at: int
    wait_share: float
    waited_ns_per_step: int
    median_excess_ns: int
    excess_by_part_ns: dict[str, int]
    steps_compared: int
    step_time_ns_median: int
    host_contention: dict[str, float] | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class BandwidthMetrics(FindingMetrics):
    """``low_bandwidth``: one collective type and size bucket against the link's peak."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.LOW_BANDWIDTH,)

    type: str
    size_bucket: str
    count: int
    bytes_median: int | None
    busbw_gbps: float
    peak_gbps: float
    efficiency: float
    transfer_ns_median: int | None = field(default=None, metadata=OMIT_IF_NONE)  # a call's
    link: str | None = field(default=None, metadata=OMIT_IF_NONE)
    likely_cause: str | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class PipelineSummary(FindingMetrics):
    """Pipeline stages found from point-to-point traffic and their bubble.

    The ``collectives.pipeline`` section, and the ``pipeline_bubble`` finding's metrics.
    """

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.PIPELINE_BUBBLE,)

    stages: int
    stage_ranks: list[int]
    micro_batches: int
    bubble_ratio: float
    ideal_bubble_ratio: float
    bubble_ratio_at_target: float
    target_micro_batches: int
    stage_compute_ratio: dict[str, float]
    schedule: PipelineSchedule = "unknown"
    stage_bubble_ratio: dict[str, float] = field(default_factory=dict)

    def share(self) -> float:
        """The measured bubble, or the schedule's (which counts end-of-step drain)."""
        return max(self.bubble_ratio, self.ideal_bubble_ratio)


@dataclass(frozen=True)
class ComputeMetrics(FindingMetrics):
    """``compute_bound``: compute's share and the kernel families behind it."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.COMPUTE_BOUND,)

    compute_share: float
    threshold: float
    unit: TimeUnit
    families: dict[str, float]
    fusable_share: float
    gemm_share: float
    fp32_gemm_share: float
    top: list[str]
    matrix_share: float = 0.0  # GEMM + convolution + attention, of compute
    fp32_matrix_share: float = 0.0  # of their time, in full fp32


@dataclass(frozen=True)
class BelowPeakMetrics(FindingMetrics):
    """``below_peak``: the remedies whose time above the device's peak is worth a remedy."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.BELOW_PEAK,)

    device: str
    peak_model: str
    step_ns: int  # the run's median step: the base of min_gain_share and of each share
    min_gain_share: float
    opportunities: list[Opportunity]

    def share(self) -> float:
        """The largest opportunity's gain over the step."""
        return max((o.gain_ns for o in self.opportunities), default=0) / max(self.step_ns, 1)


@dataclass(frozen=True)
class SourceMissingMetrics(FindingMetrics):
    """``source_missing``: what the inputs lack (steps, gpu_events, ranks, a capture source)."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.SOURCE_MISSING,)

    missing: str
    world_size: int | None = field(default=None, metadata=OMIT_IF_NONE)
    reason: str | None = field(default=None, metadata=OMIT_IF_NONE)


@dataclass(frozen=True)
class WarmupMetrics(FindingMetrics):
    """``warmup``: each warm-up step's duration and the steady median after them."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.WARMUP,)

    duration_ns: dict[str, int]
    steady_median_ns: int


class OtherFailure(TypedDict):
    """A rank that failed after the first: how, its error line, the step it was in."""

    rank: int
    how: str
    error: str
    step: int


@dataclass(frozen=True)
class JobFailedMetrics(FindingMetrics):
    """``job_failed``: the job's exit code and, from the ranks' ends, who failed first.

    The fields after ``exit_code`` are absent from the JSON when the run directory does
    not tell (a bare non-zero exit code); see docs/definitions.md, "Failed runs".
    """

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.JOB_FAILED,)

    exit_code: int | None
    interrupted: bool | None = field(default=None, metadata=OMIT_IF_NONE)
    first_rank: int | None = field(default=None, metadata=OMIT_IF_NONE)
    step: int | None = field(default=None, metadata=OMIT_IF_NONE)
    how: str | None = field(default=None, metadata=OMIT_IF_NONE)
    error: str | None = field(default=None, metadata=OMIT_IF_NONE)
    where: str | None = field(default=None, metadata=OMIT_IF_NONE)
    collective: str | None = field(default=None, metadata=OMIT_IF_NONE)
    others: list[OtherFailure] | None = field(default=None, metadata=OMIT_IF_NONE)
    # a timeout or lost peer first: the ranks it waited for, and on what evidence
    waited_for: list[int] | None = field(default=None, metadata=OMIT_IF_NONE)
    waited_for_evidence: str | None = field(default=None, metadata=OMIT_IF_NONE)
    # a collective mismatch the first error line spells out (analysis/failure.py)
    mismatch: str | None = field(default=None, metadata=OMIT_IF_NONE)


class HangFrame(TypedDict):
    """One frame of a culprit rank's own code (innermost first)."""

    name: str
    filename: str
    line: int


class HangEffect(TypedDict):
    """A stall this root explains: its collective's label and the ranks waiting in it."""

    op: str
    waiting_ranks: list[int]


class RankMismatch(TypedDict):
    """A rank that disagrees with the others on a collective's field, and the two values."""

    rank: int
    field: str  # "op", "input_sizes", "output_sizes", "dtypes"
    expected: str
    found: str


@dataclass(frozen=True)
class HangMetrics(FindingMetrics):
    """``hang``: the first collective of a process group not every member finished.

    ``where`` maps each culprit rank (a JSON key) to the innermost frames of its own code
    (``name``, ``filename``, ``line``); docs/definitions.md, "Hangs".
    """

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.HANG,)

    op: str
    process_group: dict[str, str]  # name, desc
    seq: int | None
    sizes: list[list[int]]  # the input sizes of the lowest rank that entered it
    dtypes: list[str] | None  # its input dtypes (None: the dump's version has none)
    waiting_ranks: list[int]
    waited_ns: int | None  # the longest wait (None: the dump's time is unknown)
    waited_ns_per_rank: dict[str, int | None]  # waiting rank (a JSON key) → its wait
    never_entered: list[int]
    unknown_ranks: list[int]
    members: list[int]
    where: dict[str, list[HangFrame]]
    step: int | None
    explained_by: str | None
    incomplete: bool
    evidence: HangEvidence
    # the stalls this root explains: [{"op": label, "waiting_ranks": [...]}], earliest first
    effects: list[HangEffect] = field(default_factory=list)


@dataclass(frozen=True)
class CollectiveMismatchMetrics(HangMetrics):
    """``collective_mismatch``: as ``hang``, plus each disagreeing rank's field and values."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.COLLECTIVE_MISMATCH,)

    mismatches: list[RankMismatch] = field(default_factory=list)


@dataclass(frozen=True)
class LimitedEvidenceMetrics(FindingMetrics):
    """``limited_evidence``: what the trace cannot support, and whether it withholds the split."""

    kinds: ClassVar[tuple[FindingKind, ...]] = (FindingKind.LIMITED_EVIDENCE,)

    limit: LimitKind
    effect: LimitEffect


@dataclass(frozen=True)
class SavedMetrics(FindingMetrics):
    """Metrics read back from a saved diagnosis in a shape this version does not define."""

    values: JsonObject = field(default_factory=dict)  # free-form: whatever the file held

    def to_json(self) -> JsonObject:  # noqa: D102
        return dict(self.values)
