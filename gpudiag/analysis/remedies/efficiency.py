"""The remedies from efficiency: the ``below_peak`` row, and the link topology of ``low_bandwidth``.

Each ``below_peak`` remedy applies when its opportunity is in the finding (its gain, bounded
by the device's peak, reached ``advice.min_gain_share`` of the median step:
:mod:`gpudiag.analysis.efficiency.gains`) and its gain is that opportunity's. The topology
remedy of a ``low_bandwidth`` bucket gains the bucket's transfer time a step above what its
bytes need at the link's peak — t × (1 − busbw ÷ peak) — at most the exposed communication
wait, and applies under the same minimum gain.
"""

from __future__ import annotations

from typing import Any

from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import Finding
from gpudiag.analysis.model.efficiency import Opportunity
from gpudiag.analysis.model.metrics import BandwidthMetrics, BelowPeakMetrics
from gpudiag.analysis.remedies.compute import amp_on, precision_how, precision_title
from gpudiag.analysis.remedies.remedy import Context, Evidence, Remedy, Text
from gpudiag.analysis.remedies.remedy import compiled as _compiled
from gpudiag.analysis.remedies.remedy import const as _const
from gpudiag.analysis.remedies.remedy import native as _native


def _op(f: Finding, remedy: str) -> Opportunity | None:
    m = f.metrics
    if not isinstance(m, BelowPeakMetrics):
        return None
    return next((o for o in m.opportunities if o.remedy == remedy), None)


def _ms(ns: float) -> str:
    return words.duration(ns, "ms")


def _bound(o: Opportunity, f: Finding) -> str:
    m = f.metrics_as(BelowPeakMetrics)
    return (
        f"{_ms(o.kernel_ns)} a step now, {_ms(o.at_peak_ns)} at the {m.peak_model} peak "
        "table's bound: up to "
        f"{_ms(o.gain_ns)} a step (an upper bound; the peak is never exceeded)."
    )


def _share(o: Opportunity) -> str:
    return f", {o.peak_share:.0%} of its peak" if o.peak_share is not None else ""


_BASIS = {"shapes": "the operators' shapes", "kernel names": "the kernels' names"}


def _evidence(remedy: str) -> Evidence:
    def evidence(f: Finding, _c: Context) -> dict[str, object]:
        o = _op(f, remedy)
        m = f.metrics_as(BelowPeakMetrics)
        return {
            "device": m.device,
            "peak_model": m.peak_model,
            "min_gain_share": m.min_gain_share,
            **({} if o is None else o.__dict__),
        }

    return evidence


def _gain(remedy: str) -> Any:
    def gain(f: Finding, _c: Context) -> int | None:
        o = _op(f, remedy)
        return o.gain_ns if o is not None else None

    return gain


def _on_tf32(f: Finding) -> bool:
    o = _op(f, "precision")
    return o is not None and o.path == "tf32"


def _precision_detail(f: Finding, c: Context) -> str:
    o = _op(f, "precision")
    assert o is not None
    fams = ", ".join(o.families)
    how = precision_how(c, on_tf32=o.path == "tf32")
    return (
        f"The {o.path} matrix work ({fams}{_share(o)}; read from {_BASIS[o.basis]}) would run "
        f"{o.kernel_ns / max(o.at_peak_ns, 1):.1f}× faster at the same share of the "
        f"{o.to_path} peak: {_bound(o, f)} {how[:1].upper()}{how[1:]}"
    )


def _fusion_detail(f: Finding, _c: Context) -> str:
    o = _op(f, "fusion")
    assert o is not None
    return (
        f"The {' and '.join(o.families)} operators move their tensors through memory at "
        f"{o.peak_share or 0:.0%} of its bandwidth, each reading and writing every tensor: "
        f"{_bound(o, f)} torch.compile(model) fuses chains of them into few kernels "
        "(Inductor/Triton) that keep the intermediate tensors in registers; fused layers "
        "(apex/Transformer Engine LayerNorm, fused RMSNorm, fused optimizers with fused=True) "
        "do the same for common patterns."
    )


def _gemm_detail(f: Finding, c: Context) -> str:
    o = _op(f, "bigger-gemms")
    assert o is not None
    return (
        f"The GEMMs run at {o.peak_share or 0:.0%} of the {o.path} peak with small shapes "
        f"(their smallest of M, N and K is below {c.rules.small_gemm_dim} for half their "
        "time): too few output tiles to fill the multiprocessors, and too short a K to hide "
        f"the loads. {_bound(o, f)} Give them larger shapes: more tokens or samples per "
        "micro-batch (gradient accumulation keeps the global batch), one matmul for the "
        "query, key and value projections (or the MLP's gate and up) instead of several, "
        "torch.bmm or grouped GEMMs for many small products, and dimensions in multiples "
        "of 64."
    )


def _conv_detail(f: Finding, _c: Context) -> str:
    o = _op(f, "channels-last")
    assert o is not None
    return (
        "The convolution operators launch layout kernels (transposes between NCHW and NHWC) "
        f"beside their convolutions, {_ms(o.gain_ns)} a step: their inputs are NCHW and "
        "the library converts them for its NHWC kernels. Convert the model and its inputs "
        "once — model.to(memory_format=torch.channels_last) and "
        "x.to(memory_format=torch.channels_last) — and the conversions go (with autocast, "
        f"the tensor-core kernels want NHWC): {_bound(o, f)}"
    )


def _applies(remedy: str) -> Any:
    def applies(f: Finding, c: Context) -> bool:
        if _op(f, remedy) is None or _native(c):
            return False
        if remedy == "precision":
            return not amp_on(c)
        return not (remedy == "fusion" and _compiled(c))

    return applies


def _from_peak(remedy: str, rid: str, title: Text, detail: Text) -> Remedy:
    """A remedy answering one opportunity of ``below_peak``: its gain, evidence and test."""
    return Remedy(
        id=_const(rid),
        title=title,
        detail=detail,
        gain=_gain(remedy),
        evidence=_evidence(remedy),
        applies=_applies(remedy),
    )


BELOW_PEAK = (
    _from_peak(
        "precision",
        "reduced-precision",
        lambda f, c: precision_title(c, _on_tf32(f)),
        _precision_detail,
    ),
    _from_peak(
        "fusion",
        "fuse-kernels",
        _const("Fuse elementwise and normalisation work with torch.compile"),
        _fusion_detail,
    ),
    _from_peak(
        "bigger-gemms",
        "bigger-gemms",
        _const("Give the GEMMs larger shapes: more work per matmul"),
        _gemm_detail,
    ),
    _from_peak(
        "channels-last",
        "channels-last",
        _const("Run the convolutions in channels-last memory format"),
        _conv_detail,
    ),
)


# ---- the link of a low_bandwidth bucket ----


def _bw(f: Finding) -> BandwidthMetrics:
    return f.metrics_as(BandwidthMetrics)


def _link_gain(f: Finding, c: Context) -> int | None:
    m = _bw(f)
    steps = c.run.steps / max(c.run.ranks, 1)
    if not m.transfer_ns_median or not steps:
        return None
    per_step = m.count * m.transfer_ns_median / steps
    exposed = c.median_part(list(c.ranks), "comm_wait_ns")
    return round(min(per_step * (1 - min(m.efficiency, 1.0)), exposed)) or None


def _link_detail(f: Finding, c: Context) -> str:
    m = _bw(f)
    cause = m.likely_cause or ""
    if "inter-node" in cause:
        how = (
            "keep the groups that move the most bytes (tensor parallel, experts) inside one "
            "host, use hierarchical collectives across hosts (HSDP, 2-D process groups), and "
            "check the network path (NCCL_DEBUG=INFO: IB/RoCE with GPUDirect RDMA, not TCP)."
        )
    elif "peer-to-peer" in cause:
        how = (
            "without P2P, NCCL stages every transfer through host memory. Check that "
            "NCCL_P2P_DISABLE is not set and P2P is allowed (`nvidia-smi topo -p2p r`; IOMMU "
            "or PCIe ACS can block it), put the group on GPUs under one PCIe switch, or use "
            "GPUs with peer-to-peer or NVLink for the bandwidth-heavy groups; else shrink the "
            "traffic (data parallel instead of tensor parallel across these cards)."
        )
    elif "PCIe" in cause:
        how = (
            "place the group's ranks on GPUs joined by NVLink (`nvidia-smi topo -m`; set "
            "CUDA_VISIBLE_DEVICES or the launcher's GPU binding) and keep tensor-parallel "
            "groups inside one NVLink domain."
        )
    else:
        how = (
            "check the transport NCCL picked (NCCL_DEBUG=INFO), the ranks-to-GPUs binding "
            "against `nvidia-smi topo -m`, and other traffic sharing the link."
        )
    gain = _link_gain(f, c) or 0
    return (
        f"{m.type} of {m.size_bucket} reaches {m.busbw_gbps:.1f} GB/s bus bandwidth, "
        f"{m.efficiency:.0%} of the {m.peak_gbps:.0f} GB/s {m.link or 'link'} peak"
        + (f" ({cause})" if cause else "")
        + f": at the link's peak its transfers would take up to {_ms(gain)} less a step "
        "(at most the exposed communication wait). To fix: " + how
    )


TOPOLOGY = Remedy(
    id=_const("link-topology"),
    title=lambda f, c: f"Move the {_bw(f).type} traffic onto a faster link",
    detail=_link_detail,
    gain=_link_gain,
    evidence=lambda f, c: {
        **_bw(f).to_json(),
        "exposed_comm_wait_ns": c.median_part(list(c.ranks), "comm_wait_ns"),
    },
    applies=lambda f, c: (_link_gain(f, c) or 0) >= c.rules.min_gain_share * c.step_ns,
)
