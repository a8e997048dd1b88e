"""The compute-bound finding: when compute holds the step, what the kernels behind it are.

An information-level finding (``compute_bound``) when the run's compute share reaches
``advice.compute_bound_share``. Its metrics describe compute by family, from the run's
kernel or operator breakdown (:func:`gpudiag.analysis.rank.kernels.combine`) with
communication and copies left out, so that the remedies (analysis/advice.py) can say
what would make compute itself faster: fusion when elementwise, reduction and
normalisation kernels hold ``advice.fusion_share`` of it; reduced precision when matrix
kernels (GEMMs, convolutions, attention) hold ``advice.gemm_share`` and
``advice.fp32_gemm_share`` of their time is in fp32 — those two only where the device's
peak is unknown.

``below_peak`` (information, at any compute share): the remedies from efficiency —
precision, fusion, bigger GEMMs, channels-last — whose gain, the time their families spend
above what their work needs at the device's peak
(:mod:`gpudiag.analysis.efficiency.gains`), is at least ``advice.min_gain_share`` of the
median step.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudiag.analysis.efficiency.gains import opportunities
from gpudiag.analysis.efficiency.measure import run_efficiency
from gpudiag.analysis.efficiency.peaks import peak_of
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    KernelBreakdown,
    Mode,
    RankSummary,
    RunSummary,
    Severity,
)
from gpudiag.analysis.model.metrics import BelowPeakMetrics, ComputeMetrics
from gpudiag.analysis.rank.kernels import MATRIX
from gpudiag.config import AdviceRules

NOT_COMPUTE = ("communication", "memcpy")
FUSABLE = ("elementwise", "reduction", "normalisation")


def compute_families(kernels: KernelBreakdown | None) -> dict[str, float]:
    """Family → share of compute kernel (or operator) time, communication and copies left out."""
    fams = dict(kernels.families) if kernels else {}
    rest = sum(v for f, v in fams.items() if f not in NOT_COMPUTE)
    if rest <= 0:
        return {}
    return {f: v / rest for f, v in fams.items() if f not in NOT_COMPUTE}


def compute_bound(
    run: RunSummary, kernels: KernelBreakdown | None, rules: AdviceRules
) -> list[Finding]:
    """The ``compute_bound`` finding, or none (module docstring)."""
    share = run.shares.compute
    if share < rules.compute_bound_share:
        return []
    fams = compute_families(kernels)
    unit = "operators" if kernels and kernels.unit == "operator" else "kernels"
    text = f"compute holds {words.percent(share)} of step time"
    if fams:
        top = sorted(fams.items(), key=lambda kv: -kv[1])[:3]
        # a share of compute time, not of all kernel time as the top table's: say which
        mostly = ", ".join(f"{f} ({words.percent(v)})" for f, v in top)
        text += f"; its {unit} are mostly {mostly}, as shares of compute {unit[:-1]} time "
        text += "(communication and copies left out)"
    names = [e.name for e in (kernels.top if kernels else []) if e.family not in NOT_COMPUTE]
    return [
        Finding(
            kind=FindingKind.COMPUTE_BOUND,
            severity=Severity.INFO,
            message=text,
            metrics=ComputeMetrics(
                compute_share=share,
                threshold=rules.compute_bound_share,
                unit=kernels.unit if kernels else "kernel",
                families=fams,
                fusable_share=sum(fams.get(f, 0.0) for f in FUSABLE),
                gemm_share=fams.get("GEMM", 0.0),
                fp32_gemm_share=kernels.fp32_gemm_share if kernels else 0.0,
                top=names[:5],
                matrix_share=sum(fams.get(f, 0.0) for f in MATRIX),
                fp32_matrix_share=kernels.fp32_matrix_share if kernels else 0.0,
            ),
        )
    ]


_REMEDY_WORDS = {
    "precision": "{path} matrix work in {to_path}",
    "fusion": "fused {families}",
    "bigger-gemms": "larger GEMM shapes",
    "channels-last": "channels-last convolutions",
}


def below_peak(
    run: RunSummary,
    ranks: Sequence[RankSummary],
    kernels: KernelBreakdown | None,
    rules: AdviceRules,
) -> list[Finding]:
    """``below_peak``: the remedies that could recover ``advice.min_gain_share`` of a step.

    Each remedy's gain is the time its families spend above what their work needs at the
    device's peak (:mod:`gpudiag.analysis.efficiency.gains`); one rule for every remedy
    from efficiency, with no cut-off on compute's share of the step.
    """
    if run.mode != Mode.GPU or not ranks:
        return []
    eff = run_efficiency([e for r in ranks if (e := r.evidence.efficiency)])
    devices = {d for r in ranks for d in r.devices}
    if eff is None and len(devices) != 1:
        return []
    device = eff.device if eff is not None else next(iter(devices))
    steps = sum(r.steps for r in ranks)
    step = max(run.step_time_ns_median, 1)
    found = [
        o
        for o in opportunities(eff, kernels, steps, device, rules)
        if o.gain_ns >= rules.min_gain_share * step
    ]
    if not found:
        return []
    peak = peak_of(device)
    model = peak.model if peak is not None else device
    told = "; ".join(
        _REMEDY_WORDS[o.remedy].format(
            path=o.path, to_path=o.to_path, families=" and ".join(o.families)
        )
        + f" up to {words.duration(o.gain_ns, 'human')} ({words.percent(o.gain_ns / step)})"
        for o in found
    )
    return [
        Finding(
            kind=FindingKind.BELOW_PEAK,
            severity=Severity.INFO,
            message=f"compute runs below the {model} peak; a step could gain with {told}",
            metrics=BelowPeakMetrics(
                device, peak.model if peak else "", step, rules.min_gain_share, found
            ),
        )
    ]
