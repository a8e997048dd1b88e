"""FLOPs and bytes of one operator from its recorded inputs (``record_shapes``).

The performance model of each family, from the operator's ``Input Dims``, ``Input type``
and, where the trace has them, ``Concrete Inputs`` (strides, flags):

* **GEMM** — ``mm(A[M,K], B[K,N])``, ``addmm(bias, A, B)``: 2·M·K·N; ``bmm``/``baddbmm``
  with a batch b: 2·b·M·K·N; ``matmul`` broadcasts its batch dimensions; ``linear(x[…,K],
  W[N,K])``: 2·prod(x[:-1])·K·N; ``mv``/``addmv``: 2·M·N; ``_scaled_mm`` (fp8): 2·M·K·N.
* **convolution** — ``convolution(x[N,C,*S], w[Co,C/g,*k], bias, stride, padding, dilation,
  transposed, output_padding, groups)``: 2·N·Co·prod(out)·(C/g)·prod(k), the output size
  from the concrete stride, padding and dilation (no concrete inputs: not modelled, rather
  than guessed: a stride-2 layer would count four times its work); its
  ``convolution_backward(grad_out, x, w, …, output_mask)``: the forward's FLOPs once for
  each gradient the mask asks (input, weight).
* **attention** — ``scaled_dot_product_attention`` and its flash / efficient / cuDNN
  kernels' operators, ``q[B,H,L,E]``, ``k[B,H,S,E]``, ``v[B,H,S,Ev]``: 2·B·H·L·S·(E+Ev)
  (QKᵀ and PV), halved when causal; backward 2.5× the forward (five products of that size,
  QKᵀ recomputed), as FlashAttention's authors and TraceLens count it.
* **bytes families** (normalisation, softmax, elementwise): bytes read (every tensor
  input) plus bytes written (one output the size of the largest input); their figure is
  bandwidth, not FLOP/s.

A convolution's input layout comes from its ``Input Strides`` where the trace records them:
contiguous NCHW strides say ``nchw``, channels-last ones (C innermost) ``nhwc``.

The format path is the first tensor input's type: ``float`` → fp32 (TF32 when the kernels
say so), ``c10::BFloat16`` → bf16, ``c10::Half`` → fp16, ``c10::Float8_*`` → fp8. Anything the
model cannot read (a missing or odd shape) gives ``None``: the operator is not modelled.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from gpudiag._support.records import dataclass

# operator (without ``aten::``) → family, for the operators with a model
GEMM_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addmv", "mv"}
)
CONV_OPS = frozenset({"convolution", "convolution_backward"})
ATTENTION_OPS = frozenset(
    {
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    }
)
NORM_OPS = frozenset(
    {
        "native_layer_norm",
        "layer_norm",
        "native_layer_norm_backward",
        "native_batch_norm",
        "batch_norm",
        "native_group_norm",
        "group_norm",
        "rms_norm",
        "_fused_rms_norm",
    }
)
SOFTMAX_OPS = frozenset(
    {"softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data"}
)
ELEMENTWISE_OPS = frozenset(
    {
        "add",
        "add_",
        "mul",
        "mul_",
        "sub",
        "sub_",
        "div",
        "div_",
        "relu",
        "relu_",
        "gelu",
        "gelu_backward",
        "silu",
        "silu_backward",
        "sigmoid",
        "tanh",
        "threshold_backward",
        "native_dropout",
        "dropout",
    }
)
FLOP_FAMILIES = ("GEMM", "convolution", "attention")
BYTE_FAMILIES = ("normalisation", "elementwise")

TYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::half": 2,
    "c10::bfloat16": 2,
    "half": 2,
    "bfloat16": 2,
    "int": 4,
    "long int": 8,
    "long": 8,
    "short int": 2,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
    "c10::float8_e4m3fnuz": 1,
    "c10::float8_e5m2fnuz": 1,
    "c10::complexfloat": 8,
}
_PATHS = {
    "float": "fp32",
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::half": "fp16",
    "half": "fp16",
    "double": "fp64",
}
_INTS = re.compile(r"-?\d+")


@dataclass(frozen=True)
class OpWork:
    """What one operator computes: its family, FLOPs (or bytes) and format path."""

    family: str
    flops: float  # 0 for the bytes families
    bytes: float  # bytes read and written (every family; the bytes families' figure)
    path: str  # "fp32", "bf16", "fp16", "fp8", "fp64", "" unknown
    min_dim: int = 0  # GEMMs: the smallest of M, N and K (0 for the other families)
    # convolutions: the input's memory format from its strides ("nchw", "nhwc"), "" unknown
    layout: str = ""


def family_of(op: str) -> str | None:
    """The modelled family of an operator name (``aten::mm`` → GEMM), None when unmodelled."""
    base = op.removeprefix("aten::")
    if base in GEMM_OPS:
        return "GEMM"
    if base in CONV_OPS:
        return "convolution"
    if base in ATTENTION_OPS:
        return "attention"
    if base in NORM_OPS or base in SOFTMAX_OPS:
        return "normalisation"
    if base in ELEMENTWISE_OPS:
        return "elementwise"
    return None


def op_work(op: str, shape_text: str) -> OpWork | None:
    """The work of one operator from the loader's shape text (inputs, types, concrete values)."""
    fam = family_of(op)
    if fam is None:
        return None
    decoded = decode_shape(shape_text)
    if decoded is None:
        return None
    dims, types, concrete = decoded
    tensors = [
        (d, t)
        for d, t in zip(dims, types, strict=False)
        if _is_shape(d) and d and isinstance(t, str) and t.lower() in TYPE_BYTES
    ]
    if not tensors:
        return None
    path = _path(tensors[0][1])
    nbytes = float(sum(math.prod(d) * TYPE_BYTES[t.lower()] for d, t in tensors))
    base = op.removeprefix("aten::")
    if fam in BYTE_FAMILIES:
        largest = max(math.prod(d) * TYPE_BYTES[t.lower()] for d, t in tensors)
        return OpWork(fam, 0.0, nbytes + largest, path)
    flops = _flops(base, fam, dims, concrete)
    if flops is None or flops <= 0:
        return None
    if base == "_scaled_mm":
        path = "fp8"
    small = _gemm_min_dim(base, dims) if fam == "GEMM" else 0
    layout = _layout(dims, shape_text) if base == "convolution" else ""
    return OpWork(fam, float(flops), nbytes, path, small, layout)


def decode_shape(text: str) -> tuple[list[Any], list[Any], list[Any]] | None:
    """The loader's shape text as (Input Dims, Input type, Concrete Inputs); None if odd."""
    parts = text.split("\n")
    try:
        dims = msgspec.json.decode(parts[0])
        types = msgspec.json.decode(parts[1]) if len(parts) > 1 else []
        concrete = msgspec.json.decode(parts[2]) if len(parts) > 2 and parts[2] else []
    except (msgspec.DecodeError, ValueError):
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    return dims, types, concrete if isinstance(concrete, list) else []


def _layout(dims: list[Any], text: str) -> str:
    """A convolution input's memory format: contiguous NCHW, channels-last NHWC, or ""."""
    parts = text.split("\n")
    try:
        strides = msgspec.json.decode(parts[3]) if len(parts) > 3 and parts[3] else []
    except (msgspec.DecodeError, ValueError):
        return ""
    x = _shape(dims, 0)
    st: list[int] = strides[0] if isinstance(strides, list) and strides else []
    if x is None or len(x) < 3 or not _is_shape(st) or len(st) != len(x) or x[1] <= 1:
        return ""
    nchw = [math.prod(x[i + 1 :]) for i in range(len(x))]
    # channels last: C innermost, then the spatial dims, then N
    nhwc = [math.prod(x[1:]), 1, *[x[1] * math.prod(x[i + 1 :]) for i in range(2, len(x))]]
    size_one = [n == 1 for n in x]  # a size-1 dimension's stride says nothing
    same = [a == b or one for a, b, one in zip(st, nchw, size_one, strict=True)]
    if all(same):
        return "nchw"
    if all(a == b or one for a, b, one in zip(st, nhwc, size_one, strict=True)):
        return "nhwc"
    return ""


def _is_shape(d: Any) -> bool:
    return isinstance(d, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d
    )


def _path(t: str) -> str:
    w = t.lower()
    if w.startswith("c10::float8"):
        return "fp8"
    return _PATHS.get(w, "")


def _shape(dims: list[Any], i: int) -> list[int] | None:
    return dims[i] if i < len(dims) and _is_shape(dims[i]) and dims[i] else None


def _flops(base: str, fam: str, dims: list[Any], concrete: list[Any]) -> float | None:
    if fam == "GEMM":
        return _gemm(base, dims)
    if fam == "convolution":
        return _conv(base, dims, concrete)
    return _attention(base, dims, concrete)


def _gemm(base: str, dims: list[Any]) -> float | None:
    if base in ("addmm", "baddbmm", "addmv"):
        dims = dims[1:]
    a, b = _shape(dims, 0), _shape(dims, 1)
    if a is None or b is None:
        return None
    if base == "linear":  # x[..., K] · W[N, K]ᵀ
        if len(b) != 2 or a[-1] != b[1]:
            return None
        return 2.0 * math.prod(a[:-1]) * a[-1] * b[0]
    if base in ("mv", "addmv"):
        return 2.0 * a[0] * a[1] if len(a) == 2 else None
    if len(a) == 1 or len(b) == 1:  # matmul with a vector: a dot or matrix-vector product
        return 2.0 * math.prod(a) * (b[-1] if len(b) > 1 else 1)
    m, k, n = a[-2], a[-1], b[-1]
    if b[-2] != k:
        return None
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
    return 2.0 * batch * m * k * n


def _gemm_min_dim(base: str, dims: list[Any]) -> int:
    """The smallest of a GEMM's M, N and K (a vector product's: 1), 0 when unread."""
    if base in ("addmm", "baddbmm", "addmv"):
        dims = dims[1:]
    a, b = _shape(dims, 0), _shape(dims, 1)
    if a is None or b is None:
        return 0
    if base == "linear":
        return min(math.prod(a[:-1]), a[-1], b[0])
    if len(a) == 1 or len(b) == 1 or base in ("mv", "addmv"):
        return 1
    return min(a[-2], a[-1], b[-1])


def _ints(v: Any) -> list[int] | None:
    """A concrete int list as the trace writes it (``"[2, 2]"``), None when absent."""
    if isinstance(v, str) and v.startswith("["):
        return [int(x) for x in _INTS.findall(v)]
    return None


def _conv(base: str, dims: list[Any], concrete: list[Any]) -> float | None:
    if base == "convolution_backward":
        g, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
        if g is None or x is None or w is None or len(g) != len(x) or len(w) != len(x):
            return None
        per = 2.0 * g[0] * g[1] * math.prod(g[2:]) * w[1] * math.prod(w[2:])
        mask = concrete[10] if len(concrete) > 10 else ""
        grads = mask.count("True") if isinstance(mask, str) and mask.startswith("[") else 2
        grads = min(grads, 2) if grads else 0  # the bias gradient is a sum: no product
        return per * grads
    x, w = _shape(dims, 0), _shape(dims, 1)
    if x is None or w is None or len(x) != len(w) or len(x) < 3:
        return None
    nd = len(x) - 2
    stride = _ints(concrete[3]) if len(concrete) > 3 else None
    padding = _ints(concrete[4]) if len(concrete) > 4 else None
    dilation = _ints(concrete[5]) if len(concrete) > 5 else None
    transposed = len(concrete) > 6 and concrete[6] == "True"
    if stride is None or padding is None or dilation is None or transposed:
        return None  # not modelled rather than guessed (see the module docstring)
    stride, padding, dilation = (_fill(v, nd) for v in (stride, padding, dilation))
    out = [
        (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        for i in range(nd)
    ]
    if min(out) <= 0:
        return None
    return 2.0 * x[0] * w[0] * math.prod(out) * w[1] * math.prod(w[2:])


def _fill(v: list[int], n: int) -> list[int]:
    return v * n if len(v) == 1 else v[:n] if len(v) >= n else v + [v[-1]] * (n - len(v))


def _attention(base: str, dims: list[Any], concrete: list[Any]) -> float | None:
    backward = base.endswith("_backward")
    off = 1 if backward else 0  # backward: grad_out first, then q, k, v
    q, k, v = _shape(dims, off), _shape(dims, off + 1), _shape(dims, off + 2)
    if q is None or k is None or v is None or len(q) < 3 or len(k) != len(q):
        return None
    *batch, ln, e = q
    s, ev = k[-2], v[-1]
    fwd = 2.0 * math.prod(batch) * ln * s * (e + ev)
    if _causal(base, concrete):
        fwd *= 0.5
    return fwd * 2.5 if backward else fwd


# where each attention operator has ``is_causal`` among its arguments
_CAUSAL_AT = {
    "scaled_dot_product_attention": 5,
    "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_efficient_attention": 6,
    "_scaled_dot_product_cudnn_attention": 6,
}


def _causal(base: str, concrete: list[Any]) -> bool:
    """``is_causal`` where the trace gives it (the backward operators have it 12th)."""
    i = 11 if base.endswith("_backward") else _CAUSAL_AT.get(base, -1)
    return 0 <= i < len(concrete) and concrete[i] == "True"
