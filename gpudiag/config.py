"""Thresholds and matching rules: defaults → ``[tool.gpudiag]`` in pyproject.toml → the CLI.

Every number and pattern that can change a verdict lives here, grouped by the analysis
that uses it, and is recorded in each Diagnosis (``thresholds``) so that a verdict can be
reproduced. docs/definitions.md explains each one; the analysis modules never carry a
rule constant of their own.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import field, fields
from pathlib import Path
from typing import Any

from gpudiag._support.records import asdict, dataclass
from gpudiag.errors import UsageError

# One classification of communication, used by the shares, the kernel families and the
# collectives: a GPU kernel is communication when its name matches one library's pattern
# below (names may start with ``void`` and a namespace, as demangled signatures do).
COMM_KERNEL_LIBRARIES: tuple[tuple[str, str], ...] = (
    # NVIDIA NCCL ≤2.18 ncclKernel_*, ≥2.19 ncclDevKernel_*, ≥2.27 ncclSymDevKernel_*; AMD
    # RCCL keeps the prefix (ncclDevKernel_Generic) and adds rccl*/MSCCL kernels.
    ("NCCL/RCCL", r"^(?:void\s+)?(?:nccl|rccl|msccl)"),
    # NVLink SHARP / multimem and one-/two-shot all-reduce kernels over symmetric memory
    # (torch SymmetricMemory, vLLM's custom all-reduce).
    (
        "NVLS/multimem",
        r"\bmultimem_\w*(?:all_?reduce|all_?gather|reduce_?scatter)"
        r"|\b(?:one|two)_shot_all_reduce\w*|\bcross_device_reduce_[12]stage",
    ),
    # DeepEP's expert-parallel kernels, by namespace: dispatch/combine/notify of
    # deep_ep::intranode, ::internode and ::internode_ll (not any kernel named "combine").
    (
        "DeepEP",
        r"\bdeep_ep::(?:intranode|internode)\w*::(?:\w*notify\w*|dispatch|combine"
        r"|clean_low_latency_buffer)\b",
    ),
    # NVSHMEM's own kernels (collectives, barriers, proxies).
    ("NVSHMEM", r"^(?:void\s+)?nvshmemi?x?_"),
)
DEFAULT_COMM_KERNEL_RE = "|".join(f"(?:{p})" for _, p in COMM_KERNEL_LIBRARIES)
# Host ranges that *are* one collective operation of a backend (gloo's threads, c10d's
# ``nccl:*`` ranges): what cross-rank matching counts on a CPU trace.
DEFAULT_COMM_OP_RE = r"^(nccl|gloo|mpi|ucc):"
# Host-side ranges that mean "this thread is inside a collective": the operations above and
# the wrappers around them (c10d ops, record_param_comms, gpudiag's own NVTX range).
# MPI calls count too: ``MPI_*`` ranges (NVTX, OS runtime, Nsight's MPI trace tables) and
# a range named just ``MPI`` (the usual NVTX label around an application's MPI calls) —
# not MPI's set-up and query calls (MPI_Init can take seconds and moves no data).
DEFAULT_COMM_HOST_RE = (
    r"^(nccl:|gloo:|mpi:|ucc:|c10d::|record_param_comms$|gpudiag\.comm$|"
    r"ProcessGroup(NCCL|Gloo|MPI)?::|torch\.distributed\.(all_reduce|all_gather|broadcast|"
    r"reduce_scatter|barrier|all_to_all)|MPI$|P?MPI_(?!(Init|Init_thread|Initialized|Finalize|"
    r"Finalized|Wtime|Wtick|Comm_rank|Comm_size|Abort)$)[A-Z]\w*$)"
)
# Host communication calls that block the calling thread while the data moves (no GPU
# kernel stands for them): on GPU traces, when the training thread is inside one, that time
# is communication (MPI, gloo, UCC). NCCL's host ranges only enqueue kernels and do not count.
# Runtime and driver calls that launch a kernel or a graph: each has GPU work linked to it.
LAUNCH_CALL_RE = r"^(cu|cuda|hip|hipExt|hipModule)\w*Launch\w*$"
HOST_COMM_CALL_RE = r"^(gloo:|mpi:|ucc:|MPI$|P?MPI_[A-Z])"
DEFAULT_DATA_RE = r"^enumerate\((DataLoader|DataPipe)\)#|^## data_load ##$|^gpudiag\.data$"
# Step ranges recognised without --step-marker: PyTorch's ProfilerStep#N and gpudiag's own
# NVTX range ``gpudiag.step#N`` (collect/hook.py).
AUTO_STEP_RE = r"^(?:ProfilerStep|gpudiag\.step)#(\d+)$"
# Host operators whose recorded inputs (``record_shapes``) the loaders keep: the families
# that analysis/efficiency models (matrix products, convolutions, attention, normalisation,
# softmax, elementwise arithmetic) and the communication operators, whose input sizes give
# a collective's bytes when the library's own annotation lacks them.
SHAPED_OP_RE = (
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv"
    r"|convolution|_convolution|conv[123]d|cudnn_convolution|miopen_convolution"
    r"|convolution_backward|_scaled_dot_product_\w+|scaled_dot_product_attention"
    r"|_flash_attention_\w+|_efficient_attention_\w+"
    r"|native_layer_norm|layer_norm|native_layer_norm_backward|native_batch_norm|batch_norm"
    r"|native_group_norm|group_norm|rms_norm|_fused_rms_norm|softmax|_softmax|log_softmax"
    r"|_log_softmax|_softmax_backward_data|add|add_|mul|mul_|sub|sub_|div|div_|relu|relu_"
    r"|gelu|gelu_backward|silu|silu_backward|sigmoid|tanh|threshold_backward|native_dropout"
    r"|dropout)$"
    r"|^(c10d::|nccl:|gloo:|record_param_comms$)"
)


@dataclass(frozen=True)
class StragglerRules:
    """When a rank is a straggler, of which kind, and why (analysis/stragglers.py)."""

    excess_ratio: float = 0.10  # a slow step: busy time above the others' by this × a step
    persistent_alpha: float = 0.1  # persistent: ahead of the others in more steps than chance
    min_persistent_steps: int = 4  # ... (a sign test) with at least this many steps compared
    short_window_steps: int = 12  # fewer steps: stalls are named, not called periodic
    short_window_stall_share: float = 0.5  # ... nor persistent when they hold this much excess
    spike_ratio: float = 0.25  # an intermittent stall: at least this × a step ...
    jitter_sigmas: float = 3.5  # ... and this many robust standard deviations of all excesses
    min_spikes: int = 3  # stalls must recur this often (unless one lasts a whole step)
    also_ratio: float = 0.5  # a second part this large (× the cause's) is named too ...
    also_step_ratio: float = 0.05  # ... when it is at least this share of a step
    lean_steps_ratio: float = 0.8  # a trace-window straggler needs telemetry leaning its way
    lean_excess_ratio: float = 0.03  # in this share of steps, by this median share of a step
    clock_deficit_ratio: float = 0.10  # a GPU clocked this much below the others: hardware
    slowdown_ratio: float = 0.10  # share of NVML samples with a driver slowdown: hardware
    sync_wait_share: float = 0.5  # comm-wait mostly waiting for other ranks above this
    # who is to blame on a busy host: the job's own straggler when its excess persists ...
    own_steps_ratio: float = 0.8  # ... slow in at least this share of the compared steps,
    own_moved_ratio: float = 0.1  # ... another rank slow in at most this share (else: moves)
    own_spread_ratio: float = 0.5  # ... and its excess's robust spread / median at most this
    # follows the contention over time (conditions samples, telemetry steps): at least this
    # many steps with a sample, the contention's p90 − p10 over them at least this share of
    # the CPUs, and the rank correlation of the excess with it at least this
    follow_min_steps: int = 8
    follow_min_range: float = 0.1
    follow_rho: float = 0.5


@dataclass(frozen=True)
class SteadyRules:
    """Which steps count as the job's steady state (analysis/reading/steady.py)."""

    warmup_factor: float = 3.0  # leading steps slower than this × the rest's median: warm-up
    warmup_steps: int = 1  # the telemetry's first steps of each rank always left out ...
    warmup_min_steps: int = 3  # ... either only when at least this many steps remain
    include_warmup: bool = False  # --include-warmup: keep everything
    mode_gap_factor: float = 1.5  # sorted steps this far apart: two kinds of step (modes.py)
    mode_min_share: float = 0.2  # ... each kind at least this share of the steps
    # a rank's pre-forward floor (this quantile of its steady steps' pre-forward phases):
    # the phase's growth above it is input wait (analysis/run/phases.py)
    input_floor_quantile: float = 0.1


@dataclass(frozen=True)
class CollectiveRules:
    """Bandwidth findings on matched collectives (analysis/collectives.py)."""

    low_bandwidth_ratio: float = 0.25  # bus bandwidth below this share of the link peak
    large_message_bytes: int = 1 << 20  # only for messages at least this large
    late_wait_ns: int = 10_000  # the others waited at least this for the last rank: "late"
    late_share: float = 0.5  # a rank last at this share of the collectives is *the* late one


@dataclass(frozen=True)
class PipelineRules:
    """Pipeline stages and their bubble (analysis/pipeline.py)."""

    min_p2p_share: float = 0.8  # a stage communicates (almost) only by send/recv
    micro_batches_per_stage: int = 4  # the usual target: m ≥ this × stages
    imbalance_margin: float = 0.10  # measured bubble above the schedule's by this: unbalanced


@dataclass(frozen=True)
class AdviceRules:
    """Remedies and their estimated gains (analysis/advice.py)."""

    accumulation_micro_batches: int = 4  # the k shown for gradient accumulation
    min_transfer_share: float = 0.1  # comm remedies need this share of the wait to be transfer
    # the what-if adds the mean step when a change's saving there is this share of a step
    # away from its saving on the median step (analysis/run/whatif.py)
    what_if_mean_gap_ratio: float = 0.05
    launch_gap_ns: int = 100_000  # GPU-idle gaps shorter than this inside a step: launches
    launch_bound_share: float = 0.5  # CUDA graphs / fusion need this share of "other" in them
    compute_bound_share: float = 0.7  # compute at least this share of step time: compute-bound
    fusion_share: float = 0.4  # elementwise + reduction + normalisation of compute: fuse them
    gemm_share: float = 0.2  # GEMMs at least this share of compute for a precision remedy …
    fp32_gemm_share: float = 0.5  # … and at least this share of GEMM time in fp32 kernels
    # (those two only where the device's peak is unknown: below_peak's gains decide otherwise)
    # an efficiency remedy (below_peak) needs its gain, bounded by the peak, this share of a step
    min_gain_share: float = 0.05
    small_gemm_dim: int = 512  # GEMMs whose smallest of M, N, K (time-weighted median) is below …
    small_gemm_peak_share: float = 0.5  # … and below this share of their peak: bigger GEMMs
    host_cause_share: float = 0.25  # a class of runtime calls this share of "other": the cause
    launch_min_kernels: int = 20  # launch-bound: at least this many kernels a step …
    short_kernel_ns: int = 50_000  # … with a median duration at most this …
    launch_interval_ns: int = 150_000  # … issued at most this far apart on average
    # host threads inside operators with the GPU idle this share of "other": eager overhead
    eager_op_share: float = 0.5
    amp_on_share: float = 0.3  # half-precision kernels this share of compute: AMP already on
    exposed_copy_share: float = 0.1  # copies with nothing computing this share of a step
    copy_over_compute: float = 2.0  # copies alone ≥ this × compute a step: move less data
    pageable_copy_share: float = 0.5  # pageable copies this share of copy time: "pageable"
    # a blocking sync/copy call with the GPU still running work this share of its time acts
    # as a synchronisation: no gain from it, told as a device-to-host read
    gpu_busy_share: float = 0.5
    per_element_calls: int = 256  # blocking copies a step, at least this many …
    per_element_bytes: int = 64  # … of a median size at most this: a per-element loop
    many_allreduce_calls: int = 100  # all-reduces a step from which … (DDP: larger buckets)
    small_allreduce_bytes: int = 1 << 20  # … of a median size below this: raise bucket_cap_mb
    # gradient collectives' time in a float type of ≤ 16 bits from this share: no 16-bit hook
    narrow_grad_comm_share: float = 0.9


@dataclass(frozen=True)
class VerdictRules:
    """Which finding the verdict leads with, and its words (analysis/verdict.py)."""

    # no steady bottleneck: slow steps lead the verdict when they hold this share of the time
    uneven_excess_share: float = 0.5
    # other ranks' communication/host time is the straggler's doing (the verdict names the
    # straggler) when more than this share of their sync waits is for it …
    straggler_wait_share: float = 0.5
    # … or the straggler's caused waiting is at least this share of their lost time
    straggler_caused_share: float = 0.5
    # communication-bound words: "point-to-point communication" above this share of p2p
    p2p_share: float = 0.5


@dataclass(frozen=True)
class VariabilityRules:
    """When step times vary enough to say so (analysis/variability.py)."""

    min_steps: int = 4  # fewer analysed steps than this: nothing is said
    p90_factor: float = 1.3  # p90 / median step time above this: jitter
    spread_factor: float = 1.6  # p90 / p10 of the step times above this: jitter
    outlier_factor: float = 1.5  # a step longer than this × the median: an outlier (stall)
    # one outlier is single only when no other step comes within this share of its excess
    # over the median; otherwise those steps are named together (a cluster of slow steps)
    cluster_ratio: float = 0.5
    regime_factor: float = 2.0  # every step after a split this × slower (or faster): regime
    min_steps_per_regime: int = 2  # ... with at least this many steps on each side
    severe_factor: float = 2.0  # p90 / median from this up (or a regime change): a warning
    # a blocking call (sync, copy) waiting this share of its time for GPU work does not
    # explain the slow steps: the GPU work it waits for does
    gpu_wait_share: float = 0.5


@dataclass(frozen=True)
class EvidenceRules:
    """What a trace can support before it is judged (analysis/evidence.py)."""

    sampled_hole_ratio: float = 0.2  # host-operator ids followed by a hole: sampled/filtered
    sampled_min_ids: int = 50  # ... among at least this many ids
    few_gpu_ops: int = 100  # one step (or none) with fewer GPU ops: too little to generalise
    few_host_ops: int = 100  # CPU-only: one step (or none) with fewer host operators: likewise
    filtered_launch_ratio: float = 0.05  # launch calls without their GPU op: a filtered trace
    filtered_min_launches: int = 20  # ... among at least this many launch calls


@dataclass(frozen=True)
class LoaderRules:
    """How loaders find steps and check clocks (traces/common.py); in each input's cache key."""

    user_step_coverage_ratio: float = 0.8  # a user range holds ≥ this share of the launches
    user_step_min_ranges: int = 3  # ... and recurs at least this often to be the iteration
    # a Python function whose calls have kernels launched between them in this share of the
    # gaps is part of one iteration (a model's layers), not the iteration
    iteration_gap_launch_ratio: float = 0.5
    # the longest kernel-name period tried for iterations from a repeating kernel sequence
    kernel_period_max: int = 4096
    # ... whose repeats meet where the host pauses launching this many times the median gap
    kernel_period_pause_factor: float = 3.0
    phase_max_share: float = 0.9  # a one-off phase range bounds the analysis up to this share
    launch_linked_min_ratio: float = 0.5  # fewer GPU ops with a launch call: steps by time
    clock_tolerance_ns: int = 100_000  # GPU/host clock bounds violated by more: an offset
    clock_late_ns: int = 50_000_000  # every GPU op this late, nothing to tell an offset: withheld
    clock_residue_ratio: float = 0.01  # after a shift, more ops before their launch: unreliable
    comm_stream_ratio: float = 0.9  # a stream with this share of comm kernels is the comm stream
    comm_stream_min: int = 4  # ... and at least this many of them


@dataclass(frozen=True)
class ReadingRules:
    """How gpudiag reads a trace before the rules judge it: phases, edges (analysis/reading)."""

    startup_call_min_ns: int = 50_000_000  # a runtime call before the first kernel this long …
    startup_repeat_ratio: float = 0.25  # … that no later call of its name lasts this share of
    startup_dominant_ratio: float = 0.5  # start-up this share of the window: the verdict says so
    step_gpu_coverage_ratio: float = 0.5  # found ranges hold less GPU time: one window instead
    autotune_min_trials: int = 3  # an operator launching this many kernels, as many syncs: tuning


@dataclass(frozen=True)
class DiffRules:
    """When a change between two runs counts as noise (analysis/diff.py)."""

    time_noise_ratio: float = 0.02  # relative change of a time below this: "same"
    ratio_noise: float = 0.01  # change of a share below this (absolute): "same"


@dataclass(frozen=True)
class LiveRules:
    """What the live alerts of ``gpudiag run`` add to the offline rules (analysis/online.py)."""

    window_steps: int = 6  # the latest steps the offline rules judge (and the history)
    confirm_steps: int = 2  # an onset shows in each of the latest this many steps ...
    busy_confirm_steps: int = 3  # ... this many while the run conditions say the host is busy
    clear_steps: int = 3  # an alert clears after this many steps without its effect ...
    hysteresis_ratio: float = 0.5  # ... "without": below this × the threshold that raised it
    min_gap_steps: int = 20  # the same alert is not raised again within this many steps
    warmup_steps: int = 5  # each rank's first steps: no alert and no history (quiet warm-up)


@dataclass(frozen=True)
class HangRules:
    """When ``gpudiag run`` calls the job stuck (collect/watchdog.py, analysis/hang.py)."""

    timeout_s: float = 0.0  # no rank finished a step for this long: stuck (0: automatic) …
    min_timeout_s: float = 60.0  # … automatic: the larger of this …
    step_factor: float = 10.0  # … and this × the median step time so far
    startup_timeout_s: float = 300.0  # before any rank's first step (imports, compilation)
    answer_wait_s: float = 10.0  # how long the watchdog waits for every rank's stacks


_GROUPS: dict[str, type] = {
    "stragglers": StragglerRules,
    "steady": SteadyRules,
    "collectives": CollectiveRules,
    "pipeline": PipelineRules,
    "advice": AdviceRules,
    "variability": VariabilityRules,
    "verdict": VerdictRules,
    "diff": DiffRules,
    "live": LiveRules,
    "hang": HangRules,
    "evidence": EvidenceRules,
    "loader": LoaderRules,
    "reading": ReadingRules,
}


@dataclass(frozen=True)
class Thresholds:
    """Every number and pattern that changes a verdict (documented in docs/definitions.md)."""

    idle_ratio_max: float = 0.30
    data_bound_ratio: float = 0.10
    comm_bound_ratio: float = 0.10
    host_bound_ratio: float = 0.30
    severe_share_ratio: float = 0.30  # a data- or comm-bound share this large is an error
    most_steps_ratio: float = 0.5  # a rank is flagged when its steps cross in this share
    truncated_step_ratio: float = 0.5  # last step with fewer GPU ops than this × the one before
    comm_kernel_re: str = DEFAULT_COMM_KERNEL_RE
    comm_host_re: str = DEFAULT_COMM_HOST_RE
    comm_op_re: str = DEFAULT_COMM_OP_RE
    data_re: str = DEFAULT_DATA_RE
    step_re: str | None = None  # None: automatic (ProfilerStep#N, gpudiag.step#N, …)
    stragglers: StragglerRules = field(default_factory=StragglerRules)
    steady: SteadyRules = field(default_factory=SteadyRules)
    collectives: CollectiveRules = field(default_factory=CollectiveRules)
    pipeline: PipelineRules = field(default_factory=PipelineRules)
    advice: AdviceRules = field(default_factory=AdviceRules)
    variability: VariabilityRules = field(default_factory=VariabilityRules)
    verdict: VerdictRules = field(default_factory=VerdictRules)
    diff: DiffRules = field(default_factory=DiffRules)
    live: LiveRules = field(default_factory=LiveRules)
    hang: HangRules = field(default_factory=HangRules)
    evidence: EvidenceRules = field(default_factory=EvidenceRules)
    loader: LoaderRules = field(default_factory=LoaderRules)
    reading: ReadingRules = field(default_factory=ReadingRules)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "idle_ratio_max",
            "data_bound_ratio",
            "comm_bound_ratio",
            "host_bound_ratio",
            "severe_share_ratio",
            "most_steps_ratio",
            "truncated_step_ratio",
        ):
            _check_ratio(name, getattr(self, name))
        for group in _GROUPS:
            rules = getattr(self, group)
            for f in fields(rules):
                v = getattr(rules, f.name)
                if isinstance(f.default, bool):
                    if not isinstance(v, bool):
                        raise UsageError(
                            f"[tool.gpudiag.{group}] {f.name} = {_value(v)} is not true or false",
                            "write true or false",
                        )
                elif f.name.endswith("_ratio") or f.name.endswith("_share"):
                    _check_ratio(f"{group}.{f.name}", v)
                elif not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                    raise UsageError(
                        f"[tool.gpudiag.{group}] {f.name} = {_value(v)} is not 0 or more",
                        "",
                    )
        for name in ("comm_kernel_re", "comm_host_re", "comm_op_re", "data_re", "step_re"):
            pattern = getattr(self, name)
            if pattern is None:
                continue
            try:
                re.compile(pattern)
            except (re.error, TypeError) as e:
                raise UsageError(
                    f"{_option(name)}: invalid regular expression {pattern!r} ({e})",
                    "use Python `re` syntax",
                ) from e

    def replace(self, **changes: Any) -> Thresholds:
        """A copy with the given fields changed; ``None`` values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        """The thresholds as recorded in a Diagnosis (patterns and rule groups included)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("extra", "live"):  # live: alerts during `gpudiag run` only, never a
                continue  # verdict of the diagnosis (each alert records its own limits)
            v = getattr(self, f.name)
            out[f.name] = asdict(v) if f.name in _GROUPS else v
        return out


_OPTIONS = {
    "idle_ratio_max": "--idle-threshold",
    "step_re": "--step-marker",
    "data_re": "--data-marker",
}


def _option(name: str) -> str:
    """How a user sets a threshold: the CLI option where one exists, else the config key."""
    if name in _OPTIONS:
        return _OPTIONS[name]
    group, _, key = name.rpartition(".")
    return f"[tool.gpudiag.{group}] {key}" if group else f"[tool.gpudiag] {name}"


def _value(v: Any) -> str:
    """A value as the user would type it: ``30``, not ``30.0``; ``true``, not ``True``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return f"{v:g}"
    return str(v)


def _check_ratio(name: str, v: Any) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= float(v) <= 1.0
    if not ok:
        raise UsageError(
            f"{_option(name)} {_value(v)} is not a ratio between 0 and 1",
            "ratios are fractions: 0.3 means 30%",
        )


_TOP = {f.name for f in fields(Thresholds)} - {"extra"} - set(_GROUPS)


def load_project_config(start: Path | None = None) -> dict[str, Any]:
    """Return ``[tool.gpudiag]`` from the nearest pyproject.toml (or gpudiag.toml), or ``{}``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name, key in (("gpudiag.toml", None), ("pyproject.toml", "tool.gpudiag")):
            p = d / name
            if not p.is_file():
                continue
            if sys.version_info >= (3, 11):  # imported only when there is a file to read
                import tomllib
            else:  # pragma: no cover - Python 3.10
                import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
            try:
                data = tomllib.loads(p.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise UsageError(f"{p}: cannot read configuration ({e})", "fix the TOML") from e
            if key is None:
                return dict(data)
            section: Any = data
            for part in key.split("."):
                section = section.get(part, {}) if isinstance(section, dict) else {}
            if section:
                return dict(section)
    return {}


def thresholds_from_config(config: dict[str, Any]) -> Thresholds:
    """Build Thresholds from a ``[tool.gpudiag]`` table, rejecting unknown keys with a hint.

    Top-level keys set the main thresholds and patterns; the tables ``[tool.gpudiag.stragglers]``,
    ``.steady``, ``.collectives``, ``.pipeline``, ``.advice`` and ``.diff`` set the rule
    groups; other tables (``gate``, ``scheduler`` …) are kept in ``extra`` for their commands.
    """
    top = {k: v for k, v in config.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in config.items() if isinstance(v, dict)}
    unknown = sorted(set(top) - _TOP - _EXTRA_KEYS)
    if unknown:
        raise UsageError(
            f"[tool.gpudiag]: unknown setting(s) {', '.join(unknown)}",
            f"known settings: {', '.join(sorted(_TOP | _EXTRA_KEYS))}",
        )
    groups: dict[str, Any] = {}
    for name, cls in _GROUPS.items():
        if name not in tables:
            continue
        table = tables.pop(name)
        known = {f.name for f in fields(cls)}
        bad = sorted(set(table) - known)
        if bad:
            raise UsageError(
                f"[tool.gpudiag.{name}]: unknown setting(s) {', '.join(bad)}",
                f"known settings: {', '.join(sorted(known))}",
            )
        groups[name] = cls(**table)
    extra = dict(tables)
    extra.update({k: top.pop(k) for k in list(top) if k in _EXTRA_KEYS})
    return Thresholds(**top, **groups, extra=extra)


# Top-level keys read by commands rather than by the analysis.
_EXTRA_KEYS = {"scheduler"}

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
LOCAL_SCHEDULERS = ("", "local")


def scheduler_address(
    option: str | None, th: Thresholds, environ: Mapping[str, str] | None = None
) -> str | None:
    """The Dask scheduler ``analyze`` uses, or ``None`` for this machine.

    ``--scheduler`` wins, then a non-empty ``$DASK_SCHEDULER_ADDRESS``, then
    ``[tool.gpudiag] scheduler``; the first one given decides, and ``local`` (or an empty
    ``--scheduler``) means this machine.
    """
    env = os.environ if environ is None else environ
    configured = th.extra.get("scheduler")
    if configured is not None and not isinstance(configured, str):
        raise UsageError(
            f"[tool.gpudiag] scheduler = {configured!r} is not a string",
            'write scheduler = "tcp://HOST:PORT" (or "local")',
        )
    for value in (option, env.get(SCHEDULER_ENV) or None, configured):
        if value is not None:
            value = value.strip()
            return None if value.lower() in LOCAL_SCHEDULERS else value
    return None


# ---- the CI gate's settings ------------------------------------------------------------

STRAGGLER_MODES = ("fail", "warn", "off")


@dataclass(frozen=True)
class GateConfig:
    """Every number that changes a gate verdict; ratios in [0, 1] (docs/gate.md).

    ``max_idle_ratio`` left at ``None`` uses the analysis's ``idle_ratio_max``, so the gate
    and the idle finding never disagree on the limit — on GPU runs; a CPU-only run has no
    idle limit unless one is set (:meth:`idle_limit`).

    Timing (a baseline of n runs, each reduced to its steady median step time):
    ``min_effect_ratio`` is the smallest slowdown worth failing for (``--min-effect``, also
    accepted as the older ``--max-regression``); ``run_alpha`` the one-sided level of the
    run-level t test, whose critical value also sets the noise floor (the minimum detectable
    effect) — 0.01, so that an unchanged run fails at most 1% of the time (measured: 1 of
    264 recorded unchanged candidates, tests/unit/analysis/compare/test_gate_false_alarms.py);
    ``single_run_min_effect_ratio`` the slowdown that fails against a single
    baseline run (no between-run spread to measure), together with the within-run
    Mann-Whitney test at ``alpha``; ``max_runs_advice`` caps the "need ≥ N runs" advice.

    Contention (the candidate's recorded run conditions; any one above its limit and the
    timing check cannot fail): ``max_other_cpu_ratio`` (mean CPU share of all CPUs used by
    processes outside the job), ``max_steal_ratio`` (mean steal share),
    ``max_gpu_slowdown_ratio`` (share of a GPU's samples with a slowdown or power-cap throttle
    reason), ``max_gpu_other_process_ratio`` (share of a GPU's samples with another process
    on it).

    The job's own work (``cpu_time_regression``, the training threads' CPU time per step)
    can fail a contended candidate, unless the host made the same work cost more CPU time:
    ``max_host_cost_increase_ratio`` bounds how much more CPU time the run-conditions
    sampler's own fixed work took in the candidate than in the costliest baseline run
    (``sample_cost_us_mean``); above it a CPU slowdown is inconclusive.

    ``comparable_contention_margin``: a contended candidate's wall clock is still tested
    (and can fail) when every baseline run recorded its conditions and none of the
    candidate's contention figures (other processes' and steal CPU shares, each GPU's
    throttled and shared sample shares) is more than this above the busiest baseline
    run's: the baseline's spread then holds that contention.
    """

    max_idle_ratio: float | None = None
    max_comm_wait_ratio: float | None = None
    max_data_wait_ratio: float | None = None
    min_effect_ratio: float = 0.05
    alpha: float = 0.01
    run_alpha: float = 0.01
    single_run_min_effect_ratio: float = 0.50
    max_runs_advice: int = 30
    min_samples: int = 8
    warmup_steps: int | None = None  # None: the steady-step rule of the analysis
    stragglers: str = "fail"
    inconclusive_ok: bool = False
    max_other_cpu_ratio: float = 0.25
    max_steal_ratio: float = 0.10
    max_gpu_slowdown_ratio: float = 0.10
    max_gpu_other_process_ratio: float = 0.10
    max_host_cost_increase_ratio: float = 0.25
    comparable_contention_margin: float = 0.10

    def __post_init__(self) -> None:
        ratios = {
            "max_idle_ratio": "--max-idle-ratio",
            "max_comm_wait_ratio": "--max-comm-wait",
            "max_data_wait_ratio": "--max-data-wait",
            "alpha": "--alpha",
        }
        contention = (
            "max_other_cpu_ratio",
            "max_steal_ratio",
            "max_gpu_slowdown_ratio",
            "max_gpu_other_process_ratio",
        )
        ratios.update(
            (k, k)
            for k in (
                "run_alpha",
                "max_host_cost_increase_ratio",
                "comparable_contention_margin",
                *contention,
            )
        )
        for name, opt in ratios.items():
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 0.0 <= float(v) <= 1.0):
                raise UsageError(
                    f"gate: {opt} {_value(v)} is not a ratio between 0 and 1", "0.3 means 30%"
                )
        if self.min_effect_ratio < 0 or self.single_run_min_effect_ratio < 0:
            raise UsageError(
                f"gate: --min-effect {self.min_effect_ratio * 100:g} is negative",
                "give a percentage such as 5",
            )
        if self.min_samples < 2 or (self.warmup_steps is not None and self.warmup_steps < 0):
            raise UsageError(
                "gate: --min-samples must be 2 or more and --warmup-steps 0 or more", ""
            )
        if self.max_runs_advice < 2:
            raise UsageError("gate: max_runs_advice must be 2 or more", "")
        if self.stragglers not in STRAGGLER_MODES:
            raise UsageError(
                f"gate: --stragglers {self.stragglers} is not one of fail, warn or off",
                "choose --stragglers fail, warn or off",
            )

    def idle_limit(self, th: Thresholds, mode: str | None = None) -> float | None:
        """The idle limit in force: the gate's own, else the analysis's — on GPU runs.

        Idle is time without GPU compute; a CPU-only run (``mode`` ``cpu``) has no GPU to
        keep busy, so it has no idle limit unless one is set (``--max-idle-ratio``).
        """
        if self.max_idle_ratio is not None:
            return self.max_idle_ratio
        return None if mode == "cpu" else th.idle_ratio_max


# Config-file keys → GateConfig fields; effects are written in percent there
# (``max_regression_pct`` is the older name of ``min_effect_pct``).
_PCT_KEYS = {
    "min_effect_pct": "min_effect_ratio",
    "max_regression_pct": "min_effect_ratio",
    "single_run_min_effect_pct": "single_run_min_effect_ratio",
}
_GATE_KEYS = {f.name for f in fields(GateConfig)} - set(_PCT_KEYS.values()) | set(_PCT_KEYS)


def gate_config(table: dict[str, Any] | None = None, **overrides: Any) -> GateConfig:
    """``[tool.gpudiag.gate]`` then CLI overrides (``None`` = not given) → GateConfig."""
    table = dict(table or {})
    unknown = sorted(set(table) - _GATE_KEYS)
    if unknown:
        raise UsageError(
            f"[tool.gpudiag.gate]: unknown setting(s) {', '.join(unknown)}",
            f"known settings: {', '.join(sorted(_GATE_KEYS))}",
        )
    for key, field_name in _PCT_KEYS.items():
        if key in table:
            table[field_name] = float(table.pop(key)) / 100.0
    table.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GateConfig(**table)
    except TypeError as e:
        raise UsageError(f"gate configuration: {e}", "see docs/gate.md") from e
