"""Issue 24 §6: kernel names and durations as a practitioner reads them."""

from __future__ import annotations

import pytest

import gpudiag
from gpudiag.analysis.model import words
from gpudiag.analysis.rank.kernels import display_name, family


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (
            "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
            "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, float, int)",
            "vllm::fused_add_rms_norm_kernel",
        ),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>"
            "(int, float, float const*, float*)",
            "at::native::vectorized_layer_norm_kernel",
        ),
        (
            "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16>(c10::BFloat16*)",
            "multimem_all_reduce_kernel",
        ),
        (
            "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47Gridwise",
            "ck::tensor_operation::device::kernel_batched_gemm_xdlops_bwd_weight",
        ),
        (
            "## Call CompiledFxGraph fudNjsrxq7ybmlnw2dlxkbrhyt4cnsaf ##",
            "Call CompiledFxGraph fudNjs",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
            "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
            "{lambda()#4}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int)",
            "at::native::vectorized_elementwise_kernel",
        ),
        (
            "void cutlass_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_256x64_16x4_nhwc>"
            "(T1::Params)",
            "cutlass_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_256x64_16x4_nhwc>",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
        ("aten::mm", "aten::mm"),
    ],
)
def test_display_names_drop_template_noise_and_parameters(raw, shown):
    assert display_name(raw) == shown


@pytest.mark.parametrize(
    "name",
    [
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN",
        "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128>",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
        "cublasLt::splitKreduce_kernel",
        "volta_sgemm_64x64_nt",
    ],
)
def test_cublas_cublaslt_cutlass_and_nvjet_gemms_are_gemm(name):
    assert family(name) == "GEMM"


def test_one_row_per_kernel_and_no_template_noise_in_the_b200_table(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "b200x8_r0_infer", jobs=1)
    names = [e.name for e in d.kernels.top]
    assert len(names) == len(set(names))
    assert not any(n.startswith(("std::enable_if", "void ", "(anonymous")) for n in names)
    assert "vllm::fused_add_rms_norm_kernel" in names
    assert "other" not in [e.family for e in d.kernels.top if e.name.startswith("nvjet")]


def test_durations_in_the_unit_a_person_would_use():
    assert words.duration(3_604_000_000, "human") == "3.60 s"
    assert words.duration(12_340_000, "human") == "12.3 ms"
    assert words.duration(3_604_000_000, "ms") == "3604.0 ms"  # amounts compared in one unit


def test_nsys_kernels_named_just_kernel_get_their_template(shared_traces):
    d = gpudiag.analyze(shared_traces / "nsys" / "ai-profiler" / "baseline.sqlite", jobs=1)
    names = [e.name for e in d.kernels.top]
    assert "Kernel" not in names, names
    assert any(n.startswith("cutlass") and "Kernel<" in n for n in names), names
    fams = {e.name: e.family for e in d.kernels.top}
    assert all(f == "convolution" for n, f in fams.items() if "fprop" in n), fams
