"""The Diagnosis and the frozen dataclasses it is made of; JSON round-trip with ``schema_version``.

This is the contract between analysis and every renderer, and (as JSON) with users'
scripts and CI systems. docs/json-schema.md documents it and
``gpudiag/schema/diagnosis.schema.json`` checks it; bump :data:`SCHEMA_VERSION` on any
incompatible change. Kinds, severities, causes and modes are string enums: they compare
equal to, and serialise as, the plain strings of the JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

SCHEMA_VERSION = 1
SHARE_KEYS = ("compute", "comm_wait", "data_wait", "other")


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
    COMPUTE_BOUND = "compute_bound"


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

    @property
    def idle_ratio(self) -> float:
        """1 − compute / step time."""
        return 1.0 - self.compute_ns / self.duration_ns if self.duration_ns else 0.0


def by_rank(steps: Iterable[Any]) -> dict[int, list[Any]]:
    """Steps (anything with ``rank``) grouped by rank in one pass, order kept."""
    out: dict[int, list[Any]] = {}
    for s in steps:
        out.setdefault(s.rank, []).append(s)
    return out


@dataclass(frozen=True)
class Shares:
    """Fractions of step time; they sum to 1."""

    compute: float
    comm_wait: float
    data_wait: float
    other: float

    def as_dict(self) -> dict[str, float]:
        """Plain dict for JSON."""
        return {k: getattr(self, k) for k in SHARE_KEYS}


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
    step_source: str  # "ProfilerStep", "marker", "user_range", "optimizer", "whole"
    source: str
    devices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)


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


@dataclass(frozen=True)
class Finding:
    """Something worth a user's attention, with the numbers that triggered it."""

    kind: FindingKind
    severity: Severity
    message: str
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    # stragglers only: why the rank is slow, whether it is slow in most steps, and the
    # total time the other ranks spent waiting for it
    cause: Cause | None = None
    persistent: bool | None = None
    wait_caused_ns: int | None = None


@dataclass(frozen=True)
class Recommendation:
    """A remedy, the finding it answers and the evidence for it."""

    id: str
    title: str
    detail: str
    finding: FindingKind
    evidence: dict[str, Any] = field(default_factory=dict)
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
class WhatIf:
    """First-order step times under three changes (analysis/advice.py states the model)."""

    step_time_ns: int
    if_comm_overlapped_ns: int
    if_no_data_wait_ns: int
    if_straggler_at_median_speed_ns: int | None = None
    if_all_ns: int | None = None  # the three changes together


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


@dataclass(frozen=True)
class RankSync:
    """One rank's time in matched collectives: waiting for the last rank, and transferring."""

    sync_wait_ns: int
    transfer_ns: int


@dataclass(frozen=True)
class LateArrival:
    """How often a rank was the last to reach a matched collective, and what it cost."""

    last: int  # matched collectives at which it arrived last (the others waited for it)
    waited_ns: int  # the other ranks' synchronisation wait at those collectives, summed
    waited_ns_min: int  # per collective, the others' mean wait: smallest …
    waited_ns_max: int  # … and largest


@dataclass(frozen=True)
class PipelineSummary:
    """Pipeline stages found from point-to-point traffic and their bubble."""

    stages: int
    stage_ranks: list[int]
    micro_batches: int
    bubble_ratio: float
    ideal_bubble_ratio: float
    bubble_ratio_at_target: float
    target_micro_batches: int
    stage_compute_ratio: dict[str, float]
    schedule: str = "unknown"  # "gpipe", "1f1b", "unknown"
    stage_bubble_ratio: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectivesSummary:
    """Collectives matched across ranks: transfer vs synchronisation, bandwidth per bucket."""

    method: str  # "comms_id", "order", "none"
    matched: int
    bandwidth_is_lower_bound: bool
    by_type: list[CollectiveRow]
    per_rank: dict[str, RankSync] = field(default_factory=dict)
    pipeline: PipelineSummary | None = None
    late_arrival: dict[str, LateArrival] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON section; ``pipeline`` only when stages were found."""
        d = asdict(self)
        if self.pipeline is None:
            del d["pipeline"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CollectivesSummary | None:
        """The section of a saved Diagnosis; None for ``{}``."""
        if not d:
            return None
        out: CollectivesSummary = _typed(cls, d, "collectives")
        return out


@dataclass(frozen=True)
class RunStep:
    """One step of one rank from ``gpudiag run``'s always-on telemetry.

    Every step, not only the profiled ones. Waits are ``None`` where not measured.
    """

    rank: int
    step: int
    start_ns: int
    duration_ns: int
    data_wait_ns: int | None
    comm_wait_ns: int | None
    backward_ns: int | None
    profiled: bool


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
class WholeRun:
    """What a run directory adds to the profiled window: every step, and the GPUs' samples."""

    ranks: list[WholeRunRank]
    steps: list[RunStep]
    gpus: list[GpuStats] = field(default_factory=list)
    job_exit_code: int | None = None


@dataclass(frozen=True)
class Diagnosis:
    """Everything gpudiag concluded about a run; renderers only format it."""

    run: RunSummary
    ranks: list[RankSummary]
    steps: list[StepBreakdown]
    findings: list[Finding]
    recommendations: list[Recommendation] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    gpudiag_version: str = ""
    schema_version: int = SCHEMA_VERSION
    whole_run: WholeRun | None = None
    spread: dict[str, SpreadEntry] = field(default_factory=dict)
    what_if: WhatIf | None = None
    collectives: CollectivesSummary | None = None
    # the one-line verdict every renderer shows first (analysis/verdict.py)
    verdict: dict[str, Any] = field(default_factory=dict)
    # the kernels (GPU) or operators (CPU) behind compute, over every rank (analysis/kernels.py)
    kernels: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The public JSON document (see docs/json-schema.md)."""
        d = asdict(self)
        d["run"]["shares"] = self.run.shares.as_dict()
        for r, rs in zip(d["ranks"], self.ranks, strict=True):
            r["shares"] = rs.shares.as_dict()
        d["what_if"] = d["what_if"] or {}
        d["collectives"] = self.collectives.to_json() if self.collectives else {}
        order = ["schema_version", "gpudiag_version", "inputs", "verdict", "run", "ranks",
                 "steps", "findings", "recommendations", "spread", "what_if", "collectives",
                 "kernels", "whole_run", "thresholds", "notes"]  # fmt: skip
        return {k: d[k] for k in order}

    @classmethod
    def from_json(cls, d: Any) -> Diagnosis:
        """Rebuild a Diagnosis from :meth:`to_json` output (e.g. a saved baseline).

        The document is checked against ``gpudiag/schema/diagnosis.schema.json`` and every
        field against its type here; ValueError names the first bad field by its JSON path
        (``steps[3].rank: expected an integer, got a string``).
        """
        version = d.get("schema_version") if isinstance(d, dict) else None
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            raise ValueError(
                f"diagnosis schema {version} is newer than this gpudiag "
                f"understands ({SCHEMA_VERSION})"
            )
        problem = schema_problem(d)
        if problem:
            raise ValueError(problem)
        kw = {k: d[k] for k in ("run", "ranks", "steps", "findings", "recommendations",
                                "inputs", "thresholds", "notes", "gpudiag_version",
                                "schema_version", "spread", "whole_run", "verdict", "kernels")
              if k in d}  # fmt: skip
        if d.get("what_if"):
            kw["what_if"] = d["what_if"]
        if d.get("collectives"):
            kw["collectives"] = d["collectives"]
        if not kw.get("whole_run"):
            kw.pop("whole_run", None)
        out: Diagnosis = _typed(cls, kw, "")
        for i, r in enumerate(out.ranks):
            _check_evidence(r.evidence, f"ranks[{i}].evidence")
        for i, f in enumerate(out.findings):
            t = f.metrics.get("threshold")
            if "threshold" in f.metrics and not _is_number(t):
                raise ValueError(f"findings[{i}].metrics.threshold: expected a number, got "
                                 f"{_json_words(t)}")  # fmt: skip
        if not out.verdict:  # saved before the verdict existed: derive it as analysis would
            from gpudiag.analysis.verdict import verdict as make_verdict

            out = dataclasses.replace(out, verdict=make_verdict(out.run, out.findings))
        return out

    def steps_frame(self) -> Any:
        """One row per (rank, step) as a pandas DataFrame, with ``idle_ratio`` and the shares."""
        import pandas as pd

        cols = ["rank", "step", "start_ns", "duration_ns", "compute_ns", "comm_wait_ns",
                "data_wait_ns", "other_ns", "comm_overlapped_ns", "gpu_ops"]  # fmt: skip
        df = pd.DataFrame([asdict(s) for s in self.steps], columns=cols)
        df["gpu_ops"] = df["gpu_ops"].astype("Int64")
        dur = df["duration_ns"].where(df["duration_ns"] > 0)
        df["idle_ratio"] = 1.0 - df["compute_ns"] / dur
        return df

    def findings_frame(self) -> Any:
        """One row per finding as a pandas DataFrame: kind, severity, message, ranks, steps."""
        import pandas as pd

        cols = ["kind", "severity", "message", "ranks", "steps", "cause", "persistent",
                "wait_caused_ns", "metrics"]  # fmt: skip
        rows = [{**asdict(f), "kind": str(f.kind), "severity": str(f.severity),
                 "cause": None if f.cause is None else str(f.cause)}
                for f in self.findings]  # fmt: skip
        df = pd.DataFrame(rows, columns=cols)
        df["wait_caused_ns"] = df["wait_caused_ns"].astype("Int64")
        return df

    def to_markdown(self) -> str:
        """The Markdown report (``gpudiag analyze … --format markdown``) as a string."""
        import io

        from gpudiag.report.markdown import render

        buf = io.StringIO()
        render(self, buf)
        return buf.getvalue()


# ---- reading a saved Diagnosis back: the JSON schema (the subset of JSON Schema that
# diagnosis.schema.json uses), then each field against its dataclass type


@functools.lru_cache(maxsize=1)
def diagnosis_schema() -> dict[str, Any]:
    """The checked-in JSON Schema of a Diagnosis document."""
    text = resources.files("gpudiag").joinpath("schema/diagnosis.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_problem(doc: Any, schema: dict[str, Any] | None = None) -> str | None:
    """The first way ``doc`` breaks the Diagnosis schema, as ``path: problem``; None if none.

    Supports what the schema uses: ``type`` (one or a list), ``const``, ``enum``,
    ``minimum``, ``maximum``, ``properties``, ``required``, ``additionalProperties``
    (false or a schema), ``items`` and local ``$ref``. Numbers must be finite.
    """
    root = schema or diagnosis_schema()
    try:
        _check(doc, root, "", root)
    except _SchemaError as e:
        return str(e)
    return None


class _SchemaError(ValueError):
    pass


_TYPE_WORDS = {"null": "null", "boolean": "a boolean", "integer": "an integer",
               "number": "a number", "string": "a string", "array": "a list",
               "object": "an object"}  # fmt: skip


def _json_words(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number" if math.isfinite(v) else f"{v} (not a finite number)"
    if isinstance(v, str):
        return "a string"
    return "a list" if isinstance(v, list) else "an object"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_type(v: Any, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return _is_number(v)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    return t == "object" and isinstance(v, dict)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _check(v: Any, s: dict[str, Any], path: str, root: dict[str, Any]) -> None:
    where = path or "the document"
    if "$ref" in s:
        target: Any = root
        for part in str(s["$ref"]).lstrip("#/").split("/"):
            target = target[part]
        s = target
    if "const" in s and not _same(v, s["const"]):
        raise _SchemaError(f"{where}: expected {json.dumps(s['const'])}, got {_json_words(v)}")
    if "enum" in s and not any(_same(v, e) for e in s["enum"]):
        shown = json.dumps(v)[:60] if isinstance(v, (str, int, float)) else _json_words(v)
        raise _SchemaError(f"{where}: {shown} is not one of {json.dumps(s['enum'])}")
    if "type" in s:
        kinds = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_is_type(v, t) for t in kinds):
            want = " or ".join(_TYPE_WORDS[t] for t in kinds)
            raise _SchemaError(f"{where}: expected {want}, got {_json_words(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise _SchemaError(f"{where}: {v} is not a finite number")
    if _is_number(v):
        if "minimum" in s and v < s["minimum"]:
            raise _SchemaError(f"{where}: {v} is below the minimum {s['minimum']}")
        if "maximum" in s and v > s["maximum"]:
            raise _SchemaError(f"{where}: {v} is above the maximum {s['maximum']}")
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k in s.get("required", []):
            if k not in v:
                raise _SchemaError(f"{_at(path, k)}: missing")
        extra = s.get("additionalProperties", True)
        for k, x in v.items():
            if k in props:
                _check(x, props[k], _at(path, k), root)
            elif extra is False:
                raise _SchemaError(f"{_at(path, k)}: unknown field")
            elif isinstance(extra, dict):
                _check(x, extra, _at(path, k), root)
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            _check(x, s["items"], _at(path, i), root)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _typed(cls: type[Any], data: Any, path: str) -> Any:
    """A dataclass from JSON, every field checked against its annotation (ValueError)."""
    if not isinstance(data, dict):
        raise ValueError(f"{path or 'the document'}: expected an object, got {_json_words(data)}")
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    for k in data:
        if k not in names:
            raise ValueError(f"{_at(path, k)}: unknown field")
    hints = _hints(cls)
    kw = {}
    for f in fields:
        if f.name in data:
            kw[f.name] = _value(data[f.name], hints[f.name], _at(path, f.name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{_at(path, f.name)}: missing")
    return cls(**kw)


def _value(v: Any, tp: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        first: ValueError | None = None
        for a in (a for a in args if a is not type(None)):
            try:
                return _value(v, a, path)
            except ValueError as e:
                first = first or e
        raise first or ValueError(f"{path}: unexpected {_json_words(v)}")
    if origin is list:
        if not isinstance(v, list):
            raise ValueError(f"{path}: expected a list, got {_json_words(v)}")
        return [_value(x, args[0], _at(path, i)) for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{path}: expected an object, got {_json_words(v)}")
        return {str(k): _value(x, args[1], _at(path, str(k))) for k, x in v.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(v, str):
            with contextlib.suppress(ValueError):
                return tp(v)
        known = ", ".join(str(m.value) for m in tp)
        raise ValueError(f"{path}: {json.dumps(v)[:60]} is not one of {known}")
    if dataclasses.is_dataclass(tp):
        return _typed(tp, v, path)  # type: ignore[arg-type]
    checks = {
        bool: lambda x: isinstance(x, bool),
        str: lambda x: isinstance(x, str),
        int: lambda x: isinstance(x, int) and not isinstance(x, bool),
        float: _is_number,
    }
    if tp in checks and not checks[tp](v):
        want = {bool: "a boolean", str: "a string", int: "an integer", float: "a number"}[tp]
        raise ValueError(f"{path}: expected {want}, got {_json_words(v)}")
    return v


# Evidence keys that renderers read from a rank: name → what it must be.
_EVIDENCE_TYPES: dict[str, Any] = {
    "comm_top": str, "comm_names": list[str], "data_range": str, "backend": str,
    "gpu_ops": int, "gpu_metrics": dict[str, float | None],
    "gpu_metrics_per_step": dict[str, list[float | None]],
}  # fmt: skip


def _check_evidence(evidence: dict[str, Any], path: str) -> None:
    for k, tp in _EVIDENCE_TYPES.items():
        if k in evidence:
            _value(evidence[k], tp, _at(path, k))
