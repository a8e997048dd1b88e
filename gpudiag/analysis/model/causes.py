"""The host-side cause a finding names, typed: its kind, its words, and the figures behind it.

analysis/findings/causes.py decides the cause of a host-bound finding (``HostMetrics.cause``);
analysis/findings/variability.py names the class of runtime calls that fills slow steps
(``VariabilityMetrics.cause`` and ``blocking_call``) with the same record. Each cause kind
sets its own fields; the others stay ``None`` and are absent from the JSON, whose keys come
in the declaration order below (docs/json-schema.md, "host_bound").
"""

from typing import Literal, TypedDict

from gpudiag._support.records import asdict, dataclass

# the causes, in the order analysis/findings/causes.py tries them ("unknown": none held)
HostCauseKind = Literal[
    "copies", "sync", "allocator", "copy", "jit", "launch", "eager", "python", "unknown"
]
# the classes of runtime calls a cause may be (analysis/rank/hostcause.py), launches aside
CallClass = Literal["sync", "allocator", "copy", "jit"]
CALL_CLASSES: tuple[CallClass, ...] = ("sync", "allocator", "copy", "jit")


@dataclass(frozen=True)
class CallSite:
    """A Python function the host is in while nothing else runs: its self time and calls."""

    name: str
    ns_per_step: int
    calls_per_step: int


@dataclass(frozen=True)
class HostCause:
    """A host-side cause; ``text`` names the call or activity, its time and the steps."""

    # GPU traces' host-bound causes: CUDA graphs already launched, and the "other" time
    graphs_launched: bool | None = None
    other_ns_per_step: int | None = None
    kind: HostCauseKind = "unknown"
    label: str = ""
    text: str = ""
    api: str | None = None  # a class of calls: its most frequent API
    capture: str | None = None  # a cause the trace does not show: what to capture to see it
    share: float | None = None  # of the "other" time
    pageable: bool | None = None  # copies: in pageable memory
    kernels_per_step: float | None = None  # launch-bound: kernels a step, …
    kernel_ns_median: int | None = None  # … and their median duration
    # the cause's own time a step, and as a share of step time (what a remedy may gain)
    ns_per_step: int | None = None
    step_share: float | None = None
    steps: list[int] | None = None  # a class of calls: the steps it is in
    longest_ns: int | None = None  # its longest call
    calls_per_step: int | None = None  # blocking copies: calls a step, …
    bytes_median: int | None = None  # … and their median size (-1: unknown)
    # a blocking class (sync, copy): what the GPU ran while its calls blocked (shares)
    waits_for: dict[str, float] | None = None
    # Python: the innermost Python frames holding its time (trace with python_function) …
    call_sites: list[CallSite] | None = None
    # … and of its time a step, the part before the step's first graph launch
    before_graph_ns_per_step: int | None = None

    def to_json(self) -> dict[str, object]:
        """The JSON object: the fields this cause sets (those not ``None``)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


class KernelsGrew(TypedDict):
    """Kernels a slow step and usually, and those whose time grew (name → ns more a step)."""

    count_slow: float
    count_usual: float
    grew: dict[str, int]
