"""A run reduced for comparison, and the baseline file format.

:func:`step_time_stats` (the steady job step time) and :func:`fingerprint` (what must match
for two runs to be comparable) are shared by ``gate`` and ``diff``; :class:`RunStat` is one
run as the gate compares it and as a baseline file (``gate --save-baseline``) stores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, TypedDict

from gpudiag._support import nputil
from gpudiag._support.records import asdict, dataclass
from gpudiag.analysis.compare.checks import ConditionsJSON, Fingerprint
from gpudiag.analysis.model.diagnosis import Diagnosis, FindingKind, Mode, RunStep
from gpudiag.analysis.reading.steady import steady_steps
from gpudiag.config import GateConfig, Thresholds
from gpudiag.rundir.conditions import RunConditions

# ---- samples and fingerprints ----


WHOLE_RUN = "whole run (telemetry)"
PROFILED = "profiled window"


def step_samples(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> list[int]:
    """Per-step job step times (ns): per steady step number, the slowest rank.

    Uses the run directory's telemetry (every step) when the Diagnosis has it and it holds
    more steady steps than the profiled window, else the profiled steps; either way only
    the steady steps (:func:`gpudiag.analysis.reading.steady.steady_steps`) count.
    """
    return step_samples_and_basis(d, warmup_steps, th)[0]


def step_samples_and_basis(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> tuple[list[int], str]:
    """:func:`step_samples` and what they rest on: ``WHOLE_RUN`` or ``PROFILED``."""
    rows, keep, basis = _steady_rows(d, warmup_steps, th)
    per_step: dict[int, int] = {}
    for s in rows:
        if (s.rank, s.step) in keep and s.duration_ns > 0:
            per_step[s.step] = max(per_step.get(s.step, 0), s.duration_ns)
    return [per_step[k] for k in sorted(per_step)], basis


def steady_window(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> tuple[int, int] | None:
    """The time span of the steady steps :func:`step_samples` rests on (None: no such step).

    From the first such step's start to the last one's end, on the steps' clock (the
    telemetry's ``time.time_ns``, which the run-conditions samples share).
    """
    rows, keep, _ = _steady_rows(d, warmup_steps, th)
    spans = [
        (s.start_ns, s.start_ns + s.duration_ns)
        for s in rows
        if (s.rank, s.step) in keep and s.duration_ns > 0
    ]
    if not spans:
        return None
    return min(a for a, _ in spans), max(b for _, b in spans)


def _steady_rows(
    d: Diagnosis, warmup_steps: int | None, th: Thresholds | None
) -> tuple[list[RunStep], set[tuple[int, int]], str]:
    """The step rows the samples come from, the steady (rank, step) pairs, and the basis."""
    th = th or Thresholds()
    window = [
        RunStep(s.rank, s.step, s.start_ns, s.duration_ns, None, None, None, False) for s in d.steps
    ]
    tele = list(d.whole_run.steps) if d.whole_run else []
    # The window's first step is not the job's: only --warmup-steps drops it there.
    keep = steady_steps(window, th.steady, warmup_steps or 0)
    # a telemetry-only diagnosis: its steps are the telemetry's, there is no profiled window
    rows, basis = window, WHOLE_RUN if d.run.mode == Mode.TELEMETRY else PROFILED
    if tele:
        keep_t = steady_steps(tele, th.steady, warmup_steps)
        if len({st for _, st in keep_t}) > len({st for _, st in keep}):
            rows, keep, basis = tele, keep_t, WHOLE_RUN
    return rows, keep, basis


def cpu_samples(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> list[int]:
    """Per-step job CPU times (ns): per steady step number, the largest over the ranks.

    From the run directory's telemetry (``cpu_ns``: the CPU time of the rank's training
    thread in the step); a step is kept when every rank that ran it has its CPU time. Empty
    when the Diagnosis has no telemetry or the telemetry has no CPU times (written by an
    older gpudiag).
    """
    th = th or Thresholds()
    tele = list(d.whole_run.steps) if d.whole_run else []
    keep = steady_steps(tele, th.steady, warmup_steps)
    per_step: dict[int, int | None] = {}
    for s in tele:
        if (s.rank, s.step) not in keep:
            continue
        prev = per_step.get(s.step, 0)
        per_step[s.step] = None if s.cpu_ns is None or prev is None else max(prev, s.cpu_ns)
    return [v for _, v in sorted(per_step.items()) if v is not None]


def run_outcome(d: Diagnosis) -> str | None:
    """Why the run did not end well (failed, crashed, interrupted, hung), or None.

    From the verdict the analysis gave (docs/definitions.md, "Verdict": a hang, a
    collective mismatch, a failed or an interrupted run lead it) and the job's exit code.
    """
    v = d.verdict
    if v is not None and (v.bottleneck in ENDED or v.interrupted):
        return v.headline
    code = d.whole_run.job_exit_code if d.whole_run else None
    if code:
        return f"the job exited with {code}"
    return None


ENDED = ("failure", "hang", "mismatch", "interrupted")


def step_time_stats(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> tuple[float | None, float | None, int]:
    """(median, p90, count) of :func:`step_samples`, in ns; ``gate`` and ``diff`` share it."""
    samples = step_samples(d, warmup_steps, th)
    if not samples:
        return None, None, 0
    return float(nputil.median(samples)), nputil.percentile(samples, 90), len(samples)


@dataclass(frozen=True)
class RunStat:
    """One run reduced to what the run-level comparison needs (a baseline file's entry)."""

    name: str
    step_time_ns_median: float | None
    step_time_ns: list[int]  # the steady per-step job step times
    shares: dict[str, float | None]  # comm_wait None: not measured
    idle_ratio: float
    fingerprint: Fingerprint
    stragglers: list[int] = field(default_factory=list)
    conditions: ConditionsJSON | None = None
    # the steady per-step job CPU times (training threads), empty when not recorded
    cpu_ns: list[int] = field(default_factory=list)
    outcome: str | None = None  # why the run did not end well (run_outcome); None: it did


def run_stat(
    d: Diagnosis,
    name: str = "",
    conditions: RunConditions | None = None,
    warmup_steps: int | None = None,
    th: Thresholds | None = None,
) -> RunStat:
    """Reduce a Diagnosis (and its recorded run conditions) to a :class:`RunStat`."""
    samples = step_samples(d, warmup_steps, th)
    median = step_time_stats(d, warmup_steps, th)[0]
    stragglers = sorted({r for f in d.findings if f.kind == FindingKind.STRAGGLER for r in f.ranks})
    return RunStat(
        name,
        median,
        samples,
        d.run.shares.as_dict(),
        d.run.idle_ratio,
        fingerprint(d),
        stragglers,
        conditions.to_json() if conditions is not None else None,
        cpu_samples(d, warmup_steps, th),
        run_outcome(d),
    )


BASELINE_FORMAT = "gpudiag.baseline"
BASELINE_VERSION = 1


class BaselineJSON(TypedDict):
    """A baseline file (``gate --save-baseline``): its format, and one entry per run."""

    format: str
    version: int
    gpudiag_version: str
    warmup_steps: int | None
    runs: list[dict[str, object]]  # asdict of each RunStat


def baseline_to_json(runs: Sequence[RunStat], cfg: GateConfig, version: str = "") -> BaselineJSON:
    """The document ``gate --save-baseline FILE RUN…`` writes: one entry per run."""
    return {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "gpudiag_version": version,
        "warmup_steps": cfg.warmup_steps,
        "runs": [asdict(r) for r in runs],
    }


def is_baseline_json(doc: Any) -> bool:
    """True for a document written by :func:`baseline_to_json`."""
    return isinstance(doc, dict) and doc.get("format") == BASELINE_FORMAT


def baseline_from_json(doc: Mapping[str, Any]) -> list[RunStat]:
    """The runs of a baseline file; ValueError on a newer or malformed one."""
    if int(doc.get("version", 0)) > BASELINE_VERSION:
        raise ValueError(
            f"baseline file version {doc.get('version')} is newer than this "
            f"gpudiag understands ({BASELINE_VERSION})"
        )
    try:
        return [RunStat(**r) for r in doc["runs"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"malformed baseline file ({e})") from e


def fingerprint(d: Diagnosis) -> Fingerprint:
    """What must match for two runs to be comparable: world size, device names, mode."""
    devices = sorted({dev for r in d.ranks for dev in r.devices})
    return Fingerprint(
        world_size=d.run.world_size or d.run.ranks, devices=devices, mode=str(d.run.mode)
    )


def _fp_words(fp: Fingerprint) -> list[tuple[str, object, str]]:
    """Each part of a fingerprint: its label, its value, and the value in words."""
    devices = fp.get("devices")
    return [
        ("world size", fp.get("world_size"), str(fp.get("world_size"))),
        ("GPUs", devices, ", ".join(devices) if devices else "no GPUs"),
        ("mode", fp.get("mode"), str(fp.get("mode"))),
    ]


def describe_fingerprint_difference(a: Fingerprint, b: Fingerprint) -> str:
    """``world size 8 vs 4, GPUs H100 vs A100``: the parts that differ, in the user's words."""
    return ", ".join(
        f"{label} {x} vs {y}"
        for (label, va, x), (_, vb, y) in zip(_fp_words(a), _fp_words(b), strict=True)
        if va != vb
    )
