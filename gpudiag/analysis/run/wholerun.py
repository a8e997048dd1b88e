"""Whole-run step statistics from ``gpudiag run``'s telemetry, and NVML samples joined to steps.

The profiled window gives kernel-level detail for a few steps; the telemetry gives every
step of every rank (start, end, time blocked fetching data and in Python-level collective
waits). Statistics over the whole run count only the steady steps
(:mod:`gpudiag.analysis.reading.steady`: not the steps the profiler slowed down, not warm-up).

NVML samples are joined by GPU UUID (reported by each rank) over the span of that rank's
steps: mean GPU and memory utilisation, mean power and SM clock, the hottest temperature,
and the share of samples during which the driver reported a hardware, thermal or power
slowdown (clock-event reasons HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown
0x40, HwPowerBrakeSlowdown 0x80) — evidence for a "hardware" cause when one rank is slow.
A value NVML did not provide stays ``None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    GpuStats,
    RunStep,
    Severity,
    WholeRun,
    WholeRunRank,
)
from gpudiag.analysis.model.metrics import JobFailedMetrics, SourceMissingMetrics
from gpudiag.analysis.reading.steady import steady_steps
from gpudiag.analysis.run.phases import phase_frontier, with_input_wait
from gpudiag.config import SteadyRules
from gpudiag.rundir.conditions import (
    CLOCK_SLOWDOWN_MASK,
    SW_POWER_CAP,
    THROTTLE_REASONS,
    reason_bits,
)
from gpudiag.rundir.layout import NO_NVIDIA_DRIVER

if TYPE_CHECKING:  # pandas is imported only when a run directory is analysed
    import pandas as pd

# The throttle reasons a GpuStats names: the thermal/hardware slowdowns, then the power cap
# and the settings; its slowdown_ratio counts CLOCK_SLOWDOWN_MASK only (gpudiag.rundir.conditions).
_NAMED_REASONS = (*reason_bits(CLOCK_SLOWDOWN_MASK), SW_POWER_CAP, 0x2, 0x10)


def _missing(v: Any) -> bool:
    """None, NaN, or pandas' NA (without importing pandas)."""
    return v is None or (isinstance(v, float) and v != v) or type(v).__name__ == "NAType"


def _opt_int(v: Any) -> int | None:
    return None if _missing(v) else int(v)


def _opt_float(v: Any) -> float | None:
    return None if _missing(v) else float(v)


def whole_run(
    telemetry: pd.DataFrame | None,
    samples: pd.DataFrame | None,
    manifest: Any = None,
    steady_rules: SteadyRules | None = None,
) -> tuple[WholeRun | None, list[Finding]]:
    """Summaries of every step and GPU of a run directory, and the findings about its sources."""
    findings = _source_findings(manifest)
    if telemetry is None or telemetry.empty:
        return None, findings
    records: list[dict[str, Any]] = telemetry.to_dict("records")  # type: ignore[assignment]
    steps = [
        RunStep(
            rank=int(r["rank"]),
            step=int(r["step"]),
            start_ns=int(r["start_ns"]),
            duration_ns=int(r["duration_ns"]),
            data_wait_ns=_opt_int(r["data_wait_ns"]),
            comm_wait_ns=_opt_int(r["comm_wait_ns"]),
            backward_ns=_opt_int(r["backward_ns"]),
            profiled=bool(r["profiled"]),
            cpu_ns=_opt_int(r.get("cpu_ns")),
            pre_forward_ns=_opt_int(r.get("pre_forward_ns")),
            forward_ns=_opt_int(r.get("forward_ns")),
            optimizer_ns=_opt_int(r.get("optimizer_ns")),
        )
        for r in records
    ]
    rules = steady_rules or SteadyRules()
    keep = steady_steps(steps, rules)
    # the input wait: the DataLoader's, or the pre-forward phase's growth (phases.py)
    steps = with_input_wait(steps, keep, rules)
    inputs = {(s.rank, s.step): s.data_wait_ns for s in steps}
    pairs = list(zip(telemetry["rank"].tolist(), telemetry["step"].tolist(), strict=True))
    st = telemetry[[p in keep for p in pairs]]
    ranks = []
    for _, g in st.groupby("rank", sort=True):
        rank = int(g["rank"].iloc[0])
        d = g["duration_ns"].to_numpy(np.int64)
        total = float(d.sum())
        data = [v for n in g["step"].tolist() if (v := inputs[(rank, int(n))]) is not None]
        comm = g["comm_wait_ns"]
        ranks.append(
            WholeRunRank(
                rank=rank,
                steps=len(g),
                step_time_ns_median=round(float(nputil.median(d))),
                step_time_ns_p90=round(nputil.percentile(d, 90)),
                step_time_ns_max=int(d.max()),
                data_wait_ratio=float(sum(data)) / total if total and data else None,
                # telemetry sees no DDP reducer: no collective wait at all is "not measured"
                comm_wait_ratio=float(comm.sum()) / total
                if total and comm.fillna(0).gt(0).any()
                else None,
                host=str(g["host"].iloc[0]) if "host" in g else "",
            )
        )
    gpus = _gpu_stats(telemetry, samples, manifest)
    exit_code = getattr(manifest, "exit_code", None)
    return WholeRun(
        ranks=ranks,
        steps=steps,
        gpus=gpus,
        job_exit_code=exit_code,
        frontier=phase_frontier(steps, keep),
    ), findings


def _gpu_stats(
    telemetry: pd.DataFrame, samples: pd.DataFrame | None, manifest: Any
) -> list[GpuStats]:
    if samples is None or samples.empty:
        return []
    rank_of = {
        r.gpu_uuid: r.rank for r in getattr(manifest, "ranks", []) if getattr(r, "gpu_uuid", None)
    }
    spans = telemetry.groupby("rank").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    out = []
    for uuid, g in samples.groupby("gpu_uuid", sort=True):
        rank = rank_of.get(str(uuid))
        if rank is not None and rank in spans.index:
            lo, hi = spans.loc[rank, "lo"], spans.loc[rank, "hi"]
            g = g[(g["time_ns"] >= lo) & (g["time_ns"] <= hi)]
        if g.empty:
            continue
        thr = g["throttle_reasons"].dropna()
        thr_i = thr.astype(np.int64).to_numpy() if len(thr) else np.zeros(0, np.int64)
        seen = int(np.bitwise_or.reduce(thr_i)) if thr_i.size else 0
        reasons = [THROTTLE_REASONS[b][1] for b in _NAMED_REASONS if seen & b]
        out.append(
            GpuStats(
                gpu_uuid=str(uuid),
                rank=rank,
                host=str(g["host"].iloc[0]),
                samples=len(g),
                util_ratio=_opt_float(g["util_ratio"].mean()),
                mem_util_ratio=_opt_float(g["mem_util_ratio"].mean()),
                power_w=_opt_float(g["power_w"].mean()),
                sm_clock_mhz=_opt_float(g["sm_clock_mhz"].mean()),
                temp_c_max=_opt_float(g["temp_c"].max()),
                slowdown_ratio=(
                    float(np.mean((thr_i & CLOCK_SLOWDOWN_MASK) != 0)) if thr_i.size else None
                ),
                slowdown_reasons=reasons,
            )
        )
    return out


GPU_TELEMETRY_NOTE = "GPU telemetry (NVML) does not apply: {why}"


def gpu_telemetry_note(manifest: Any) -> str | None:
    """The one note of a CPU-only run without NVML samples (no finding, no warning), or None.

    CPU-only: the host has no NVIDIA driver (``gpudiag run`` recorded so), or every rank's
    telemetry header names the CPU as its device and no GPU.
    """
    src = getattr(manifest, "sources", {}).get("nvml") if manifest is not None else None
    if src is None or src.captured:
        return None
    if src.reason == NO_NVIDIA_DRIVER:
        return GPU_TELEMETRY_NOTE.format(why=NO_NVIDIA_DRIVER)
    ranks = list(getattr(manifest, "ranks", []) or [])
    if ranks and all(r.device == "cpu" and not r.gpu_uuid for r in ranks):
        return GPU_TELEMETRY_NOTE.format(why="every rank ran on the CPU")
    return None


def _source_findings(manifest: Any) -> list[Finding]:
    """A finding for each capture source that is missing, with the reason the run recorded."""
    if manifest is None:
        return []
    out = []
    labels = {
        "nvml": "GPU samples (NVML)",
        "kineto": "profiler traces",
        "telemetry": "step telemetry",
    }
    out += [
        Finding(
            kind=FindingKind.SOURCE_MISSING,
            severity=Severity.INFO,
            message=f"{labels[name]} not captured: {src.reason}",
            metrics=SourceMissingMetrics(name, reason=src.reason),
        )
        for name, src in sorted(getattr(manifest, "sources", {}).items())
        if name in labels
        and not src.captured
        and src.reason != "not requested"
        and not (name == "nvml" and gpu_telemetry_note(manifest))
    ]
    for problem in getattr(manifest, "diagnosis_incomplete", []):
        out.append(
            Finding(
                kind=FindingKind.SOURCE_MISSING,
                severity=Severity.WARNING,
                message=f"capture incomplete: {problem}",
                metrics=SourceMissingMetrics("capture"),
            )
        )
    code = getattr(manifest, "exit_code", None)
    if code not in (None, 0):
        out.append(
            Finding(
                kind=FindingKind.JOB_FAILED,
                severity=Severity.WARNING,
                message=f"the training job exited with code {code}; "
                "the diagnosis covers the steps it completed",
                metrics=JobFailedMetrics(code),
            )
        )
    return out
