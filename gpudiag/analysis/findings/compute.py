"""The compute-bound finding: when compute holds the step, what the kernels behind it are.

An information-level finding (``compute_bound``) when the run's compute share reaches
``advice.compute_bound_share``. Its metrics describe compute by family, from the run's
kernel or operator breakdown (:func:`gpudiag.analysis.rank.kernels.combine`) with
communication and copies left out, so that the remedies (analysis/advice.py) can say
what would make compute itself faster: fusion when elementwise, reduction and
normalisation kernels hold ``advice.fusion_share`` of it; reduced precision when matrix
kernels (GEMMs, convolutions, attention) hold ``advice.gemm_share`` and
``advice.fp32_gemm_share`` of their time is in fp32.
"""

from __future__ import annotations

from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    KernelBreakdown,
    RunSummary,
    Severity,
)
from gpudiag.analysis.model.metrics import ComputeMetrics
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
