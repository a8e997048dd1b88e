"""The remedies from efficiency: gains hand-computed from the peak table, and no cliff.

Truth here is arithmetic on the A100 SXM4's published peaks (fp32 19.5, TF32 156, bf16 312
TFLOP/s; 1555 GB/s; the peak table's entry), written out in each test, not read from
gpudiag's table.
"""

from __future__ import annotations

import pytest

from gpudiag.analysis.efficiency.gains import opportunities
from gpudiag.analysis.findings.compute import below_peak
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    KernelBreakdown,
    Mode,
    RankEvidence,
    RankSummary,
    RunSummary,
    Severity,
    Shares,
    StepBreakdown,
)
from gpudiag.analysis.model.efficiency import ComputeEfficiency, FamilyEfficiency
from gpudiag.analysis.model.kinds import StepSource
from gpudiag.analysis.model.metrics import BandwidthMetrics
from gpudiag.analysis.remedies.advice import recommend
from gpudiag.config import AdviceRules

A100 = "NVIDIA A100-SXM4-40GB"
MS = 1_000_000
RULES = AdviceRules()


def _fam(family: str, path: str, ns: int, flops: float = 0.0, nbytes: float = 0.0, **kw):
    peak = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "memory": 1555.0}[path]
    if path == "memory":
        gbps = nbytes / ns
        return FamilyEfficiency(
            family, path, "", 1, ns, None, nbytes, None, gbps, peak, gbps / peak, **kw
        )
    tflops = flops / ns / 1e3
    return FamilyEfficiency(
        family, path, "inputs", 1, ns, flops, None, tflops, None, peak, tflops / peak, **kw
    )


def _eff(*fams: FamilyEfficiency, steps: int = 2) -> ComputeEfficiency:
    return ComputeEfficiency(
        A100, "A100 SXM4", list(fams), 1.0, steps, None, None, "", None, None, ""
    )


def _by(ops, remedy):
    return next(o for o in ops if o.remedy == remedy)


def test_each_gain_is_the_time_above_the_peak_computed_by_hand() -> None:
    # GIVEN two steps of: TF32 GEMMs 20 ms with 1.248e12 FLOPs and a smallest dimension of
    # 128; elementwise 10 ms moving 3.11e9 bytes; convolutions 8 ms (3 ms of it layout
    # kernels) of 0.39e12 bf16 FLOPs
    eff = _eff(
        _fam("GEMM", "tf32", 20 * MS, 1.248e12, min_dim_median=128),
        _fam("convolution", "bf16", 8 * MS, 0.39e12, layout_ns=3 * MS),
        _fam("elementwise", "memory", 10 * MS, nbytes=3.11e9),
    )
    ops = opportunities(eff, None, 2, A100, RULES)
    # precision: TF32 → bf16 at the same share of peak, × 156/312: 10 ms → 5 ms a step
    p = _by(ops, "precision")
    assert (p.path, p.to_path, p.kernel_ns, p.at_peak_ns, p.gain_ns) == (
        "tf32",
        "bf16",
        10 * MS,
        5 * MS,
        5 * MS,
    )
    # fusion: 3.11e9 B at 1555 GB/s = 2 ms for two steps, 1 ms a step; 5 ms a step now
    f = _by(ops, "fusion")
    assert (f.kernel_ns, f.at_peak_ns, f.gain_ns) == (5 * MS, 1 * MS, 4 * MS)
    # bigger GEMMs (40 TFLOP/s = 26% of 156, smallest dimension 128 < 512): 1.248e12 at
    # 156 TFLOP/s = 8 ms, 4 ms a step; 10 ms a step now
    g = _by(ops, "bigger-gemms")
    assert (g.kernel_ns, g.at_peak_ns, g.gain_ns) == (10 * MS, 4 * MS, 6 * MS)
    # channels-last: the layout kernels (3 ms, 1.5 ms a step), within the room the peak
    # leaves (8 ms − 0.39e12 / 312e12 s = 6.75 ms)
    c = _by(ops, "channels-last")
    assert (c.kernel_ns, c.gain_ns) == (4 * MS, 1_500_000)
    # no gain ever asks for more than the peak: the time left is at least the peak's
    for o in ops:
        assert 0 < o.gain_ns <= o.kernel_ns and o.at_peak_ns > 0


def test_bigger_gemms_need_small_shapes_and_a_low_share() -> None:
    large = _eff(_fam("GEMM", "bf16", 20 * MS, 1.248e12, min_dim_median=4096))
    assert all(o.remedy != "bigger-gemms" for o in opportunities(large, None, 2, A100, RULES))
    fast = _eff(_fam("GEMM", "bf16", 10 * MS, 2.5e12, min_dim_median=128))  # 80% of peak
    assert all(o.remedy != "bigger-gemms" for o in opportunities(fast, None, 2, A100, RULES))


def _rank(compute_share: float, step_ns: int, attention_fp32_ns: int) -> RankSummary:
    total = 6 * attention_fp32_ns / 0.85  # fp32 attention: 85% of the kernel time, 6 steps
    kernels = KernelBreakdown(
        "kernel", round(total), [], {"attention": 0.85, "elementwise": 0.15}, 0.0, 1.0
    )
    ev = RankEvidence(kernels=kernels)
    return RankSummary(
        0,
        6,
        step_ns,
        step_ns,
        Shares(compute_share, 0.0, 0.0, 1 - compute_share),
        0.0,
        None,
        1 - compute_share,
        Mode.GPU,
        StepSource.PROFILER_STEP,
        "x",
        devices=[A100],
        evidence=ev,
    )


def _precision(compute_share: float) -> int | None:
    step = 100 * MS
    rank = _rank(compute_share, step, round(0.85 * compute_share * step))
    run = RunSummary(1, 1, 6, step, step, rank.shares, 0.0, 1 - compute_share, Mode.GPU)
    findings = below_peak(run, [rank], rank.evidence.kernels, RULES)
    recs = recommend(run, [rank], [], findings, None, RULES)
    rec = next((r for r in recs if r.id == "reduced-precision"), None)
    return rec.estimated_gain_ns if rec is not None else None


def test_precision_advice_has_no_compute_share_cliff() -> None:
    # GIVEN fp32 attention kernels for 85% of compute, compute swept from 5% to 95% of a
    # 100 ms step; fp32 → bf16 on an A100 is × 19.5/312, so the gain is
    # share × 0.85 × 100 ms × (1 − 19.5/312), one line through the origin
    shares = [round(0.05 + 0.01 * i, 3) for i in range(91)] + [0.694, 0.703]
    for s in sorted(shares):
        gain = _precision(s)
        expected = s * 0.85 * 100 * MS * (1 - 19.5 / 312)
        if expected >= RULES.min_gain_share * 100 * MS + 1000:
            assert gain == pytest.approx(expected, rel=1e-3), s
        elif expected < RULES.min_gain_share * 100 * MS - 1000:
            assert gain is None, s  # under the minimum gain: no advice, at any share
    # the old cut-off's two sides: advised alike, gains in proportion to the share
    below, above = _precision(0.694), _precision(0.703)
    assert below and above and above / below == pytest.approx(0.703 / 0.694, rel=1e-3)


def test_a_low_bandwidth_bucket_gains_its_time_above_the_link_peak() -> None:
    # 12 calls over 6 steps of 4 ms each at 20% of the link: 2 × 4 ms × 0.8 = 6.4 ms a step,
    # within the 30 ms of communication wait
    step = 100 * MS
    m = BandwidthMetrics(
        "allreduce", "16-256MiB", 12, 64 << 20, 60.0, 300.0, 0.2, 4 * MS, "NVLink 3", None
    )
    f = Finding(FindingKind.LOW_BANDWIDTH, Severity.WARNING, "slow link", metrics=m)
    rank = _rank(0.6, step, 10 * MS)
    run = RunSummary(1, 1, 6, step, step, Shares(0.6, 0.3, 0.0, 0.1), 0.0, 0.4, Mode.GPU)
    steps = [StepBreakdown(0, i, i * step, step, 60 * MS, 30 * MS, 0, 10 * MS, 0) for i in range(6)]
    (rec,) = recommend(run, [rank], steps, [f], None, RULES)
    assert rec.id == "link-topology" and rec.estimated_gain_ns == 6_400_000
    # capped by the exposed wait
    short = [StepBreakdown(0, i, i * step, step, 96 * MS, 2 * MS, 0, 2 * MS, 0) for i in range(6)]
    assert recommend(run, [rank], short, [f], None, RULES) == []  # 2 ms: under 5% of a step


def test_a_convolution_input_layout_comes_from_its_strides() -> None:
    from gpudiag.analysis.efficiency.flops import op_work

    dims = "[[10, 256, 14, 14], [512, 256, 3, 3], [], [], [], [], [], [], []]"
    types = '["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]'
    conc = '["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]'

    def layout(strides: str) -> str:
        w = op_work("aten::convolution", f"{dims}\n{types}\n{conc}\n{strides}")
        assert w is not None
        return w.layout

    # contiguous NCHW: W innermost; channels-last: C innermost (stride 1), then W, H, N
    assert layout("[[50176, 196, 14, 1], [2304, 9, 3, 1]]") == "nchw"
    assert layout("[[50176, 1, 3584, 256], [2304, 1, 768, 256]]") == "nhwc"
    assert layout("") == ""  # no strides recorded: unknown, not guessed


def test_channels_last_only_for_inputs_not_already_channels_last() -> None:
    conv = {"layout_ns": 3 * MS}
    nchw = _eff(_fam("convolution", "bf16", 8 * MS, 0.39e12, nchw_share=1.0, **conv))
    nhwc = _eff(_fam("convolution", "bf16", 8 * MS, 0.39e12, nchw_share=0.0, **conv))
    assert any(o.remedy == "channels-last" for o in opportunities(nchw, None, 2, A100, RULES))
    assert all(o.remedy != "channels-last" for o in opportunities(nhwc, None, 2, A100, RULES))


def test_remedies_overlap_only_where_they_act_on_the_same_kernels() -> None:
    # the hand-built run of the first test, on one rank with a 40 ms step
    eff = _eff(
        _fam("GEMM", "tf32", 20 * MS, 1.248e12, min_dim_median=128),
        _fam("elementwise", "memory", 10 * MS, nbytes=3.11e9),
    )
    rank = _rank(0.5, 40 * MS, 1)
    rank = RankSummary(**{**rank.__dict__, "steps": 2, "evidence": RankEvidence(efficiency=eff)})
    run = RunSummary(1, 1, 2, 40 * MS, 40 * MS, rank.shares, 0.0, 0.5, Mode.GPU)
    (f,) = below_peak(run, [rank], None, RULES)
    recs = {r.id: r for r in recommend(run, [rank], [], [f], None, RULES)}
    assert {k: r.estimated_gain_ns for k, r in recs.items()} == {
        "bigger-gemms": 6 * MS,
        "reduced-precision": 5 * MS,
        "fuse-kernels": 4 * MS,
    }
    # both speed the GEMMs: not additive; fusion acts on other kernels
    assert recs["bigger-gemms"].overlaps_with == ["reduced-precision"]
    assert recs["fuse-kernels"].overlaps_with == []
