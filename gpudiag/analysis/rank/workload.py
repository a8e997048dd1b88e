"""Recognises what a rank runs (parallelism, model family, engine) from its trace's names.

Remedies differ by workload: an all-to-all in TorchRec's sparse-embedding input
distribution is not a mixture-of-experts token exchange, an inference engine's decode
step has no gradients to synchronise, and a job that already launches CUDA graphs or
computes in bf16 needs neither suggested. Each tag of :data:`SIGNS` is recognised from
the distinct names of a rank's intervals (operators, ranges, kernels, runtime calls) and
carries its evidence: how many intervals matched and up to three of their names.

Tags: ``ddp``, ``fsdp`` (FSDP or DeepSpeed ZeRO), ``torchrec`` (sparse embeddings:
FBGEMM ``split_embedding_*`` kernels, ``KJTAllToAll``, ``PooledEmbeddingsAwaitable``,
the sparse-data-dist ranges), ``moe`` (expert parallelism: DeepEP, fused-MoE kernels,
expert routing), ``pipeline`` (pipeline-parallel schedules), ``inference`` (vLLM,
SGLang, TensorRT-LLM engines and their decode/prefill steps), ``jit`` (NVRTC/hipRTC,
nvFuser, module loading), ``compiled`` (torch.compile's graphs and Triton kernels:
torch.compile already in use), ``graphs`` (``cudaGraphLaunch``/``hipGraphLaunch``: CUDA/HIP
graphs already replayed), ``training`` (an optimizer step or backward operators),
``pytorch`` (any ATen operator or PyTorch range), ``mpi`` (MPI ranges or threads),
``quantised_comms`` (FBGEMM's FP8/8-bit row-wise codecs: embeddings exchanged quantised).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag.analysis.model.evidence import WorkloadTag

FOLDED = "(?i)"  # a sign written in lower case, searched in the lower-cased name
_SIGN_TEXT = {
    "ddp": r"^DistributedDataParallel\.|DistributedDataParallel|^Reducer::",
    "fsdp": r"^FSDP::|FullyShardedDataParallel|^fsdp::|DeepSpeedZero|ZeroOptimizer|"
    r"\bzero[_ ]?stage[_ ]?3\b",
    "torchrec": r"split_embedding_|KJTAllToAll|PooledEmbeddings(Awaitable|AllToAll)|"
    r"KeyedJaggedTensor|EmbeddingBagCollection|sparse_data_dist|"
    r"permute_sparse_features|all2all_global_emb|sparse_arch|\bfbgemm::|"
    r"\btorchrec\b",
    # (?i): searched, without the flag, in the lower-cased name (half the time)
    "moe": r"(?i)deep_?ep|fused_moe|moe_align|moe_sum|\bmoe\b|_moe_|moe_|topk_softmax|"
    r"expert_(parallel|dispatch|combine)|\bexperts?\b|grouped_gemm|dispatch_combine",
    "pipeline": r"^(torch\.distributed\.pipelining|PipelineStage|Schedule(1F1B|GPipe|"
    r"Interleaved|LoopedBFS|ZBV)|forward_backward_pipelining|PipelineEngine)",
    "inference": r"(?i)\bvllm\b|vllm::|sglang|tensorrt_llm|execute_context_|"
    r"\bgeneration_\d|\bdecode(_step)?\b|\bprefill\b|model_executor|llmengine",
    "jit": r"(?i)^nvrtc|^hiprtc|nvfuser|^nvfusion|fusionexecutor|compilefusion|"
    r"^cumoduleload|^culinkcomplete|^hipmoduleload",
    "compiled": r"CompiledFxGraph|Torch-Compiled Region|^CompiledFunction|"
    r"^triton_(poi|red|per)_",
    "graphs": r"^(cuda|hip|cu)GraphLaunch",
    "quantised_comms": r"FloatToFP8|FP8Rowwise|FloatToFused8Bit|QuantizedCommCodec|"
    r"fp8_all_to_all|qcomm",
    "training": r"^Optimizer\.step#|^autograd::engine|Backward\d*$|^optimizer\.step",
    "pytorch": r"^aten::|^ProfilerStep#|^autograd::|^c10d::|^torch|^FSDP::|^nccl:[a-z]|"
    r"\bat::native::|\bc10::|^enumerate\(DataLoader|^(vectorized|unrolled)_elementwise_kernel|"
    r"^(index_)?elementwise_kernel|^reduce_kernel|^CatArrayBatchedCopy|"
    r"^distribution_elementwise_grid_stride_kernel|^fused_dropout_kernel",
    "mpi": r"^MPI(_|$)|^MPI Rank|^PMPI_",
}
SIGNS: dict[str, re.Pattern[str]] = {
    tag: re.compile(p.removeprefix(FOLDED)) for tag, p in _SIGN_TEXT.items()
}
_FOLDED_TAGS = frozenset(tag for tag, p in _SIGN_TEXT.items() if p.startswith(FOLDED))


@functools.lru_cache(maxsize=1 << 15)
def _tags(name: str) -> tuple[str, ...]:
    """The tags whose sign the name carries (ranks of one job share their names: cached)."""
    low = name.lower()
    return tuple(
        tag for tag, sign in SIGNS.items() if sign.search(low if tag in _FOLDED_TAGS else name)
    )


def recognise(counts: Iterable[tuple[str, int]]) -> dict[str, WorkloadTag]:
    """Tag → ``{"count": intervals matched, "names": up to three of their names}``.

    ``counts`` holds each distinct name of a rank's intervals with how many intervals
    carry it.
    """
    out: dict[str, WorkloadTag] = {}
    for name, n in counts:
        if n <= 0:
            continue
        for tag in _tags(name):
            hit = out.setdefault(tag, {"count": 0, "names": []})
            hit["count"] += int(n)
            if len(hit["names"]) < 3:
                hit["names"].append(name if len(name) <= 60 else name[:57] + "...")
    return out


def merged(per_rank: Iterable[Mapping[str, WorkloadTag]]) -> dict[str, WorkloadTag]:
    """The tags of several ranks together (counts summed, first names kept)."""
    out: dict[str, WorkloadTag] = {}
    for tags in per_rank:
        for tag, hit in tags.items():
            cur = out.setdefault(tag, {"count": 0, "names": []})
            cur["count"] += int(hit.get("count", 0))
            for n in hit.get("names", []):
                if n not in cur["names"] and len(cur["names"]) < 3:
                    cur["names"].append(n)
    return out


def sparse_embeddings(tags: Mapping[str, Any]) -> bool:
    """TorchRec/FBGEMM sparse embeddings and no sign of expert parallelism."""
    return "torchrec" in tags and "moe" not in tags


def expert_parallel(tags: Mapping[str, Any]) -> bool:
    """Mixture-of-experts layers (DeepEP, fused-MoE kernels, expert routing)."""
    return "moe" in tags


def inference(tags: Mapping[str, Any]) -> bool:
    """An inference engine's steps: an engine's names, or PyTorch without training."""
    return "inference" in tags and "training" not in tags


def native_program(tags: Mapping[str, Any]) -> bool:
    """A C/C++/Fortran (CUDA, MPI) program: GPU work without any PyTorch name."""
    return "pytorch" not in tags


def name_counts(names: Sequence[str], name: npt.NDArray[np.integer]) -> list[tuple[str, int]]:
    """Each distinct name of a rank's intervals with how many intervals carry it."""
    if not len(name):
        return []
    counts = np.bincount(np.asarray(name, np.int64), minlength=len(names))
    return [(names[i], int(counts[i])) for i in np.flatnonzero(counts).tolist()]
