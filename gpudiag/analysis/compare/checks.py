"""The gate's result types: a check's status, one check, the verdict and its exit code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, TypedDict

from gpudiag._support.records import asdict, dataclass
from gpudiag.analysis.model.diagnosis import StrEnum
from gpudiag.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK


class CheckStatus(StrEnum):
    """The outcome of one check."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    INCONCLUSIVE = "inconclusive"
    OFF = "off"  # not applied: the message says why and how to apply it


class GateStatus(StrEnum):
    """The gate's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 5 inconclusive (see DESIGN.md's table)."""
        return {GateStatus.PASSED: EXIT_OK, GateStatus.FAILED: EXIT_GATE_FAILED}.get(
            self, EXIT_INCONCLUSIVE
        )


PASS, FAIL, WARN, INCONCLUSIVE, OFF = (
    CheckStatus.PASS,
    CheckStatus.FAIL,
    CheckStatus.WARN,
    CheckStatus.INCONCLUSIVE,
    CheckStatus.OFF,
)


class CheckDetails(TypedDict, total=False):
    """A check's ``details``: what its outcome rests on (the timing checks, a baseline run)."""

    baseline_runs: int
    baseline_medians_ns: list[float]
    candidate_median_ns: float
    within_run_mann_whitney_p: float
    baseline_cv: float  # two or more baseline runs: their spread, …
    t_quantile: float
    run_level_p: float  # … and the run-level test
    baseline_mean_ns: float
    min_effect_ratio: float
    contended_baseline_runs: list[str]
    own_test_slower: bool  # slower than the limit: whether the check's own test says so
    run: str  # ``baseline_run``: the run's name
    comparable_contention: str  # a contended candidate's wall clock tested: why (timing.py)
    paired: bool  # ``--paired``: alternated runs, tested by their pairs' ratios (paired.py) …
    pair_ratios: list[float]  # … each pair's candidate median ÷ its partner's, …
    pair_log_sd: float  # … the sample standard deviation of their logs, …
    candidate_medians_ns: list[float]  # … and each candidate run's median


class Fingerprint(TypedDict, total=False):
    """What must match for two runs to be comparable (:func:`~.baseline.fingerprint`).

    All three keys, or none (``{}``: a gate with no run to take it from).
    """

    world_size: int
    devices: list[str]
    mode: str


# a run's recorded run-conditions summary as the manifest holds it (free-form: the sampler's
# keys, written back byte for byte; gpudiag.rundir.conditions reads its fields)
ConditionsJSON = Mapping[str, Any]


@dataclass(frozen=True)
class Check:
    """One gate check: a metric (of one rank, or of the run when ``rank`` is None)."""

    name: str
    rank: int | None
    status: CheckStatus
    value: float | None
    limit: float | None
    message: str
    p_value: float | None = None
    effect_ratio: float | None = None
    samples: list[int] = field(default_factory=list)  # [candidate, baseline] sample counts
    ci: list[float] = field(default_factory=list)  # [low, high] of the effect, when known
    mde_ratio: float | None = None  # the smallest effect this baseline could detect
    # ``run_conditions``: the subject's recorded run conditions (free-form, as recorded)
    details: CheckDetails | ConditionsJSON = field(default_factory=dict)


@dataclass(frozen=True)
class GateResult:
    """The verdict and every check behind it."""

    status: GateStatus
    checks: list[Check]
    subject: str = ""
    baseline: str | None = None
    fingerprint: Fingerprint = field(default_factory=lambda: Fingerprint())
    baseline_fingerprint: Fingerprint | None = None
    inconclusive_ok: bool = False
    rules: Mapping[str, object] = field(default_factory=dict)  # the GateConfig in force
    conditions: ConditionsJSON | None = None  # the subject's run conditions, when recorded

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 5 inconclusive (see DESIGN.md's table)."""
        return self.status.exit_code

    def counts(self) -> dict[str, int]:
        """How many checks have each status."""
        out = dict.fromkeys((PASS, WARN, FAIL, INCONCLUSIVE, OFF), 0)
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return {str(k): v for k, v in out.items()}

    def to_json(self) -> dict[str, Any]:
        """Plain dict (the ``exit_code`` included)."""
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d
