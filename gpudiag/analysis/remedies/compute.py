"""The remedies for compute-bound runs (the ``compute_bound`` row of the advice table).

No gain is estimated: fusion when elementwise, reduction and normalisation kernels hold
``advice.fusion_share`` of compute, unless the operators' shapes measured the bytes families
against the memory peak; reduced precision (bf16/fp16, TF32, FP8 as the device allows, or a
half-precision inference dtype) when matrix kernels hold ``advice.gemm_share`` of it and
``advice.fp32_gemm_share`` of their time is fp32, on CPUs and on GPUs the peak table does not
know. Elsewhere the ``below_peak`` remedies (:mod:`.efficiency`), whose gains the peak
bounds, take their place.
"""

from typing import TypedDict

from gpudiag.analysis.efficiency.peaks import peak_of
from gpudiag.analysis.model.diagnosis import Finding, Mode
from gpudiag.analysis.model.kinds import TimeUnit
from gpudiag.analysis.model.metrics import ComputeMetrics
from gpudiag.analysis.rank import workload
from gpudiag.analysis.remedies.remedy import Context, Remedy
from gpudiag.analysis.remedies.remedy import compiled as _compiled
from gpudiag.analysis.remedies.remedy import const as _const
from gpudiag.analysis.remedies.remedy import native as _native


def _cm(f: Finding) -> ComputeMetrics:
    return f.metrics_as(ComputeMetrics)


class ComputeEvidence(TypedDict):
    """A compute remedy's evidence: the finding's shares of compute and its top kernels."""

    compute_share: float
    unit: TimeUnit
    fusable_share: float
    gemm_share: float
    fp32_gemm_share: float
    matrix_share: float
    fp32_matrix_share: float
    top: list[str]


def _compute_evidence(f: Finding, _c: Context) -> ComputeEvidence:
    m = _cm(f)
    return ComputeEvidence(
        compute_share=m.compute_share,
        unit=m.unit,
        fusable_share=m.fusable_share,
        gemm_share=m.gemm_share,
        fp32_gemm_share=m.fp32_gemm_share,
        matrix_share=m.matrix_share,
        fp32_matrix_share=m.fp32_matrix_share,
        top=list(m.top),
    )


def _fusion_detail(f: Finding, _c: Context) -> str:
    unit = "operators" if _cm(f).unit == "operator" else "kernels"
    return (
        f"Elementwise, reduction and normalisation {unit} take {_cm(f).fusable_share:.0%} of "
        "compute: each reads and writes its tensors from memory. torch.compile(model) fuses "
        "chains of them into few kernels (Inductor/Triton); fused optimizers (foreach=True or "
        "fused=True) and fused layers (e.g. apex/Transformer Engine LayerNorm, "
        "scaled_dot_product_attention) do the same for common patterns."
    )


def _matrix_text(f: Finding) -> str:
    """Which matrix families hold compute: "GEMMs 40%, convolutions 25%"."""
    fams = _cm(f).families
    parts = [
        (label, float(fams.get(fam, 0.0)))
        for fam, label in (
            ("GEMM", "GEMMs"),
            ("convolution", "convolutions"),
            ("attention", "attention"),
        )
    ]
    shown = [f"{label} {v:.0%}" for label, v in parts if v >= 0.05]
    return ", ".join(shown) or f"matrix kernels {_cm(f).matrix_share:.0%}"


def _precision_title(f: Finding, c: Context) -> str:
    if _cm(f).unit == "operator":
        return "Run the matrix operators in bf16 on the CPU (autocast)"
    return precision_title(c)


def precision_title(c: Context, on_tf32: bool = False) -> str:
    """The precision remedy's title on this device (training or serving).

    ``on_tf32``: the matrix work already runs TF32, so TF32 is no remedy for it.
    """
    dev = c.device()
    if workload.inference(c.workload()):
        half = "bf16" if dev.bf16 else "fp16"
        return f"Serve the model in {half}" + (" or FP8" if dev.fp8 else "")
    if dev.known and not dev.bf16 and dev.fp16:
        return "Train in fp16 mixed precision (autocast with a GradScaler)"
    if dev.known and dev.bf16:
        extra = " or TF32" if dev.tf32 and not on_tf32 else ""
        return f"Run matmuls, convolutions and attention in bf16 (autocast){extra}"
    return "Use mixed precision (autocast) for the fp32 matrix work"


def _speedup(f: Finding, c: Context) -> str:
    """The peak table's bound on what a 16-bit path gives the fp32/TF32 matrix work.

    At the same share of peak, kernels moved from the ``path`` peak to the device's fastest
    16-bit one run ``best ÷ path`` times faster: an upper bound from the table, never more.
    """
    effs = [e.efficiency for e in c.evidence(f.ranks or list(c.ranks)) if e.efficiency is not None]
    if not effs:
        return ""
    e = effs[0]
    peak = peak_of(e.device)
    if peak is None:
        return ""
    best_path, best = peak.best()
    rows = [x for x in e.families if x.tflops is not None and x.path in ("fp32", "tf32")]
    if not rows or not e.steps:
        return ""
    top = max(rows, key=lambda x: x.kernel_ns)
    path_peak = peak.tflops(top.path)
    if not path_peak or best <= path_peak:
        return ""
    ratio = best / path_peak
    per_step = top.kernel_ns / e.steps
    share = f" ({top.peak_share:.0%} of its peak)" if top.peak_share is not None else ""
    return (
        f" Its {top.path} {top.family} kernels run {top.tflops:.3g} TFLOP/s{share} for "
        f"{per_step / 1e6:.1f} ms a step; at the same share of the {best_path} peak they "
        f"would take {per_step / ratio / 1e6:.1f} ms (×{ratio:.1f}, the {peak.model} "
        "peak table's ratio: an upper bound)."
    )


def _precision_detail(f: Finding, c: Context) -> str:
    return _precision_text(f, c) + _speedup(f, c)


def _precision_text(f: Finding, c: Context) -> str:
    cpu = _cm(f).unit == "operator"
    fp32 = max(_cm(f).fp32_matrix_share, _cm(f).fp32_gemm_share)
    text = (
        f"Matrix kernels take {_cm(f).matrix_share:.0%} of compute ({_matrix_text(f)}) "
        f"and {fp32:.0%} of their time runs in full fp32: "
    )
    return text + precision_how(c, cpu)


def precision_how(c: Context, cpu: bool = False, on_tf32: bool = False) -> str:
    """How to move the matrix work to a 16-bit path on this device (training or serving)."""
    text = ""
    if not cpu and workload.inference(c.workload()):
        dev = c.device()
        half = "torch.bfloat16" if dev.bf16 or not dev.known else "torch.float16"
        fp8 = (
            " On this GPU FP8 weights and activations halve the bytes again (the "
            "engine's fp8 quantisation, e.g. vLLM --quantization fp8 or TensorRT-LLM)."
        )
        return text + (
            f"an inference engine needs no loss scaling: load the weights in {half} "
            "(model.to(dtype)) or let the engine pick its half-precision dtype; weight-only "
            "INT8/INT4 quantisation cuts memory traffic further for small batches."
            + (fp8 if dev.fp8 else "")
        )
    if cpu:
        return text + (
            "run the forward pass under torch.autocast('cpu', dtype=torch.bfloat16) on CPUs "
            "with bf16 support (AMX, AVX-512 BF16)."
        )
    dev = c.device()
    on = f"{dev.generation} ({dev.basis})" if dev.known else ""
    if dev.known and not dev.bf16 and dev.fp16:
        return text + (
            f"{on} has fp16 tensor cores but no bf16 or TF32: train under "
            "torch.autocast('cuda', dtype=torch.float16) with a torch.amp.GradScaler to keep "
            "small gradients from underflowing; channels_last memory format helps cuDNN "
            "convolutions use the tensor cores."
        )
    if dev.known and dev.bf16:
        tf32 = (
            (
                " or at least let fp32 matmuls and convolutions use TF32 with "
                "torch.backends.cuda.matmul.allow_tf32 = True and "
                "torch.backends.cudnn.allow_tf32 = True"
            )
            if dev.tf32 and not on_tf32
            else ""
        )
        fp8 = (
            (
                f"; on {dev.generation}, FP8 (Transformer Engine's fp8_autocast, "
                "torchao float8) speeds up large GEMMs further"
            )
            if dev.fp8
            else ""
        )
        return text + (
            f"{on} runs bf16 on its matrix units: train under "
            f"torch.autocast('cuda', dtype=torch.bfloat16) (no loss scaling needed){tf32}"
            f"{fp8}; scaled_dot_product_attention then picks the flash kernels."
        )
    return text + (
        "train under torch.autocast (bf16 where the GPU supports it, else fp16 with a "
        "GradScaler), or let fp32 matmuls use TF32 tensor cores where available "
        "(torch.set_float32_matmul_precision('high'))."
    )


def peak_known(c: Context) -> bool:
    """Every rank's device is in the peak table: below_peak's gains decide the remedies."""
    devices = {d for r in c.ranks.values() for d in r.devices}
    return bool(devices) and all(peak_of(d) is not None for d in devices)


def bytes_measured(c: Context) -> bool:
    """Some rank's efficiency measured a bytes family against a known memory peak."""
    return any(
        f.path == "memory" and f.peak is not None
        for r in c.ranks.values()
        if r.evidence.efficiency is not None
        for f in r.evidence.efficiency.families
    )


def amp_on(c: Context) -> bool:
    """Half-precision kernels already hold ``advice.amp_on_share`` of compute."""
    return c.low_precision_share() >= c.rules.amp_on_share


COMPUTE = (
    Remedy(
        id=_const("fuse-kernels"),
        title=_const("Fuse elementwise and normalisation work with torch.compile"),
        detail=_fusion_detail,
        gain=lambda f, c: None,
        evidence=_compute_evidence,
        applies=lambda f, c: (
            _cm(f).fusable_share >= c.rules.fusion_share
            and not _native(c)
            and not _compiled(c)
            and not bytes_measured(c)
        ),
    ),
    Remedy(
        id=_const("reduced-precision"),
        title=_precision_title,
        detail=_precision_detail,
        gain=lambda f, c: None,
        evidence=lambda f, c: {
            **_compute_evidence(f, c),
            "device": c.device().as_dict(),
            "low_precision_share": c.low_precision_share(),
        },
        applies=lambda f, c: (
            _cm(f).matrix_share >= c.rules.gemm_share
            and max(_cm(f).fp32_matrix_share, _cm(f).fp32_gemm_share) >= c.rules.fp32_gemm_share
            and not amp_on(c)
            and not _native(c)
            and (not c.device().known or c.device().fp16)
            and not (c.run.mode == Mode.GPU and peak_known(c))
        ),
    ),
)
