"""The string enums of the Diagnosis: kinds, severities, causes, modes and step sources.

They compare equal to, and serialise as, the plain strings of the JSON
(docs/json-schema.md).
"""

from __future__ import annotations

import enum


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
