"""How close to the hardware a rank ran: achieved FLOP/s and bandwidth against the peak."""

from __future__ import annotations

from gpudiag._support.records import dataclass


@dataclass(frozen=True)
class FamilyEfficiency:
    """One operator family's modelled work over the GPU time of the kernels it launched.

    FLOP families (GEMM, convolution, attention) have ``tflops``; bytes families
    (normalisation, elementwise) have ``gbps``; ``peak_share`` is against the device's peak
    for ``path`` (FLOP families) or its memory bandwidth (bytes families), None when the
    device is unknown or the figure would exceed the table's peak (``above_peak``: the
    shapes or the device were misread, so no share is claimed).
    """

    family: str
    path: str  # "fp32", "tf32", "bf16", "fp16", "fp8", "fp64", "" (unknown); bytes: "memory"
    path_basis: str  # "inputs", "kernel names", "above the fp32 peak", ""
    ops: int
    kernel_ns: int
    flops: float | None
    bytes: float | None
    tflops: float | None
    gbps: float | None
    peak: float | None  # TFLOP/s (FLOP families) or GB/s (bytes families)
    peak_share: float | None
    above_peak: bool = False


@dataclass(frozen=True)
class ComputeEfficiency:
    """The rank's compute against its device: per family, and one model-level figure.

    ``model_tflops``: the modelled FLOPs of the analysed steps per median step time (the
    MFU numerator, FLOPs of the operators the trace recorded, not of a model definition);
    ``mfu``: that over the device's fastest 16-bit peak (``mfu_path``), ``path_share`` over
    the peak of the path the FLOPs ran on (``main_path``).
    """

    device: str  # the device name as the trace gives it
    peak_model: str  # the peak table's entry, "" when the device is not in it
    families: list[FamilyEfficiency]
    coverage: float  # of the compute kernels' time in the steps, launched by modelled ops
    steps: int
    flops_per_step: float | None
    model_tflops: float | None
    main_path: str
    path_share: float | None
    mfu: float | None
    mfu_path: str
