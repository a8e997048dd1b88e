"""The shapes of a rank's evidence parts (``RankEvidence``'s nested JSON objects).

Most are JSON objects in the output and plain dicts at run time (a saved diagnosis reads
them back as they are), so each is a :class:`~typing.TypedDict`: the keys and value types
are checked by mypy where the per-rank analysis writes them and where rules read them.
The reading is a frozen dataclass (its rules read attributes).
The keys of a ``total=False`` TypedDict (over a base holding the keys always there) are
absent from the JSON when the trace does not tell (Python 3.10 has no ``NotRequired``).
docs/json-schema.md describes each; tests/unit/api/test_schema_fields.py checks them
against gpudiag/schema/diagnosis.schema.json.
"""

from dataclasses import field
from typing import TypedDict

from gpudiag._support.records import dataclass
from gpudiag.analysis.model.metrics import OMIT_IF_NONE, JsonObject, without_omitted


class _CoverageCounts(TypedDict):
    """The counts every rank's coverage has."""

    steps: int
    step_ns: int
    gpu_ops: int
    gpu_ops_in_steps: int
    compute_kernels: int
    comm_kernels: int
    gpu_ops_linked: int


class Coverage(_CoverageCounts, total=False):
    """What one rank's trace holds, for the evidence limits (analysis/rank/evidence.py)."""

    # kernel-launch calls, those with no GPU op linked, kernels without a launching call
    launch_calls: int
    launch_calls_empty: int
    kernels_unlinked: int
    # host operators' ids present, their span and the holes between them (sampling)
    host_op_ids: int
    host_op_id_span: int
    host_op_id_holes: int
    clock_unreliable: bool
    clock_shift_ns: dict[str, int]  # GPU device → shift applied
    # GPU activity without a kernel: its copies and memsets
    copies: int
    memsets: int
    # no GPU activity: what says it was a GPU job, and the host work in the steps
    gpu_signs: list[str]
    host_ops_in_steps: int
    step_thread_ops_in_steps: int


class WorkloadTag(TypedDict):
    """One workload tag (analysis/rank/workload.py): intervals matched, up to three names."""

    count: int
    names: list[str]


class DeviceFormats(TypedDict):
    """The GPUs' generation and matrix-unit formats (analysis/rank/devices.py, Capability)."""

    vendor: str
    generation: str
    fp16: bool
    bf16: bool
    tf32: bool
    fp8: bool
    fp4: bool
    basis: str


class _HostApiTimes(TypedDict):
    """The times and calls of every class of runtime calls."""

    ns: int  # with the GPU neither computing nor communicating …
    ns_per_step: list[int]
    gpu_busy_ns: int  # … and the rest
    gpu_busy_ns_per_step: list[int]
    steps: list[int]
    calls: int
    api: str  # the call that took most of the time …
    apis: list[str]  # … and the top two
    longest_ns: int
    longest_step: int | None


class HostApiEntry(_HostApiTimes, total=False):
    """One class of runtime calls on the operator threads (analysis/rank/hostcause.py)."""

    longest_op: str  # the operator around the longest call
    # sync and copy: the shares of their time with compute, a collective, a copy, nothing
    waits_for: dict[str, float]
    bytes_median: int  # copy: the median size of the copies (-1: unknown)


class HostOps(TypedDict):
    """Per step, the operator threads' time inside and between operators (hostcause.py)."""

    steps: list[int]
    threads: int
    training_ns_per_step: list[int]
    other_threads_ns_per_step: list[int]
    in_ops_idle_ns_per_step: list[int]
    between_ns_per_step: list[int]
    between_idle_ns_per_step: list[int]
    launch_ns_per_step: list[int]


class PythonSite(TypedDict):
    """One Python function's innermost-frame time with no operator open and the GPU idle."""

    name: str
    ns_per_step: list[int]
    calls_per_step: list[int]  # its calls starting in each step


class _PythonTime(TypedDict):
    """The keys of :class:`PythonSites` always there."""

    steps: list[int]
    ns_per_step: list[int]
    sites: list[PythonSite]


class PythonSites(_PythonTime, total=False):
    """Per step, where the training thread's Python time with the GPU idle goes (hostcause.py).

    ``ns_per_step``: the between-operator, GPU-idle time with a Python frame open on the
    training thread; ``before_graph_ns_per_step``: the between-operator, GPU-idle time
    before the step's first graph launch (-1: the step launches none; absent: no step
    does); ``sites``: the innermost frames that hold the most of it.
    """

    before_graph_ns_per_step: list[int]


class KernelsByStep(TypedDict):
    """Per step, the kernel count and the compute kernels whose time varies most (name → ns)."""

    steps: list[int]
    count: list[int]
    ns: dict[str, list[int]]


class CopiesAlone(TypedDict):
    """Per step, host-device copy time with no compute, communication or data wait beside it."""

    steps: list[int]
    ns_per_step: list[int]


@dataclass(frozen=True)
class RankReading:
    """What one rank's trace was taken to be (analysis/reading/phases.py).

    Fields that do not apply are ``None`` and absent from the JSON.
    """

    steps_found: int
    source: str
    range: str | None = field(default=None, metadata=OMIT_IF_NONE)  # the steps' user range
    gpu_in_steps_ratio: float | None = field(default=None, metadata=OMIT_IF_NONE)
    # why found steps were not taken as iterations
    refused: str | None = field(default=None, metadata=OMIT_IF_NONE)
    window_ns: int = 0
    startup_ns: int = 0
    # call name → start-up time (the four longest), and where start-up ends
    startup_calls: dict[str, int] | None = field(default=None, metadata=OMIT_IF_NONE)
    # start-up by kind (calls, compilation, autotuning, first calls) → time
    startup_kinds: dict[str, int] | None = field(default=None, metadata=OMIT_IF_NONE)
    startup_end_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    # one-off calls after the last GPU work, left out of the idle tail
    teardown_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    teardown_calls: dict[str, int] | None = field(default=None, metadata=OMIT_IF_NONE)
    # start-up inside one window cut out of it (analysis/reading/excise.py)
    startup_cut_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    steps_in_startup: int | None = field(default=None, metadata=OMIT_IF_NONE)
    idle_head_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    idle_tail_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)
    holds: dict[str, int] = field(default_factory=dict)  # kernels, copies, memsets …
    # a trace of host ranges alone: each range name's time, and the ranges' span
    ranges_by_name: dict[str, int] | None = field(default=None, metadata=OMIT_IF_NONE)
    ranges_span_ns: int | None = field(default=None, metadata=OMIT_IF_NONE)

    def to_json(self) -> JsonObject:
        """The ``reading`` object of a rank's JSON evidence (no nulls)."""
        return without_omitted(self)
