"""The string enums of the Diagnosis: kinds, severities, causes, modes and step sources.

They compare equal to, and serialise as, the plain strings of the JSON
(docs/json-schema.md).
"""

from __future__ import annotations

import enum
from typing import Literal


class StrEnum(str, enum.Enum):
    """A string enum (``enum.StrEnum`` is Python ≥ 3.11): compares and prints as its value."""

    def __str__(self) -> str:
        return str(self.value)


class FindingKind(StrEnum):
    """What a finding is about (docs/definitions.md, "Findings")."""

    IDLE_RATIO = "idle_ratio"
    DATA_BOUND = "data_bound"
    COMM_BOUND = "comm_bound"
    HOST_BOUND = "host_bound"
    STRAGGLER = "straggler"
    LOW_BANDWIDTH = "low_bandwidth"
    PIPELINE_BUBBLE = "pipeline_bubble"
    SOURCE_MISSING = "source_missing"
    TRUNCATED_STEP = "truncated_step"
    WARMUP = "warmup"
    JOB_FAILED = "job_failed"
    HANG = "hang"
    COLLECTIVE_MISMATCH = "collective_mismatch"
    COMPUTE_BOUND = "compute_bound"
    BELOW_PEAK = "below_peak"
    LIMITED_EVIDENCE = "limited_evidence"
    STEP_VARIABILITY = "step_variability"
    EXPOSED_COPIES = "exposed_copies"


class Severity(StrEnum):
    """How much a finding matters; findings are sorted most severe first."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def order(self) -> int:
        """0 for errors, 1 for warnings, 2 for information."""
        return (Severity.ERROR, Severity.WARNING, Severity.INFO).index(self)


class Cause(StrEnum):
    """Why a straggler is slow."""

    DATA = "data"
    COMPUTE = "compute"
    HOST = "host"
    HARDWARE = "hardware"
    UNKNOWN = "unknown"


class Mode(StrEnum):
    """What a rank's classification was made from."""

    GPU = "gpu"  # GPU kernels
    CPU = "cpu"  # host threads (no GPU events)
    TELEMETRY = "telemetry"  # gpudiag run's step telemetry alone (no profiler trace)
    MIXED = "mixed"  # the run only: ranks of both modes


class StepSource(StrEnum):
    """Where a rank's step boundaries came from (docs/definitions.md, "Steps")."""

    PROFILER_STEP = "ProfilerStep"  # the profiler's ProfilerStep#N ranges
    MARKER = "marker"  # the user's --step-marker regex
    USER_RANGE = "user_range"  # a repeated user range found automatically
    OPTIMIZER = "optimizer"  # between optimizer steps
    KERNELS = "kernels"  # a repeating sequence of kernel names
    WHOLE = "whole"  # no steps: the whole trace is one
    TELEMETRY = "telemetry"  # gpudiag run's step telemetry

    @property
    def is_marked(self) -> bool:
        """Steps the job itself marked (no note needed on how they were found)."""
        return self in (
            StepSource.PROFILER_STEP,
            StepSource.MARKER,
            StepSource.USER_RANGE,
            StepSource.TELEMETRY,
        )


# The closed sets of words some fields take (typing.Literal: checked by mypy where they are
# made; a saved diagnosis is read back with any string there, as before).
VariabilityPattern = Literal["jitter", "outlier", "stalls", "regime_change", "two_kinds"]
# where a straggler's step times came from: the profiled window or gpudiag run's telemetry
StragglerSource = Literal["trace", "telemetry"]
PipelineSchedule = Literal["gpipe", "1f1b", "unknown"]
# what the compute breakdown times: GPU kernels, or operators on a CPU trace
TimeUnit = Literal["kernel", "operator"]
# what a hang finding was read from
HangEvidence = Literal["flight recorder", "stacks"]
# what a trace cannot support (analysis/rank/evidence.py) and what that does to the verdict
LimitKind = Literal[
    "sampled",
    "filtered",
    "no_gpu_activity",
    "no_kernels",
    "comm_only",
    "clock",
    "short",
    "unlinked",
]
LimitEffect = Literal["withhold", "qualify"]
# why a GPU rank has no compute efficiency (analysis/efficiency/measure.efficiency_gap)
EfficiencyGap = Literal["no_shapes", "no_device", "unmodelled"]
# what the verdict names as the run's bottleneck (analysis/verdict.py, docs/definitions.md)
Bottleneck = Literal[
    "data",
    "communication",
    "straggler",
    "pipeline",
    "host",
    "copy",
    "variability",
    "none",
    "unknown",
    "hang",
    "mismatch",
    "failure",
    "interrupted",
]
# what the verdict's numbers are over: the profiled window, or gpudiag run's telemetry
VerdictBasis = Literal["profiled window", "whole run"]
# how collectives were matched across ranks
MatchMethod = Literal["comms_id", "order", "none"]
