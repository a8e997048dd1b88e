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
    # GEMM: the smallest of M, N and K of its operators, median weighted by kernel time
    min_dim_median: int | None = None
    # convolution: GPU time of the kernels its operators launched that are no matrix kernels
    # (layout transposes between NCHW and NHWC, casts): what channels-last takes away
    layout_ns: int | None = None
    # convolution: the share of its kernel time whose inputs' strides say NCHW; None when
    # the trace records no strides
    nchw_share: float | None = None


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


@dataclass(frozen=True)
class Opportunity:
    """Time a step spends above what one remedy's work needs at the device's peak.

    ``kernel_ns`` is the GPU time a step of the families the remedy acts on;
    ``at_peak_ns`` the least time the peak table allows the same work after the remedy
    (its FLOPs at the target path's peak, its bytes at the memory bandwidth, or the time
    without the layout kernels); ``gain_ns`` their difference: an upper bound, never a
    speed-up above the peak.
    """

    remedy: str  # "precision", "fusion", "bigger-gemms", "channels-last"
    families: list[str]
    path: str  # the path the work runs on now ("fp32", "tf32", "bf16", "memory" …)
    to_path: str  # the path the remedy moves it to (precision), else ``path``
    kernel_ns: int  # a step's GPU time in those families (mean over the ranks' steps)
    at_peak_ns: int
    gain_ns: int
    peak_share: float | None  # of the current path's peak, where measured
    basis: str  # "shapes" (operators' inputs) or "kernel names"
