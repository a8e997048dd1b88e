"""What dominates compute: the top kernels (GPU) or operators (CPU) by time, grouped by family.

On GPU traces every kernel, copy and memset of the analysed steps counts with its
duration (kernels do not nest; kernels of concurrent streams each count — HTA's kernel
breakdown does the same). On CPU-only traces the training thread's operators count with
their *exclusive* (self) time: an operator's duration minus that of the operators it
calls, so ``aten::linear`` does not count its ``aten::addmm`` twice.

Families: **communication** is the loader's one classification of communication (the
interval's kind: :data:`gpudiag.config.COMM_KERNEL_LIBRARIES` for kernels, ``comm_host_re``
for host ranges), never a second pattern here, so a kernel in this family always counts as
communication in the shares; memcpy (copies and memsets, by kind). The others go by name
(first match wins, case-insensitive; :data:`FAMILIES`): attention, convolution, GEMM,
normalisation, reduction (softmax, losses, sums), embedding (lookups, gathers, scatters),
optimizer (fused/foreach optimizer kernels), elementwise, other. Kernel names are long C++
templates, so the patterns look for the library's words (``gemm``, ``cutlass``,
``Cijk_`` for rocBLAS/Tensile, ``flash``, ``fmha``, ``layer_norm``, ``elementwise``,
Triton's ``triton_poi``/``triton_red``) rather than exact names, in the kernel's own name
(before its template and argument lists) first, then in the whole signature.

Precision: a GEMM kernel whose name says fp32 (``sgemm``, ``f32f32``, ``_s1688``) — not
TF32 or a reduced type — is counted in ``fp32_gemm_share``. The matrix families (GEMM,
convolution, attention) have ``fp32_matrix_share``, the
share of their time in fp32 kernels, where a convolution or attention kernel is fp32 when
its name says so (``scudnn``, ``sgemm``, ``<float``, ``f32``, ``fp32``) and names no
reduced type (``half``, ``bf16``, ``bfloat16``, ``f16``, ``e4m3`` …): precision advice
covers cuDNN convolutions and attention, not only GEMMs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import lazyre
from gpudiag._support.nputil import unique
from gpudiag.analysis.model.diagnosis import KernelBreakdown, TopEntry
from gpudiag.traces.schema import Kind, RankTimeline

FAMILIES: tuple[tuple[str, str], ...] = (
    ("memcpy", r"^(memcpy|memset|cudamemcpy|hipmemcpy)|^aten::(copy_|to|_to_copy|contiguous)$"),
    ("attention", r"flash|fmha|attention|attn|sdpa|scaled_dot_product"),
    (
        "convolution",
        r"(^|[^a-z])conv(olution|olve|_?[123]d|[^a-z]|$)|cudnn.*(fprop|dgrad|wgrad)"
        r"|\d(fprop|dgrad|wgrad)_|winograd|implicit_?gemm|miopen|^aten::(cudnn_)?convolution",
    ),
    (
        "GEMM",
        r"gemm|gemv|cutlass|cublas|hipblas|^cijk_|xmma|wgmma|matmul|(^|[^a-z])bmm([^a-z]|$)"
        r"|^nvjet_"
        r"|^aten::(mm|addmm|bmm|baddbmm|linear|matmul|addmv|mv|dot|einsum)$|_mm_|splitk",
    ),
    ("normalisation", r"norm|rms_?norm|welford|(^|[^a-z])bn_(fw|bw)"),
    (
        "reduction",
        r"softmax|reduce|reduction|cross_?entropy|nll_?loss|triton_(red|per)_|argmax"
        r"|^aten::(sum|mean|max|min|amax|var|std|log_softmax|_softmax)$|cumsum|topk|sort",
    ),
    ("embedding", r"embedding|embedding_bag|gather_kernel|index_select|scatter"),
    (
        "optimizer",
        r"multi_tensor|foreach|fused_?adam|adamw?(functor|_|\b)|(^|[^a-z])sgd|lamb(?!da)"
        r"|adagrad|optimizer",
    ),
    (
        "elementwise",
        r"elementwise|triton_poi_|pointwise|vectorized|unrolled|fill|copy|cast"
        r"|gelu|silu|relu|sigmoid|tanh|dropout|transpose|^aten::(add|mul|sub|div|add_|mul_"
        r"|relu|gelu|silu|threshold_backward|where|clamp|neg|exp|pow|rsqrt|sqrt"
        r"|zero_|fill_|ones_like|zeros_like|empty|t|transpose|view|reshape"
        r"|permute|expand|cat|stack|index|embedding)",
    ),
)
_FAMILY_RES = [(f, lazyre.compile(p, re.IGNORECASE)) for f, p in FAMILIES]
_TEMPLATE = re.compile(r"[<(]")
_GENERIC = re.compile(r"(^|::)\s*(void\s+)?(device_)?kernel\d*\s*$", re.IGNORECASE)
_FP32_GEMM = re.compile(r"sgemm|f32f32|_s\d{3,4}gemm|gemm.*_f32_|fp32", re.IGNORECASE)
_REDUCED = re.compile(r"tf32|bf16|fp16|f16|h\d{3,4}gemm|hgemm|e4m3|e5m2|i8|int8", re.IGNORECASE)

TOP = 10  # entries kept per rank (the console shows 5)


def family(name: str, kind: int | None = None) -> str:
    """The family of a kernel or operator name (see the module docstring)."""
    if kind in (Kind.MEMCPY, Kind.MEMSET):
        return "memcpy"
    if kind == Kind.COMM:
        return "communication"
    return _name_family(name)


@functools.lru_cache(maxsize=1 << 15)
def _name_family(name: str) -> str:
    """The family by name alone (ranks of one job share their kernels: cached)."""
    # the kernel's own name first: its template and argument lists name other things —
    # unless it is a generic one (CUTLASS's and cuDNN's ``Kernel<…>``): then they say it
    base = _TEMPLATE.split(name, maxsplit=1)[0]
    order = (base, name) if base != name else (name,)
    if base != name and _GENERIC.search(base):
        order = (_TEMPLATE.split(name, maxsplit=1)[1], *order)
    for text in order:
        for fam, rx in _FAMILY_RES:
            if rx.search(text):
                return fam
    return "other"


MATRIX = ("GEMM", "convolution", "attention")
_FP32_ANY = re.compile(r"scudnn|sgemm|<float\b|\bfloat\b|f32|fp32", re.IGNORECASE)
_HALF = re.compile(r"half|bfloat16|bf16|fp16|f16|e4m3|e5m2|int8|tf32", re.IGNORECASE)


def is_fp32_matrix(name: str, fam: str) -> bool:
    """A GEMM, convolution or attention kernel computing in full fp32."""
    if fam == "GEMM":
        return is_fp32_gemm(name)
    return fam in MATRIX and bool(_FP32_ANY.search(name)) and not _HALF.search(name)


def is_fp32_gemm(name: str) -> bool:
    """A GEMM kernel computing in full fp32 (not TF32, half or 8-bit)."""
    return bool(_FP32_GEMM.search(name)) and not _REDUCED.search(name)


def _exclusive(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Self time of nested ranges on one thread (sorted by start, outer first)."""
    self_t = (end - start).copy()
    stack: list[int] = []
    for i in range(start.size):
        while stack and end[stack[-1]] <= start[i]:
            stack.pop()
        if stack:  # the innermost open range is the parent
            self_t[stack[-1]] -= min(end[i], end[stack[-1]]) - start[i]
        stack.append(i)
    out: npt.NDArray[np.int64] = np.maximum(self_t, 0)
    return out


def breakdown(
    tl: RankTimeline, within: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]], gpu: bool
) -> KernelBreakdown | None:
    """Per-name time, count and family of the rank's kernels (or operators) in ``within``.

    ``within`` are the analysed steps' (start, end) periods; None when there is nothing
    to count.
    """
    lo, hi = within
    if not len(tl) or not lo.size:
        return None
    lane_gpu = tl.gpu_lane_mask()[tl.lane]
    if gpu:
        mask = lane_gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET])
        idx = np.flatnonzero(mask)
        t = (tl.end_ns[idx] - tl.start_ns[idx]).astype(np.int64)
    else:
        mask = ~lane_gpu & (tl.kind == Kind.CPU_OP)
        idx = np.flatnonzero(mask)
        t = np.zeros(idx.size, np.int64)
        for lane in unique(tl.lane[idx]).tolist():
            sel = np.flatnonzero(tl.lane[idx] == lane)
            order = sel[np.lexsort((-tl.end_ns[idx[sel]], tl.start_ns[idx[sel]]))]
            t[order] = _exclusive(tl.start_ns[idx[order]], tl.end_ns[idx[order]])
    if not idx.size:
        return None
    k = np.searchsorted(lo, tl.start_ns[idx], side="right") - 1
    inside = (k >= 0) & (tl.start_ns[idx] < hi[np.maximum(k, 0)])
    idx, t = idx[inside], t[inside]
    total = int(t.sum())
    if total <= 0:
        return None
    names = tl.name[idx]
    time_by = np.bincount(names, weights=t.astype(np.float64), minlength=len(tl.names))
    count_by = np.bincount(names, minlength=len(tl.names))
    kind_of = np.full(len(tl.names), -1, np.int64)
    kind_of[names] = tl.kind[idx]
    fams: dict[str, float] = {}
    fp32 = fp32_matrix = 0.0
    for i in np.flatnonzero(time_by).tolist():
        fam = family(tl.names[i], int(kind_of[i]))
        fams[fam] = fams.get(fam, 0.0) + time_by[i]
        if fam == "GEMM" and is_fp32_gemm(tl.names[i]):
            fp32 += time_by[i]
        if is_fp32_matrix(tl.names[i], fam):
            fp32_matrix += time_by[i]
    matrix = sum(fams.get(f, 0.0) for f in MATRIX)
    top = _top(tl.names, time_by, count_by, kind_of, total)
    return KernelBreakdown(
        unit="kernel" if gpu else "operator",
        total_ns=total,
        top=top,
        families={f: v / total for f, v in sorted(fams.items(), key=lambda kv: -kv[1])},
        fp32_gemm_share=fp32 / fams["GEMM"] if fams.get("GEMM") else 0.0,
        fp32_matrix_share=fp32_matrix / matrix if matrix else 0.0,
    )


def _top(
    names: Sequence[str],
    time_by: npt.NDArray[Any],
    count_by: npt.NDArray[Any],
    kind_of: npt.NDArray[Any],
    total: int,
) -> list[TopEntry]:
    """The largest rows, one per displayed name (:func:`display_name`), family of the largest."""
    rows: dict[str, list[float]] = {}  # display name → [time, count, largest part, raw index]
    for i in np.flatnonzero(time_by).tolist():
        row = rows.setdefault(display_name(names[i]), [0.0, 0, 0.0, i])
        row[0] += float(time_by[i])
        row[1] += int(count_by[i])
        if time_by[i] > row[2]:
            row[2], row[3] = float(time_by[i]), i
    best = sorted(rows.items(), key=lambda kv: -kv[1][0])[:TOP]
    return [
        TopEntry(
            name,
            family(names[int(r[3])], int(kind_of[int(r[3])])),
            int(r[0]),
            int(r[1]),
            r[0] / total,
        )
        for name, r in best
    ]


def combine(per_rank: Sequence[KernelBreakdown | None]) -> KernelBreakdown | None:
    """The run's breakdown from the ranks': times summed by name and by family."""
    present = [p for p in per_rank if p is not None]
    if not present:
        return None
    total = sum(p.total_ns for p in present)
    by_name: dict[str, tuple[str, int, int]] = {}
    fams: dict[str, float] = {}
    fp32 = gemm = fp32_matrix = matrix = 0.0
    for p in present:
        for e in p.top:
            fam, t, c = by_name.get(e.name, (e.family, 0, 0))
            by_name[e.name] = (fam, t + e.time_ns, c + e.count)
        for f, share in p.families.items():
            fams[f] = fams.get(f, 0.0) + share * p.total_ns
        g = p.families.get("GEMM", 0.0) * p.total_ns
        gemm += g
        fp32 += p.fp32_gemm_share * g
        mx = sum(p.families.get(f, 0.0) for f in MATRIX) * p.total_ns
        matrix += mx
        fp32_matrix += p.fp32_matrix_share * mx
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP]
    return KernelBreakdown(
        unit=present[0].unit,
        total_ns=total,
        top=[TopEntry(n, f, t, c, t / total if total else 0.0) for n, (f, t, c) in top],
        families={f: v / total for f, v in sorted(fams.items(), key=lambda kv: -kv[1])}
        if total
        else {},
        fp32_gemm_share=fp32 / gemm if gemm else 0.0,
        fp32_matrix_share=fp32_matrix / matrix if matrix else 0.0,
    )


_NOISE = re.compile(r"std::enable_if<.*?>::type\s*")  # SFINAE return types: noise
_COMPILED = re.compile(r"(CompiledFxGraph|CompiledFunction)\s+([A-Za-z0-9]{6})[A-Za-z0-9]+")
_MANGLED_PART = re.compile(r"(\d+)")


def _demangle_prefix(name: str) -> str:
    """The qualified name of an Itanium-mangled symbol (``_ZN2ck16tensor_operation…``).

    Only the leading nested name (``_ZN <len><id>… E``) or plain name (``_Z <len><id>``) is
    read — template arguments and parameters are noise in a kernel table; the rest is
    dropped. Anything not in that form is returned as it is.
    """
    if not name.startswith("_Z"):
        return name
    i = 3 if name.startswith("_ZN") else 2
    parts: list[str] = []
    while i < len(name):
        m = _MANGLED_PART.match(name, i)
        if not m:
            break
        n = int(m.group(1))
        ident = name[m.end() : m.end() + n]
        if len(ident) < n or not ident:
            break
        parts.append(ident)
        i = m.end() + n
        if not name.startswith("_ZN"):
            break
    return "::".join(parts) if parts else name


def _fold_templates(text: str, keep: int = 1) -> str:
    """Templates nested deeper than ``keep`` levels become ``…``."""
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == "<":
            depth += 1
        if depth <= keep:
            out.append(ch)
        elif not out or out[-1] != "…":
            out.append("…")
        if ch == ">":
            depth = max(0, depth - 1)
    return "".join(out)


_ARGS = re.compile(r"(?<=[\w\]>])[<(]")  # a template or parameter list right after a name
_ANON = re.compile(r"\(anonymous namespace\)::|<unnamed>::")


@functools.lru_cache(maxsize=1 << 15)
def display_name(name: str) -> str:
    """A kernel or operator name as a person reads it in a table (one row per kernel).

    Mangled names are demangled to their qualified name; ``void``, ``std::enable_if<…>::type``
    return types, anonymous namespaces (``(anonymous namespace)``, Nsight's ``<unnamed>``),
    template arguments and parameter lists go — one row per kernel function — except for a
    generic name (``cutlass::Kernel<…>``), whose first level of template arguments names it;
    a space before a parenthesis is not a parameter list (``Memcpy HtoD (Pageable -> Device)``
    stays whole); torch.compile graph names keep 6 characters of their hash
    (``## Call CompiledFxGraph fudNjs… ##`` → ``Call CompiledFxGraph fudNjs``).
    """
    text = _demangle_prefix(name.strip())
    text = _NOISE.sub("", text)
    text = _COMPILED.sub(r"\1 \2", text).strip("# ").strip()
    if text.startswith("void "):
        text = text[5:]
    text = _ANON.sub("", text)
    m = _ARGS.search(text)
    if m is None:
        return re.sub(r"\s+", " ", text).strip() or name
    base = text[: m.start()]
    if m.group(0) == "<" and _GENERIC.search(base):
        depth, end = 0, len(text)
        for j in range(m.start(), len(text)):  # the template's own closing bracket
            depth += {"<": 1, ">": -1}.get(text[j], 0)
            if depth == 0:
                end = j + 1
                break
        return base + _fold_templates(re.sub(r"\([^()]*\)", "", text[m.start() : end]))
    return base.strip() or name
