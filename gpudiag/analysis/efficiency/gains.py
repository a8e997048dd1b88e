"""What running closer to the device's peak could recover: each remedy's time above its bound.

Per step (the mean over the ranks' analysed steps), from the run's efficiency
(:mod:`.measure`, the operators' shapes) and its kernel breakdown (kernel names). Each
opportunity is the GPU time t a step of the families a remedy acts on, and the least time
the peak table allows the same work after it; the gain is their difference, so no remedy
ever promises a rate above the peak:

* **precision** — fp32 and TF32 matrix work (GEMM, convolution, attention) moved to the
  device's fastest 16-bit path (:meth:`.peaks.Peak.best`): at the same share of peak, t
  becomes t × path peak ÷ 16-bit peak. The fp32 time is the larger of the matrix kernels
  named fp32 (every matrix kernel, :mod:`gpudiag.analysis.rank.kernels`) and the shapes'
  fp32 families; the TF32 time is that of the shapes' families on that path.
* **fusion** — the bytes families (normalisation, elementwise): t − bytes ÷ the memory
  bandwidth, the time above what their bytes need at peak (fusion keeps the intermediate
  tensors in registers, which is how that time is recovered).
* **bigger GEMMs** — GEMMs below ``advice.small_gemm_peak_share`` of their path's peak
  whose smallest dimension (M, N or K, median weighted by kernel time) is below
  ``advice.small_gemm_dim``: shapes too small to fill the tiles and the multiprocessors;
  t − FLOPs ÷ the path's peak.
* **channels-last** — convolutions whose operators also launch non-matrix kernels (the
  layout transposes between NCHW and NHWC a library adds for NCHW inputs), unless the
  inputs' strides, where recorded, say channels-last for most of their time: the layout
  kernels' time, at most t − FLOPs ÷ the path's peak.
"""

from __future__ import annotations

from gpudiag.analysis.efficiency.flops import BYTE_FAMILIES
from gpudiag.analysis.efficiency.peaks import Peak, peak_of
from gpudiag.analysis.model.diagnosis import KernelBreakdown
from gpudiag.analysis.model.efficiency import ComputeEfficiency, FamilyEfficiency, Opportunity
from gpudiag.analysis.rank.kernels import MATRIX
from gpudiag.config import AdviceRules


def opportunities(
    eff: ComputeEfficiency | None,
    kernels: KernelBreakdown | None,
    rank_steps: int,
    device: str,
    rules: AdviceRules,
) -> list[Opportunity]:
    """Every remedy's opportunity on this run, largest gain first (module docstring)."""
    peak = peak_of(eff.device if eff is not None else device)
    if peak is None:
        return []
    rows = [f for f in eff.families if not f.above_peak] if eff is not None else []
    steps = eff.steps if eff is not None and eff.steps else 0
    out = [
        o
        for o in (
            _precision(rows, steps, kernels, rank_steps, peak),
            _fusion(rows, steps, peak),
            _bigger_gemms(rows, steps, rules),
            _channels_last(rows, steps),
        )
        if o is not None and o.gain_ns > 0
    ]
    return sorted(out, key=lambda o: -o.gain_ns)


def _per_step(ns: float, steps: int) -> int:
    return round(ns / steps) if steps else 0


def _precision(
    rows: list[FamilyEfficiency],
    steps: int,
    kernels: KernelBreakdown | None,
    rank_steps: int,
    peak: Peak,
) -> Opportunity | None:
    to_path, best = peak.best()
    named = 0
    if kernels is not None and kernels.unit == "kernel" and rank_steps:
        matrix = sum(kernels.families.get(f, 0.0) for f in MATRIX) * kernels.total_ns
        named = _per_step(matrix * kernels.fp32_matrix_share, rank_steps)
    shares: dict[str, float | None] = {"fp32": None, "tf32": None}
    tf32_rows = [f for f in rows if f.family in MATRIX and f.path == "tf32"]
    tf32 = _per_step(sum(f.kernel_ns for f in tf32_rows), steps)
    # the TF32 families' kernels may include some named fp32: counted once, as TF32
    by_path = {"fp32": max(named - tf32, 0), "tf32": tf32}
    shares["tf32"] = _time_weighted(tf32_rows)
    fp32_rows = [f for f in rows if f.family in MATRIX and f.path == "fp32"]
    t = _per_step(sum(f.kernel_ns for f in fp32_rows), steps)
    if t and t >= by_path["fp32"]:
        by_path["fp32"], shares["fp32"] = t, _time_weighted(fp32_rows)
    t_all = at_peak = 0.0
    for p, t in by_path.items():
        path_peak = peak.tflops(p)
        if t and path_peak and best > path_peak:
            t_all += t
            at_peak += t * path_peak / best
    if not t_all:
        return None
    main = max(by_path, key=by_path.__getitem__)
    fams = {f.family for f in rows if f.family in MATRIX and f.path in by_path}
    if by_path["fp32"] and kernels is not None:
        fams |= {f for f in MATRIX if kernels.families.get(f, 0.0) > 0}
    return Opportunity(
        "precision",
        [f for f in MATRIX if f in fams],
        main,
        to_path,
        round(t_all),
        round(at_peak),
        round(t_all - at_peak),
        shares[main],
        "shapes" if shares[main] is not None or main == "tf32" else "kernel names",
    )


def _time_weighted(rows: list[FamilyEfficiency]) -> float | None:
    known = [(f.peak_share, f.kernel_ns) for f in rows if f.peak_share is not None]
    total = sum(w for _, w in known)
    return sum(s * w for s, w in known) / total if total else None


def _fusion(rows: list[FamilyEfficiency], steps: int, peak: Peak) -> Opportunity | None:
    mine = [f for f in rows if f.family in BYTE_FAMILIES and f.bytes and peak.memory_gbps]
    if not mine or not steps:
        return None
    t = sum(f.kernel_ns for f in mine)
    need = sum(f.bytes or 0.0 for f in mine) / peak.memory_gbps  # bytes ÷ GB/s = ns
    return Opportunity(
        "fusion",
        [f.family for f in mine],
        "memory",
        "memory",
        _per_step(t, steps),
        _per_step(need, steps),
        _per_step(t, steps) - _per_step(need, steps),
        _time_weighted(mine),
        "shapes",
    )


def _at_peak_ns(f: FamilyEfficiency) -> float | None:
    """The least time the family's FLOPs take at its path's peak."""
    return (f.flops or 0.0) / (f.peak * 1e3) if f.peak and f.flops else None


def _bigger_gemms(
    rows: list[FamilyEfficiency], steps: int, rules: AdviceRules
) -> Opportunity | None:
    f = next((f for f in rows if f.family == "GEMM"), None)
    if f is None or f.peak_share is None or not f.min_dim_median or not steps:
        return None
    need = _at_peak_ns(f)
    if (
        need is None
        or f.peak_share >= rules.small_gemm_peak_share
        or f.min_dim_median >= rules.small_gemm_dim
    ):
        return None
    t = _per_step(f.kernel_ns, steps)
    return Opportunity(
        "bigger-gemms",
        ["GEMM"],
        f.path,
        f.path,
        t,
        _per_step(need, steps),
        t - _per_step(need, steps),
        f.peak_share,
        "shapes",
    )


def _channels_last(rows: list[FamilyEfficiency], steps: int) -> Opportunity | None:
    f = next((f for f in rows if f.family == "convolution"), None)
    if f is None or not f.layout_ns or not steps:
        return None
    if f.nchw_share is not None and f.nchw_share < 0.5:
        return None  # the strides say the inputs are already channels-last for most of it
    need = _at_peak_ns(f)
    room = f.kernel_ns - need if need is not None else f.kernel_ns
    gain = _per_step(min(f.layout_ns, max(room, 0.0)), steps)
    t = _per_step(f.kernel_ns, steps)
    return Opportunity(
        "channels-last", ["convolution"], f.path, f.path, t, t - gain, gain, f.peak_share, "shapes"
    )
