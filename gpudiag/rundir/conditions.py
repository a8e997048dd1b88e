"""Run conditions: what else the host and its GPUs were doing during a run.

``gpudiag run`` samples them (:mod:`gpudiag.collect.samplers.conditions`) and keeps a summary in
each node's manifest (``conditions``, docs/run-directory.md). :class:`RunConditions` and
:class:`GpuConditions` are that summary, typed: the manifest's object is kept as it was
read (so a manifest is written back, and a gate result shows it, byte for byte) and the
fields gpudiag reads are properties. :func:`merge` makes one summary of a run's nodes;
:func:`contention` judges it against the gate's limits, for the gate and for ``analyze``;
:func:`window_share` reads the samples over time for a window of steps (the steady steps the
gate compares: a run's mean is mostly its start-up).

The clocks-event (throttle) reason bits of NVML are one table here, with two masks:

- :data:`CLOCK_SLOWDOWN_MASK`, thermal and hardware slowdowns: the GPU runs slower than it
  would in its power budget. The straggler cause (``GpuStats.slowdown_ratio``) uses it.
- :data:`CLOCKS_LIMITED_MASK`, those and the software power cap: the GPU's clocks were held
  below their maximum for any reason but idleness or settings. The run-conditions summary's
  ``slowdown_samples`` counts it, so the gate's ``max_gpu_slowdown_ratio`` judges it.

Only the standard library: collect, traces and analysis all import this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from gpudiag._support.records import dataclass

# nvmlClocksEventReasons bits (nvml.h): the manifest's name, NVML's name.
THROTTLE_REASONS: dict[int, tuple[str, str]] = {
    0x1: ("gpu_idle", "GpuIdle"),
    0x2: ("applications_clocks_setting", "ApplicationsClocksSetting"),
    0x4: ("sw_power_cap", "SwPowerCap"),
    0x8: ("hw_slowdown", "HwSlowdown"),
    0x10: ("sync_boost", "SyncBoost"),
    0x20: ("sw_thermal_slowdown", "SwThermalSlowdown"),
    0x40: ("hw_thermal_slowdown", "HwThermalSlowdown"),
    0x80: ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    0x100: ("display_clock_setting", "DisplayClockSetting"),
}
SW_POWER_CAP = 0x4
CLOCK_SLOWDOWN_MASK = 0x8 | 0x20 | 0x40 | 0x80
CLOCKS_LIMITED_MASK = CLOCK_SLOWDOWN_MASK | SW_POWER_CAP


def reason_bits(mask: int) -> list[int]:
    """The bits of ``mask`` that are in the table, lowest first."""
    return [b for b in THROTTLE_REASONS if mask & b]


def _ratio(n: Any, of: Any) -> float:
    return (n or 0) / of if of else 0.0


@dataclass(frozen=True)
class GpuConditions:
    """One GPU's part of a run-conditions summary (``conditions.gpus[uuid]``)."""

    raw: Mapping[str, Any]

    @property
    def samples(self) -> int:
        """How many samples read this GPU."""
        return int(self.raw.get("samples") or 0)

    @property
    def slowdown_ratio(self) -> float:
        """Share of its samples with a :data:`CLOCKS_LIMITED_MASK` reason set."""
        return _ratio(self.raw.get("slowdown_samples"), self.raw.get("samples"))

    @property
    def shared_ratio(self) -> float:
        """Share of its samples with another process on the GPU."""
        return _ratio(self.raw.get("other_process_samples"), self.raw.get("samples"))


@dataclass(frozen=True)
class RunConditions:
    """A run-conditions summary: one node's (the manifest's) or a run's (:func:`merge`)."""

    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: Any, where: str = "conditions") -> RunConditions:
        """Check a manifest's ``conditions``; ValueError names the first bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object")
        for key in ("samples", "failed_samples", *_RATIOS, "sample_cost_us_mean"):
            v = data.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{where}.{key}: expected a number or null")
        gpus = data.get("gpus")
        if gpus is not None:
            if not isinstance(gpus, dict):
                raise ValueError(f"{where}.gpus: expected an object")
            for uuid, g in gpus.items():
                if not isinstance(g, dict):
                    raise ValueError(f"{where}.gpus.{uuid}: expected an object")
        if not isinstance(data.get("top_other") or [], list):
            raise ValueError(f"{where}.top_other: expected a list")
        return cls(data)

    def to_json(self) -> dict[str, Any]:
        """The summary as the manifest holds it."""
        return self.raw

    def _number(self, key: str) -> float | None:
        v = self.raw.get(key)
        return None if v is None else float(v)

    @property
    def samples(self) -> int:
        """How many samples the summary is of (0 in a merged summary, which has no count)."""
        return int(self.raw.get("samples") or 0)

    @property
    def failed_samples(self) -> int:
        """Samples that failed as a whole."""
        return int(self.raw.get("failed_samples") or 0)

    @property
    def other_cpu_ratio_mean(self) -> float | None:
        """Mean share of all CPUs used by processes outside the job and gpudiag."""
        return self._number("other_cpu_ratio_mean")

    @property
    def steal_ratio_mean(self) -> float | None:
        """Mean share of all CPUs' time the hypervisor gave to other guests."""
        return self._number("steal_ratio_mean")

    @property
    def cpu_busy_ratio_mean(self) -> float | None:
        """Mean share of all CPUs busy."""
        return self._number("cpu_busy_ratio_mean")

    @property
    def top_other(self) -> list[dict[str, Any]]:
        """The processes outside the job that used the most CPU."""
        return list(self.raw.get("top_other") or [])

    @property
    def gpus(self) -> dict[str, GpuConditions]:
        """Each GPU's conditions, by UUID, in UUID order."""
        gpus = self.raw.get("gpus") or {}
        return {uuid: GpuConditions(gpus[uuid]) for uuid in sorted(gpus)}

    @property
    def steady_cpu_ratio(self) -> float | None:
        """Other processes' and steal CPU share over the steady steps (the gate adds it)."""
        return self._number(STEADY_CPU_RATIO)

    def with_steady_cpu_ratio(self, value: float | None) -> RunConditions:
        """The summary with :attr:`steady_cpu_ratio` set (unchanged when ``value`` is None)."""
        return self if value is None else RunConditions({**self.raw, STEADY_CPU_RATIO: value})


# the gate's addition to a run's summary (never a manifest's): other + steal CPU share over
# the steady steps it compares, the worst node's (:func:`window_share`)
STEADY_CPU_RATIO = "steady_cpu_contention_ratio"


_RATIOS = ("other_cpu_ratio_mean", "steal_ratio_mean", "cpu_busy_ratio_mean")
# kept in a merged summary too (the worst node's): the sampler's CPU time per sample, the
# cost of its fixed work, which the gate reads as how dear the host made CPU time
_MERGED = (*_RATIOS, "sample_cost_us_mean")


def merge(summaries: Iterable[RunConditions | None]) -> RunConditions | None:
    """One summary of a run's nodes: the worst node's CPU figures, every GPU, every process."""
    found = [c.raw for c in summaries if c is not None and c.raw]
    if not found:
        return None
    out: dict[str, Any] = {"gpus": {}}
    for key in _MERGED:
        vals = [c[key] for c in found if c.get(key) is not None]
        if vals or key in _RATIOS:
            out[key] = max(vals) if vals else None
    for c in found:
        out["gpus"].update(c.get("gpus") or {})
    out["top_other"] = [t for c in found for t in c.get("top_other") or []]
    return RunConditions(out)


class ContentionLimits(Protocol):
    """The contention limits of ``[tool.gpudiag.gate]`` (:class:`gpudiag.config.GateConfig`)."""

    @property
    def max_other_cpu_ratio(self) -> float:
        """Other processes' mean CPU share."""

    @property
    def max_steal_ratio(self) -> float:
        """Mean steal share."""

    @property
    def max_gpu_slowdown_ratio(self) -> float:
        """A GPU's share of samples with its clocks limited."""

    @property
    def max_gpu_other_process_ratio(self) -> float:
        """A GPU's share of samples with another process on it."""


def host_contention(conditions: RunConditions | None, limits: ContentionLimits) -> dict[str, float]:
    """The host's CPU figures over their limits: ``other_cpu_ratio``, ``steal_ratio`` (or {}).

    What can slow any rank's host work (its Python, its launches, a CPU job's compute), as
    against a GPU's own throttling or sharing.
    """
    if conditions is None or not conditions.raw:
        return {}
    out = {}
    other, steal = conditions.other_cpu_ratio_mean, conditions.steal_ratio_mean
    if other is not None and other > limits.max_other_cpu_ratio:
        out["other_cpu_ratio"] = other
    if steal is not None and steal > limits.max_steal_ratio:
        out["steal_ratio"] = steal
    return out


def contention(conditions: RunConditions | None, limits: ContentionLimits) -> list[str]:
    """Why the recorded conditions are contended (empty: quiet, or not recorded)."""
    if conditions is None or not conditions.raw:
        return []
    out = []
    other = conditions.other_cpu_ratio_mean
    if other is not None and other > limits.max_other_cpu_ratio:
        out.append(
            f"other processes used {other:.0%} of the CPUs (limit {limits.max_other_cpu_ratio:.0%})"
        )
    steal = conditions.steal_ratio_mean
    if steal is not None and steal > limits.max_steal_ratio:
        out.append(f"steal time {steal:.0%} of the CPUs (limit {limits.max_steal_ratio:.0%})")
    for uuid, g in conditions.gpus.items():
        if g.slowdown_ratio > limits.max_gpu_slowdown_ratio:
            out.append(
                f"GPU {uuid} throttled in {g.slowdown_ratio:.0%} of samples (limit "
                f"{limits.max_gpu_slowdown_ratio:.0%})"
            )
        if g.shared_ratio > limits.max_gpu_other_process_ratio:
            out.append(
                f"GPU {uuid} had other processes in {g.shared_ratio:.0%} of samples "
                f"(limit {limits.max_gpu_other_process_ratio:.0%})"
            )
    return out


def describe(conditions: RunConditions | None) -> str:
    """``other processes 46% of CPUs, steal 0%, 1 GPU throttled 0%``, or not recorded."""
    if conditions is None or not conditions.raw:
        return "run conditions not recorded"
    parts = []
    for v, label in (
        (conditions.other_cpu_ratio_mean, "other processes"),
        (conditions.steal_ratio_mean, "steal"),
    ):
        parts.append(f"{label} {'?' if v is None else format(v, '.0%')} of CPUs")
    if conditions.steady_cpu_ratio is not None:
        parts.append(f"others {conditions.steady_cpu_ratio:.0%} of CPUs over the steady steps")
    for uuid, g in conditions.gpus.items():
        parts.append(
            f"GPU {uuid} throttled {g.slowdown_ratio:.0%}, shared {g.shared_ratio:.0%} of samples"
        )
    return ", ".join(parts)


@dataclass(frozen=True)
class ContentionSample:
    """One sample of ``conditions/<host>.jsonl``: the CPU share others took over its interval.

    ``ratio`` is ``other_cpu_ratio`` + ``steal_ratio`` over ``(start_ns, end_ns]``, on the
    samples' clock (``time.time_ns``, the step telemetry's).
    """

    host: str
    start_ns: int
    end_ns: int
    ratio: float


def window_share(samples: Sequence[ContentionSample], start_ns: int, end_ns: int) -> float | None:
    """The CPU share others took over ``(start_ns, end_ns]``: the worst host's, time-weighted.

    Each sample counts by how much of its interval lies in the window; None when no sample
    of any host overlaps it.
    """
    seen: dict[str, list[float]] = {}
    for s in samples:
        overlap = min(s.end_ns, end_ns) - max(s.start_ns, start_ns)
        if overlap > 0:
            acc = seen.setdefault(s.host, [0.0, 0.0])
            acc[0] += overlap * s.ratio
            acc[1] += overlap
    return max((w / t for w, t in seen.values()), default=None)


def rank_samples(
    samples: Sequence[ContentionSample], manifest: Any
) -> dict[int, list[ContentionSample]]:
    """Each rank's host's contention samples, by the manifest's rank → host.

    A rank whose host is not named gets the samples of the only host sampled, if one.
    """
    by_host: dict[str, list[ContentionSample]] = {}
    for s in samples:
        by_host.setdefault(s.host, []).append(s)
    ranks = list(getattr(manifest, "ranks", None) or [])
    only = next(iter(by_host.values())) if len(by_host) == 1 else None
    out = {}
    for r in ranks:
        got = by_host.get(r.host) if r.host else only
        if got:
            out[r.rank] = got
    return out
