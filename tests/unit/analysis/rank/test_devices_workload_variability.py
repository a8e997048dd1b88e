"""Issue 20 §2–§6: device capabilities, workload recognition, step variability (rules on hand-made input)."""

from __future__ import annotations

import numpy as np
import pytest
from testpaths import SHARED_TRACES

from gpudiag.analysis.findings.variability import variability
from gpudiag.analysis.model.causes import HostCause
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    Mode,
    RunSummary,
    Severity,
    Shares,
    StepBreakdown,
)
from gpudiag.analysis.model.metrics import HostMetrics, ShareMetrics, StragglerMetrics
from gpudiag.analysis.rank.devices import capability, common_capability
from gpudiag.analysis.rank.workload import (
    expert_parallel,
    inference,
    native_program,
    recognise,
    sparse_embeddings,
)
from gpudiag.analysis.verdict import verdict
from gpudiag.config import LoaderRules, VariabilityRules, thresholds_from_config
from gpudiag.traces.core.common import LoadOptions
from gpudiag.traces.core.step_ranges import find_user_steps
from gpudiag.traces.schema import Kind

# ---- devices ----


@pytest.mark.parametrize(
    ("name", "cc", "sms", "gen", "bf16", "tf32", "fp8"),
    [
        ("Tesla V100-SXM2-16GB", "7.0", 80, "Volta", False, False, False),
        ("Tesla V100-SXM2-16GB", None, None, "Volta", False, False, False),
        ("NVIDIA GeForce RTX 2080 Ti", "7.5", 68, "Turing", False, False, False),
        ("NVIDIA A100-PG509-200", "8.0", 108, "Ampere", True, True, False),
        ("NVIDIA GeForce RTX 4090", "8.9", 128, "Ada", True, True, True),
        ("NVIDIA H100 80GB HBM3", None, None, "Hopper", True, True, True),
        ("NVIDIA B200", "10.0", 148, "Blackwell", True, True, True),
        ("some future part", "9.0", None, "Hopper", True, True, True),
        ("AMD Instinct MI100", "9.0", 120, "CDNA1", True, False, False),
        ("AMD Instinct MI210", "9.0", 104, "CDNA2", True, False, False),
        ("AMD Radeon Graphics", "9.0", 104, "CDNA2", True, False, False),  # an MI250 GCD
        ("AMD Instinct MI300X", "9.4", 304, "CDNA3", True, True, True),
    ],
)
def test_capability_table(
    name: str, cc: str | None, sms: int | None, gen: str, bf16: bool, tf32: bool, fp8: bool
) -> None:
    c = capability(name, cc, sms)
    assert (c.generation, c.fp16, c.bf16, c.tf32, c.fp8) == (gen, True, bf16, tf32, fp8)


def test_amd_compute_capability_never_reads_as_nvidia() -> None:
    # gfx9 parts report 9.x: that is not Hopper
    assert capability("AMD Radeon Graphics", "9.0", 999).known is False


def test_common_capability_is_what_every_device_has() -> None:
    both = common_capability([capability("Tesla V100-SXM2-16GB"), capability("NVIDIA A100")])
    assert (both.bf16, both.tf32, both.fp16) == (False, False, True)
    assert common_capability([]).known is False


# ---- workload ----


def test_torchrec_is_not_moe() -> None:
    tags = recognise(
        [
            ("split_embedding_codegen_forward_unweighted_kernel", 6),
            ("nccl:all_to_all", 42),
            ("## forward:all2all_global_emb ##", 6),
            ("Optimizer.step#FusedAdam.step", 6),
        ]
    )
    assert sparse_embeddings(tags) and not expert_parallel(tags)
    assert not inference(tags)


def test_moe_and_inference_engine() -> None:
    tags = recognise(
        [
            ("vllm::moe_forward", 12),
            ("deep_ep::intranode::dispatch<8>", 4),
            ("execute_context_1(888_788544)_generation_0(0)", 1),
            ("aten::mm", 10),
        ]
    )
    assert expert_parallel(tags) and inference(tags) and not sparse_embeddings(tags)


def test_native_program_has_no_pytorch_names() -> None:
    assert native_program(recognise([("jacobi_kernel", 2000), ("MPI", 1000)]))
    assert not native_program(recognise([("void at::native::vectorized_elementwise_kernel", 3)]))


def test_graphs_and_jit() -> None:
    tags = recognise([("cudaGraphLaunch", 3), ("nvrtcCompileProgram", 1)])
    assert {"graphs", "jit"} <= set(tags)
    assert tags["graphs"]["count"] == 3
    assert "graphs" in recognise([("hipGraphLaunch", 2)])  # ROCm graphs too
    compiled = recognise([("Torch-Compiled Region: 0/1", 1), ("triton_poi_fused_add_0", 4)])
    assert compiled["compiled"]["count"] == 5 and "jit" not in compiled


# ---- variability ----


def _steps(durations_ms: list[float], first: int = 1) -> list[StepBreakdown]:
    out = []
    t = 0
    for i, d in enumerate(durations_ms):
        ns = round(d * 1e6)
        out.append(StepBreakdown(0, first + i, t, ns, ns, 0, 0, 0, 0))
        t += ns
    return out


R = VariabilityRules()


def test_steady_steps_say_nothing() -> None:
    assert variability(_steps([100, 101, 99, 102, 100, 98]), R) == []


def test_jitter_names_range_and_slowest_steps() -> None:
    # v100x2_r1's shape: 82–166 ms, p90/median 1.45
    (f,) = variability(_steps([82.2, 166.5, 150.0, 100.3, 114.7, 160.0], first=1009), R)
    assert f.kind == FindingKind.STEP_VARIABILITY and f.metrics.pattern == "jitter"
    assert "82.2 ms to 166.5 ms" in f.message
    assert f.steps == [1010, 1011, 1014]


def test_single_outlier_named() -> None:
    (f,) = variability(_steps([215, 214, 216, 425, 215, 213]), R)
    assert f.metrics.pattern == "outlier" and f.steps == [4]
    assert "step 4 took 425.0 ms (rank 0), 2.0× the median 215.0 ms" in f.message


def test_regime_change_named_with_its_step() -> None:
    # the allocator-less run: ×9 from step 5 on
    (f,) = variability(_steps([10, 11, 10, 10, 90, 92, 91, 90]), R)
    assert f.metrics.pattern == "regime_change" and f.metrics.change_at_step == 5
    assert f.severity == Severity.WARNING
    assert "from step 5 on" in f.message and "9.1× slower" in f.message  # medians 90.5 vs 10.0


def test_recurring_stalls_listed() -> None:
    (f,) = variability(_steps([150, 600, 160, 155, 700, 150, 158, 300]), R)
    assert f.metrics.pattern == "stalls" and f.steps == [2, 5, 8]


def test_too_few_steps() -> None:
    assert variability(_steps([10, 90, 10]), R) == []


def test_a_short_last_step_is_not_jitter() -> None:
    assert variability(_steps([150, 152, 149, 151, 150, 153, 150, 5.4]), R) == []


# ---- verdict: the root cause ----


def _run() -> RunSummary:
    return RunSummary(8, 8, 6, 100, 120, Shares(0.5, 0.0, 0.0, 0.5), 0.0, 0.5, Mode.GPU)


def _late(excess: float, caused: int) -> Finding:
    m = StragglerMetrics(
        source="trace",
        wait_attribution="",
        score=1.0,
        median_excess_ns=10,
        median_excess_ratio=excess,
        slow_steps=6,
        steps_compared=6,
        excess_by_part_ns={},
        also=[],
        step_time_ns_median=100,
        step_time_ns_if_median_speed=90,
        short_window=True,
    )
    return Finding(
        FindingKind.STRAGGLER,
        Severity.WARNING,
        "rank 7 …",
        ranks=[7],
        metrics=m,
        wait_caused_ns=caused,
    )


def _host(cause: HostCause | None) -> Finding:
    per = {str(r): 0.48 for r in range(7)}
    m = ShareMetrics(per, 0.3) if cause is None else HostMetrics(per, 0.3, cause=cause)
    return Finding(
        FindingKind.HOST_BOUND,
        Severity.WARNING,
        "ranks 0–6: 48% …",
        ranks=list(range(7)),
        metrics=m,
    )


def test_verdict_names_the_straggler_the_host_bound_ranks_wait_for() -> None:
    host = _host(
        HostCause(
            kind="sync",
            label="synchronisation",
            api="cudaStreamSynchronize",
            waits_for={"communication": 0.8, "nothing": 0.2},
        )
    )
    v = verdict(_run(), [host, _late(0.2, 10)])
    assert v.bottleneck == "straggler" and v.ranks == [7]


def test_verdict_keeps_host_bound_when_the_host_waits_for_its_own_gpu() -> None:
    host = _host(
        HostCause(
            kind="sync",
            label="synchronisation",
            api="cudaDeviceSynchronize",
            waits_for={"compute": 0.9, "nothing": 0.1},
        )
    )
    v = verdict(_run(), [host, _late(0.2, 10)])
    assert v.bottleneck == "host" and v.ranks == list(range(7))
    assert "synchronisation (cudaDeviceSynchronize)" in v.headline


# ---- steps: library ranges are never steps ----


def test_nvfuser_ranges_are_not_steps_the_users_range_is() -> None:
    # an nvFuser micro-benchmark: the user's `test` range 3 times, each holding
    # nvFusion0..nvFusion3 ranges with the launches
    names = ["test", "nvFusion0", "nvFusion1", "nvFusion2", "nvFusion3", "cudaLaunchKernel"]
    rows: list[tuple[int, int, int, int]] = []  # kind, name, start, end
    t = 0
    for _ in range(3):
        rows.append((int(Kind.ANNOTATION), 0, t, t + 1000))
        for k in range(4):
            s = t + 10 + 200 * k
            rows.append((int(Kind.ANNOTATION), 1 + k, s, s + 150))
            rows.append((int(Kind.RUNTIME), 5, s + 10, s + 20))
        t += 2000
    kind, name, start, end = (np.array(c, np.int64) for c in zip(*rows, strict=True))
    lane = np.zeros(len(rows), np.int64)
    # `test` is a phase name: no iteration range qualifies, nvFusionN never does …
    assert find_user_steps(start, end, kind, lane, name, names, ["cpu:1"]) is None
    # … and the phase pass takes the user's own range, one window each
    found = find_user_steps(start, end, kind, lane, name, names, ["cpu:1"], phase=True)
    assert found is not None
    idx, _, note, family = found
    assert family == "test" and len(idx) == 3 and "analysed phase" in note


def test_the_loader_limits_come_from_the_thresholds() -> None:
    # three `step N` ranges holding every launch: the iteration with the default 3-range
    # minimum, not with [tool.gpudiag.loader] user_step_min_ranges = 4 (then a phase)
    names = ["step 1", "step 2", "step 3", "cudaLaunchKernel"]
    rows = []
    for k in range(3):
        rows += [
            (int(Kind.ANNOTATION), k, 1000 * k, 1000 * k + 900),
            (int(Kind.RUNTIME), 3, 1000 * k + 10, 1000 * k + 20),
        ]
    kind, name, start, end = (np.array(c, np.int64) for c in zip(*rows, strict=True))
    lane = np.zeros(len(rows), np.int64)
    found = find_user_steps(start, end, kind, lane, name, names, ["cpu:1"])
    assert found is not None and found[3] == "step N"
    stricter = LoaderRules(user_step_min_ranges=4)
    assert find_user_steps(start, end, kind, lane, name, names, ["cpu:1"], rules=stricter) is None
    th = thresholds_from_config({"loader": {"user_step_min_ranges": 4}})  # [tool.gpudiag.loader]
    assert th.loader == stricter and LoadOptions.from_thresholds(th).rules == stricter


def test_verdict_names_the_straggler_whose_lateness_fills_the_others_host_time() -> None:
    # ranks 0–6 lose 48% of 6 steps of 100 ns (the run summary's median) to the host;
    # rank 7 made them wait 7 × 6 × 40 ns: most of it
    host = _host(None)
    assert verdict(_run(), [host, _late(0.1, 7 * 6 * 40)]).ranks == [7]
    assert verdict(_run(), [host, _late(0.1, 7 * 6 * 5)]).ranks == list(range(7))


# ---- remedies fit the workload ----


def test_inference_collectives_get_no_gradient_remedy() -> None:
    from gpudiag.analysis.model.diagnosis import RankEvidence, RankSummary
    from gpudiag.analysis.model.kinds import StepSource
    from gpudiag.analysis.model.metrics import CommBoundMetrics
    from gpudiag.analysis.remedies.advice import recommend

    ev = RankEvidence(
        comm_types={"allreduce": 1.0},
        workload=recognise(
            [("execute_context_0(1_128)_generation_3(0)", 1), ("vllm::all_reduce", 4)]
        ),
    )
    rank = RankSummary(
        0,
        4,
        100,
        120,
        Shares(0.5, 0.3, 0.0, 0.2),
        0.0,
        0.2,
        0.5,
        Mode.GPU,
        StepSource.PROFILER_STEP,
        "x",
        evidence=ev,
    )
    steps = [StepBreakdown(0, i, i * 100, 100, 50, 30, 0, 20, 0) for i in range(4)]
    comm = Finding(
        FindingKind.COMM_BOUND,
        Severity.ERROR,
        "rank 0: 30% …",
        ranks=[0],
        metrics=CommBoundMetrics(per_rank={"0": 0.3}, threshold=0.1),
    )
    ids = [r.id for r in recommend(_run(), [rank], steps, [comm])]
    assert "inference-collectives" in ids
    assert not {"comm-overlap", "grad-accumulation", "grad-compression", "fsdp-prefetch"} & set(ids)


def test_deepep_traffic_gets_moe_advice_without_suggesting_deepep() -> None:
    from gpudiag.analysis.model.diagnosis import RankEvidence, RankSummary
    from gpudiag.analysis.model.kinds import StepSource
    from gpudiag.analysis.model.metrics import CommBoundMetrics
    from gpudiag.analysis.remedies.advice import recommend

    ev = RankEvidence(
        comm_types={"other": 1.0},
        workload=recognise(
            [("void deep_ep::intranode::dispatch<8, 768>", 12), ("Optimizer.step#AdamW.step", 1)]
        ),
    )
    rank = RankSummary(
        0,
        4,
        100,
        120,
        Shares(0.5, 0.3, 0.0, 0.2),
        0.0,
        0.2,
        0.5,
        Mode.GPU,
        StepSource.PROFILER_STEP,
        "x",
        evidence=ev,
    )
    steps = [StepBreakdown(0, i, i * 100, 100, 50, 30, 0, 20, 0) for i in range(4)]
    comm = Finding(
        FindingKind.COMM_BOUND,
        Severity.ERROR,
        "rank 0: 30% …",
        ranks=[0],
        metrics=CommBoundMetrics(per_rank={"0": 0.3}, threshold=0.1),
    )
    recs = {r.id: r for r in recommend(_run(), [rank], steps, [comm])}
    assert "moe-all-to-all" in recs and "embedding-all-to-all" not in recs
    assert "already in use" in recs["moe-all-to-all"].detail
    assert not {"comm-overlap", "grad-accumulation"} & set(recs)


def test_stalls_name_the_part_that_grows() -> None:
    # the loader runs dry in steps 2, 5 and 8: their extra time is data wait
    durs = [150, 600, 160, 155, 700, 150, 158, 300]
    steps = []
    t = 0
    for i, d in enumerate(durs, start=1):
        ns = d * 1_000_000
        data = max(0, ns - 150_000_000)
        steps.append(StepBreakdown(0, i, t, ns, ns - data, 0, data, 0, 0))
        t += ns
    (f,) = variability(steps, R)
    assert f.metrics.pattern == "stalls" and f.metrics.grows == "data_wait"
    assert "data wait grows by" in f.message


def test_inference_precision_advice_is_serving_not_training() -> None:
    from gpudiag.analysis.model.diagnosis import RankEvidence, RankSummary
    from gpudiag.analysis.model.kinds import StepSource
    from gpudiag.analysis.model.metrics import ComputeMetrics
    from gpudiag.analysis.remedies.advice import recommend

    ev = RankEvidence(
        workload=recognise([("execute_context_0(1_128)_generation_3(0)", 1), ("aten::mm", 10)]),
        device=capability("NVIDIA H100 80GB HBM3", "9.0").as_dict(),
    )
    rank = RankSummary(
        0,
        4,
        100,
        120,
        Shares(0.9, 0.0, 0.0, 0.1),
        0.0,
        None,
        0.1,
        Mode.GPU,
        StepSource.PROFILER_STEP,
        "x",
        evidence=ev,
    )
    m = ComputeMetrics(
        compute_share=0.9,
        threshold=0.7,
        unit="kernel",
        families={"GEMM": 0.6, "attention": 0.3, "elementwise": 0.1},
        fusable_share=0.1,
        gemm_share=0.6,
        fp32_gemm_share=0.9,
        top=[],
        matrix_share=0.9,
        fp32_matrix_share=0.9,
    )
    f = Finding(FindingKind.COMPUTE_BOUND, Severity.INFO, "compute holds 90%", metrics=m)
    (rec,) = recommend(_run(), [rank], [], [f])
    assert rec.id == "reduced-precision" and rec.title == "Serve the model in bf16 or FP8"
    assert "GradScaler" not in rec.detail and "train" not in rec.detail.lower()


def test_many_tiny_allreduces_get_larger_buckets_not_smaller() -> None:
    from gpudiag.analysis.model.diagnosis import RankEvidence, RankSummary
    from gpudiag.analysis.model.kinds import StepSource
    from gpudiag.analysis.model.metrics import CommBoundMetrics
    from gpudiag.analysis.remedies.advice import recommend

    def detail(per_step: float, size: float) -> str:
        ev = RankEvidence(
            comm_types={"allreduce": 1.0},
            collective_calls={"allreduce": {"per_step": per_step, "bytes_median": size}},
        )
        rank = RankSummary(
            0,
            4,
            100,
            120,
            Shares(0.5, 0.3, 0.0, 0.2),
            0.0,
            0.2,
            0.5,
            Mode.GPU,
            StepSource.PROFILER_STEP,
            "x",
            evidence=ev,
        )
        steps = [StepBreakdown(0, i, i * 100, 100, 50, 30, 0, 20, 0) for i in range(4)]
        comm = Finding(
            FindingKind.COMM_BOUND,
            Severity.ERROR,
            "rank 0: 30% …",
            ranks=[0],
            metrics=CommBoundMetrics(per_rank={"0": 0.3}, threshold=0.1),
        )
        recs = {r.id: r for r in recommend(_run(), [rank], steps, [comm])}
        return recs["comm-overlap"].detail

    assert "raise bucket_cap_mb" in detail(404, 64 * 1024)
    assert "smaller buckets" not in detail(404, 64 * 1024)
    assert "smaller buckets start earlier" in detail(5, 25 << 20)


def test_an_mpi_program_gets_no_pytorch_communication_advice() -> None:
    """The Jacobi solver (C + MPI, no PyTorch name): its MPI waits get native advice only."""

    import gpudiag

    path = SHARED_TRACES / "nsys/jacobi-mpi/report1.sqlite"
    if not path.exists():
        import pytest

        pytest.skip(f"{path} not present")
    d = gpudiag.analyze(path, jobs=1)
    ids = {r.id for r in d.recommendations}
    assert "native-comm-overlap" in ids
    assert not ids & {
        "comm-overlap",
        "grad-accumulation",
        "grad-compression",
        "fsdp-prefetch",
        "nccl-tuning",
        "nccl-backend",
    }


def test_folded_signs_match_as_case_insensitive_patterns_do():
    """A sign searched in the lower-cased name matches where its (?i) pattern would."""
    import re

    from gpudiag.analysis.rank import workload

    names = ["MoE_dispatch", "LLMEngine.step", "nvFusion_1", "FusionExecutor", "DeepEP::x"]
    names += ["cuModuleLoadData", "Generation_2", "PREFILL", "vLLM::attn", "Experts", "moe"]
    names += [n.upper() for n in names] + [n.swapcase() for n in names] + ["aten::mm", ""]
    for name in names:
        want = tuple(
            tag
            for tag, text in workload._SIGN_TEXT.items()
            if re.search(text, name)  # (?i) where the sign has it: the engine folds case
        )
        assert workload._tags.__wrapped__(name) == want, name
