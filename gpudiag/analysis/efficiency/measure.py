"""A rank's compute efficiency: modelled operators' work over their kernels' GPU time.

Each kernel is attributed to the operator that launched it: the outermost modelled
operator (:mod:`.flops`) whose host range contains the kernel's launching runtime call
(``launch_ns``) — ``aten::linear`` rather than the ``aten::addmm`` inside it, so no work
counts twice. Only compute kernels of the analysed steps count. Per family, achieved
TFLOP/s = Σ FLOPs ÷ Σ kernel time of the operators that launched at least one kernel there
(bytes families: GB/s), against the peak of the format path (:mod:`.peaks`).

The path of fp32 operators is TF32 when their kernels' names say so (``tf32``, ``xf32``,
``1688``/``16816`` tensor-op tiles), or when the achieved rate is above the fp32 peak and
within the TF32 one (then TF32 is the only path that fits). A rate above every peak claims
no share: the shapes or the device were misread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import nputil
from gpudiag.analysis.efficiency.flops import BYTE_FAMILIES, FLOP_FAMILIES, OpWork, op_work
from gpudiag.analysis.efficiency.peaks import Peak, peak_of
from gpudiag.analysis.model.efficiency import ComputeEfficiency, FamilyEfficiency
from gpudiag.analysis.model.kinds import EfficiencyGap
from gpudiag.analysis.rank.kernels import MATRIX
from gpudiag.analysis.rank.kernels import family as kernel_family
from gpudiag.traces.schema import Kind, RankTimeline

_TF32_KERNEL = re.compile(r"tf32|xf32|s1688|s16816|_1688|16816", re.IGNORECASE)
ABOVE_PEAK_TOLERANCE = 1.02  # a rounding margin over the table's peak


def efficiency_gap(tl: RankTimeline) -> EfficiencyGap:
    """Why :func:`rank_efficiency` found nothing.

    No operator input shapes, no GPU model named, or no kernel of the analysed steps tied
    to an operator of a modelled family.
    """
    if not len(tl.shapes):
        return "no_shapes"
    if not tl.meta.devices:
        return "no_device"
    return "unmodelled"


def rank_efficiency(
    tl: RankTimeline, windows: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
) -> ComputeEfficiency | None:
    """The rank's compute efficiency in the analysed steps; None without modelled work."""
    start, end = windows
    if not len(start) or not len(tl.shapes) or not tl.meta.devices:
        return None
    ops, works = _outermost_ops(tl)
    if not len(ops):
        return None
    kern = _step_kernels(tl, start, end)
    if not len(kern):
        return None
    owner = _owner(tl, ops, tl.launch_ns[kern])
    ok = owner >= 0
    dur = (tl.end_ns[kern] - tl.start_ns[kern]).astype(np.float64)
    op_ns = np.bincount(owner[ok], weights=dur[ok], minlength=len(ops))
    device = tl.meta.devices[0]
    peak = peak_of(device)
    fams = _families(tl, ops, works, op_ns, owner, kern, peak)
    if not fams:
        return None
    steps = len(start)
    flops = sum(f.flops or 0.0 for f in fams if f.family in FLOP_FAMILIES)
    step_ns = float(nputil.median(end - start))
    model = flops / steps / step_ns / 1e3 if flops and step_ns > 0 else None
    main = max((f for f in fams if f.flops), key=lambda f: f.flops or 0.0, default=None)
    main_path = main.path if main is not None else ""
    path_peak = peak.tflops(main_path) if peak is not None and main_path else None
    mfu_path, best = peak.best() if peak is not None else ("", 0.0)
    return ComputeEfficiency(
        device=device,
        peak_model=peak.model if peak is not None else "",
        families=fams,
        coverage=float(dur[ok].sum() / dur.sum()) if dur.sum() else 0.0,
        steps=steps,
        flops_per_step=flops / steps if flops else None,
        model_tflops=model,
        main_path=main_path,
        path_share=_share(model, path_peak),
        mfu=_share(model, best or None),
        mfu_path=mfu_path,
    )


def _share(v: float | None, peak: float | None) -> float | None:
    if v is None or not peak or v > peak * ABOVE_PEAK_TOLERANCE:
        return None
    return v / peak


def _outermost_ops(tl: RankTimeline) -> tuple[npt.NDArray[np.intp], list[OpWork]]:
    """Host operators with a model, none inside another on its thread, and their work."""
    cand = np.flatnonzero((tl.shape >= 0) & (tl.kind == Kind.CPU_OP))
    if not len(cand):
        return cand, []
    # each distinct (name, inputs) pair modelled once: the ops of a job repeat a few hundred
    key = (tl.name[cand].astype(np.int64) << 32) | tl.shape[cand].astype(np.int64)
    pairs, which = nputil.unique_inverse(key)
    models = [op_work(tl.names[k >> 32], tl.shapes[k & 0xFFFFFFFF]) for k in pairs.tolist()]
    has = np.array([w is not None for w in models], bool)[which]
    cand, which = cand[has], which[has]
    if not len(cand):
        return cand, []
    order = np.lexsort((-tl.end_ns[cand], tl.start_ns[cand], tl.lane[cand]))
    cand, which = cand[order], which[order]
    lane, end = tl.lane[cand], tl.end_ns[cand]
    prev = np.empty_like(end)
    prev[0] = np.iinfo(np.int64).min
    prev[1:] = end[:-1]
    new_lane = np.ones(len(cand), bool)
    new_lane[1:] = lane[1:] != lane[:-1]
    # running max of the previous ends, restarted on each lane
    seg = np.cumsum(new_lane) - 1
    prev[new_lane] = np.iinfo(np.int64).min
    running = _segmented_cummax(prev, seg)
    outer = running < end
    idx = cand[outer]
    return idx, [w for j in which[outer].tolist() if (w := models[j]) is not None]


def _segmented_cummax(v: npt.NDArray[np.int64], seg: npt.NDArray[np.intp]) -> Any:
    """``np.maximum.accumulate`` restarted at each new segment id (ids ascending; a lane each)."""
    out = np.empty_like(v)
    bounds = np.flatnonzero(np.diff(seg)) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(v)], strict=True):
        out[a:b] = np.maximum.accumulate(v[a:b])
    return out


def _step_kernels(tl: RankTimeline, start: Any, end: Any) -> npt.NDArray[np.intp]:
    """Compute kernels launched from the host and starting inside an analysed step."""
    k = np.flatnonzero((tl.kind == Kind.COMPUTE) & (tl.launch_ns >= 0))
    if not len(k):
        return k
    order = np.argsort(start)
    s, e = start[order], end[order]
    j = np.searchsorted(s, tl.start_ns[k], side="right") - 1
    inside = (j >= 0) & (tl.start_ns[k] < e[np.maximum(j, 0)])
    kept: npt.NDArray[np.intp] = k[inside]
    return kept


def _owner(tl: RankTimeline, ops: npt.NDArray[np.intp], launch: Any) -> npt.NDArray[np.intp]:
    """Index into ``ops`` of the operator whose range holds each launch, -1 when none."""
    order = np.argsort(tl.start_ns[ops], kind="stable")
    s, e = tl.start_ns[ops][order], tl.end_ns[ops][order]
    j = np.searchsorted(s, launch, side="right") - 1
    hit = (j >= 0) & (launch <= e[np.maximum(j, 0)])
    out = np.full(len(launch), -1, np.intp)
    out[hit] = order[j[hit]]
    return out


def _families(
    tl: RankTimeline,
    ops: Any,
    works: Sequence[OpWork],
    op_ns: Any,
    owner: Any,
    kern: Any,
    peak: Peak | None,
) -> list[FamilyEfficiency]:
    """One row per modelled family that launched kernels in the steps."""
    live = op_ns > 0
    family = np.array([w.family for w in works])
    out = []
    for fam in (*FLOP_FAMILIES, *BYTE_FAMILIES):
        sel = np.flatnonzero((family == fam) & live).tolist()
        if not sel:
            continue
        ns = float(op_ns[sel].sum())
        if fam in BYTE_FAMILIES:
            nbytes = float(sum(works[i].bytes for i in sel))
            gbps = nbytes / ns
            pk = peak.memory_gbps if peak is not None else None
            out.append(
                _bytes_row(
                    fam, len(sel), int(ns), nbytes, peak, gbps > (pk or gbps) * ABOVE_PEAK_TOLERANCE
                )
            )
            continue
        flops = float(sum(works[i].flops for i in sel))
        by_path: dict[str, float] = {}
        for i in sel:
            by_path[works[i].path] = by_path.get(works[i].path, 0.0) + works[i].flops
        path = max(by_path, key=by_path.__getitem__)
        basis = "inputs" if path else ""
        tflops = flops / ns / 1e3
        if path == "fp32" and _tf32_kernels(tl, kern, owner, sel):
            path, basis = "tf32", "kernel names"
        pk = peak.tflops(path) if peak is not None and path else None
        tol = ABOVE_PEAK_TOLERANCE
        if (
            path == "fp32"
            and peak is not None
            and peak.tf32
            and peak.fp32 * tol < tflops <= peak.tf32 * tol
        ):
            path, basis, pk = "tf32", "above the fp32 peak", peak.tf32
        above = pk is not None and tflops > pk * ABOVE_PEAK_TOLERANCE
        out.append(
            FamilyEfficiency(
                fam,
                path,
                basis,
                len(sel),
                int(ns),
                flops,
                None,
                tflops,
                None,
                pk,
                _share(tflops, pk),
                above,
                _min_dim_median(works, op_ns, sel) if fam == "GEMM" else None,
                _layout_ns(tl, kern, owner, sel) if fam == "convolution" else None,
                _nchw_share(works, op_ns, sel) if fam == "convolution" else None,
            )
        )
    return out


def _nchw_share(works: Sequence[OpWork], op_ns: Any, sel: list[int]) -> float | None:
    """The share of these operators' kernel time with NCHW inputs, None when unread."""
    known = [(works[i].layout, float(op_ns[i])) for i in sel if works[i].layout]
    total = sum(ns for _, ns in known)
    if not total:
        return None
    return sum(ns for lay, ns in known if lay == "nchw") / total


def _min_dim_median(works: Sequence[OpWork], op_ns: Any, sel: list[int]) -> int | None:
    """The GEMMs' smallest dimension, median weighted by their kernel time."""
    dims = np.array([works[i].min_dim for i in sel], np.float64)
    ns = np.asarray(op_ns[sel], np.float64)
    known = dims > 0
    if not known.any():
        return None
    order = np.argsort(dims[known], kind="stable")
    d, w = dims[known][order], ns[known][order]
    half = np.searchsorted(np.cumsum(w), w.sum() / 2)
    return int(d[min(int(half), len(d) - 1)])


def _layout_ns(tl: RankTimeline, kern: Any, owner: Any, sel: list[int]) -> int:
    """GPU time of the kernels these operators launched that are no matrix kernels."""
    mine = np.isin(owner, np.asarray(sel))
    k = kern[mine]
    if not len(k):
        return 0
    names = tl.name[k]
    uniq = np.unique(names)
    other = [int(n) for n in uniq.tolist() if kernel_family(tl.names[int(n)]) not in MATRIX]
    if not other:
        return 0
    dur = tl.end_ns[k] - tl.start_ns[k]
    return int(dur[np.isin(names, np.asarray(other))].sum())


def _tf32_kernels(tl: RankTimeline, kern: Any, owner: Any, sel: list[int]) -> bool:
    """Whether most of these operators' kernel time is in kernels named for TF32."""
    mine = np.isin(owner, np.asarray(sel))
    if not mine.any():
        return False
    k = kern[mine]
    dur = (tl.end_ns[k] - tl.start_ns[k]).astype(np.float64)
    names = tl.name[k]
    uniq = np.unique(names)
    tf = {int(n) for n in uniq.tolist() if _TF32_KERNEL.search(tl.names[int(n)])}
    if not tf:
        return False
    is_tf = np.isin(names, np.fromiter(tf, np.int64))
    return bool(dur[is_tf].sum() > 0.5 * dur.sum())


def run_efficiency(ranks: Sequence[ComputeEfficiency]) -> ComputeEfficiency | None:
    """Every rank's efficiency together: work and kernel time summed per family.

    Ranks of one job run one device model; with several models the run's figure is withheld
    (per-rank figures stay in each rank's evidence).
    """
    if not ranks or len({r.device for r in ranks}) != 1:
        return None
    peak = peak_of(ranks[0].device)
    fams = _combined_families(ranks, peak)
    models = [r.model_tflops for r in ranks if r.model_tflops is not None]
    model = float(nputil.median(np.array(models))) if models else None
    main = max((f for f in fams if f.flops), key=lambda f: f.flops or 0.0, default=None)
    main_path = main.path if main is not None else ""
    path_peak = peak.tflops(main_path) if peak is not None and main_path else None
    mfu_path, best = peak.best() if peak is not None else ("", 0.0)
    per_step = [r.flops_per_step for r in ranks if r.flops_per_step is not None]
    return ComputeEfficiency(
        device=ranks[0].device,
        peak_model=ranks[0].peak_model,
        families=fams,
        coverage=float(np.mean([r.coverage for r in ranks])),
        steps=sum(r.steps for r in ranks),
        flops_per_step=float(nputil.median(np.array(per_step))) if per_step else None,
        model_tflops=model,
        main_path=main_path,
        path_share=_share(model, path_peak),
        mfu=_share(model, best or None),
        mfu_path=mfu_path,
    )


def _combined_families(
    ranks: Sequence[ComputeEfficiency], peak: Peak | None
) -> list[FamilyEfficiency]:
    """Each family's rows of every rank as one: work and kernel time summed."""
    fams: list[FamilyEfficiency] = []
    for fam in (*FLOP_FAMILIES, *BYTE_FAMILIES):
        rows = [f for r in ranks for f in r.families if f.family == fam]
        if not rows:
            continue
        ns = sum(f.kernel_ns for f in rows)
        ops = sum(f.ops for f in rows)
        paths = {f.path for f in rows}
        path = (
            rows[0].path
            if len(paths) == 1
            else max(
                paths, key=lambda p: sum(f.flops or f.bytes or 0.0 for f in rows if f.path == p)
            )
        )
        basis = rows[0].path_basis if len(paths) == 1 else "most of the work"
        if fam in BYTE_FAMILIES:
            nbytes = sum(f.bytes or 0.0 for f in rows)
            fams.append(_bytes_row(fam, ops, ns, nbytes, peak, any(f.above_peak for f in rows)))
            continue
        flops = sum(f.flops or 0.0 for f in rows)
        tflops = flops / ns / 1e3 if ns else 0.0
        pk = peak.tflops(path) if peak is not None and path else None
        dims = [(f.min_dim_median, f.kernel_ns) for f in rows if f.min_dim_median]
        layout = [f.layout_ns for f in rows if f.layout_ns is not None]
        nchw = [(f.nchw_share, f.kernel_ns) for f in rows if f.nchw_share is not None]
        fams.append(
            FamilyEfficiency(
                fam,
                path,
                basis,
                ops,
                ns,
                flops,
                None,
                tflops,
                None,
                pk,
                _share(tflops, pk),
                any(f.above_peak for f in rows),
                # the ranks' medians weighted by their kernel time (ranks run alike shapes)
                round(sum(d * w for d, w in dims) / max(sum(w for _, w in dims), 1))
                if dims
                else None,
                sum(layout) if layout else None,
                sum(v * w for v, w in nchw) / max(sum(w for _, w in nchw), 1) if nchw else None,
            )
        )
    return fams


def _bytes_row(
    fam: str, ops: int, ns: int, nbytes: float, peak: Peak | None, above: bool
) -> FamilyEfficiency:
    """A bytes family's row: its GB/s against the device's memory bandwidth."""
    gbps = nbytes / ns if ns else 0.0
    pk = peak.memory_gbps if peak is not None else None
    return FamilyEfficiency(
        fam, "memory", "", ops, ns, None, nbytes, None, gbps, pk, _share(gbps, pk), above
    )
