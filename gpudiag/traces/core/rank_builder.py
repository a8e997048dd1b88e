"""A format's raw columns → RankTimeline: the rules every format shares, applied once.

:func:`build_rank` refines kinds by name and by launcher (:mod:`.launchers`), checks the
GPU/CPU clocks against the launch links (:func:`check_clocks`), picks the training thread,
resolves the steps (:mod:`gpudiag.traces.core.step_ranges`) and notes what the trace covers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.config import LoaderRules
from gpudiag.traces.core.common import (
    DEFAULT_RULES,
    NamePatterns,
    RawColumns,
    main_lane,
    refine_kinds,
)
from gpudiag.traces.core.launchers import comm_by_launch
from gpudiag.traces.core.step_ranges import resolve_steps
from gpudiag.traces.schema import Kind, PythonFrames, RankMeta, RankTimeline, gpu_lanes

# GPU/CPU clocks. A GPU op cannot start before its launch call starts, and an op launched by
# a blocking call (a synchronous copy) ends before that call returns. Violations beyond
# ``LoaderRules.clock_tolerance_ns`` mean the GPU clock is offset from the host's.
_BLOCKING_LAUNCH = re.compile(r"^(cuda|hip)Memcpy(2D)?(_v\d+)?$|^hipMemcpyWithStream$")
# Of a blocking copy call, only a device-to-host copy is complete when it returns (a pageable
# host-to-device copy returns once staged, a device-to-device one at once).
_COMPLETE_ON_RETURN = re.compile(r"^Memcpy DtoH\b")
# A copy followed on its thread by a stream synchronisation (``.item()``, ``.cpu()``) is
# complete when the synchronisation returns; every op launched before a device
# synchronisation is complete when it returns.
_COPY_OP = re.compile(r"^Memcpy ")
_STREAM_SYNC = re.compile(r"^(cuda|hip)StreamSynchronize(_v\d+)?$")
_DEVICE_SYNC = re.compile(r"^(cuda|hip)DeviceSynchronize(_v\d+)?$")


def _clock_shift(
    upper: int, lower: int | None, lat: npt.NDArray[np.int64], rules: LoaderRules
) -> int | None:
    """The GPU clock's offset that fits the launch links (``lat``), or None when none does.

    A blocking call returns within µs of its copy's end, while the least launch latency can
    be larger: the blocking copies' bound is the closer one.
    """
    tol = rules.clock_tolerance_ns
    if lower is not None and lower > upper + tol:
        return None
    shift = upper if lower is None else lower
    late = np.count_nonzero(lat - shift < -tol)
    return None if late > rules.clock_residue_ratio * lat.size else shift


def _max_or_none(x: npt.NDArray[np.int64]) -> int | None:
    return int(x.max()) if x.size else None


@dataclass
class _Links:
    """The linked GPU ops of a rank and their launch calls (indices into the columns)."""

    ops: npt.NDArray[np.int64]
    call: npt.NDArray[np.int64]
    next_call: npt.NDArray[np.int64]  # the next runtime call on the launch call's thread, or -1
    rt: npt.NDArray[np.int64]  # every host runtime call


def _links(cols: RawColumns, kind: npt.NDArray[np.int64], is_gpu: npt.NDArray[np.bool_]) -> _Links:
    rt = np.flatnonzero((kind == Kind.RUNTIME) & ~is_gpu)
    ops = np.flatnonzero(is_gpu & (cols.launch_ns >= 0))
    none = np.zeros(0, np.int64)
    if not rt.size or not ops.size:
        return _Links(none, none, none, rt)
    order = rt[np.argsort(cols.start_ns[rt], kind="stable")]
    rs = cols.start_ns[order]
    k = np.searchsorted(rs, cols.launch_ns[ops])
    hit = k < rs.size
    hit[hit] = rs[k[hit]] == cols.launch_ns[ops[hit]]
    ops, call = ops[hit], order[k[hit]]
    by_thread = rt[np.lexsort((cols.start_ns[rt], cols.lane[rt]))]
    pos = np.empty(cols.start_ns.size, np.int64)
    pos[by_thread] = np.arange(by_thread.size)
    j = pos[call] + 1
    ok = j < by_thread.size
    nxt = np.full(call.size, -1, np.int64)
    nxt[ok] = by_thread[j[ok]]
    nxt[ok] = np.where(cols.lane[nxt[ok]] == cols.lane[call[ok]], nxt[ok], -1)
    return _Links(ops, call, nxt, rt)


def _lower_bounds(
    cols: RawColumns, lk: _Links, sel: npt.NDArray[np.bool_]
) -> tuple[int | None, int | None, int]:
    """The GPU clock's least offset on one device: (tight bound, loose bound, copies used).

    Tight: a device-to-host copy of a blocking call ends before the call returns, and a copy
    whose launch call is followed on its thread by a stream synchronisation ends before that
    synchronisation returns (``.item()``, ``.cpu()``). Loose: every op launched before a
    device synchronisation started ends before it returns.
    """
    names = cols.names
    blocking = np.array([bool(_BLOCKING_LAUNCH.search(n)) for n in names], bool)
    dtoh = np.array([bool(_COMPLETE_ON_RETURN.search(n)) for n in names], bool)
    copy = np.array([bool(_COPY_OP.search(n)) for n in names], bool)
    ssync = np.array([bool(_STREAM_SYNC.search(n)) for n in names], bool)
    dsync = np.array([bool(_DEVICE_SYNC.search(n)) for n in names], bool)
    o, c, nx = lk.ops[sel], lk.call[sel], lk.next_call[sel]
    blk = blocking[cols.name[c]] & dtoh[cols.name[o]]
    synced = (nx >= 0) & copy[cols.name[o]]
    synced[synced] = ssync[cols.name[nx[synced]]]
    tight = np.concatenate(
        [
            cols.end_ns[o[blk]] - cols.end_ns[c[blk]],
            cols.end_ns[o[synced]] - cols.end_ns[nx[synced]],
        ]
    )
    loose = []
    for d in lk.rt[dsync[cols.name[lk.rt]]].tolist():
        before = cols.launch_ns[o] < cols.start_ns[d]
        if before.any():
            loose.append(int(cols.end_ns[o[before]].max() - cols.end_ns[d]))
    loose_b = max(loose) if loose else None
    return _max_or_none(tight), loose_b, int(np.count_nonzero(blk) + np.count_nonzero(synced))


def check_clocks(
    cols: RawColumns,
    kind: npt.NDArray[np.int64],
    meta: RankMeta,
    rules: LoaderRules = DEFAULT_RULES,
) -> None:
    """Detect a GPU/CPU clock offset per device from the launch links; correct it or say so.

    Per device, with S/E a GPU op's start/end and L/R its launch call's start/return:
    the offset Δ (GPU clock − host clock) satisfies Δ ≤ min(S − L) over every linked op
    (no op starts before its launch) and Δ ≥ E − R over the copies that end before a call
    returns: the device-to-host copies of blocking calls (``cudaMemcpy``), a copy followed on
    its thread by a stream synchronisation; and Δ ≥ E − R of every op launched before a
    device synchronisation (a looser bound). When either bound is violated by more than
    ``rules.clock_tolerance_ns`` the GPU times are shifted by the copies' bound (else by
    the launch bound) and a note says so. When the bounds contradict each other, the shift
    leaves more than ``rules.clock_residue_ratio`` of ops starting before their launch, or
    every op starts ``rules.clock_late_ns`` after its launch with nothing to tell an offset
    from a GPU that far behind, nothing is shifted and ``meta.clock_unreliable`` is set:
    compute and host time are not split.
    """
    if not len(cols.start_ns):
        return
    tol = rules.clock_tolerance_ns
    gpu_lane = gpu_lanes(cols.lanes)
    is_gpu = gpu_lane[cols.lane]
    lk = _links(cols, kind, is_gpu)
    if not lk.ops.size:
        return
    device = device_of_lane(cols.lanes)[cols.lane[lk.ops]]
    for dev in np.unique(device).tolist():
        sel = device == dev
        o, c = lk.ops[sel], lk.call[sel]
        lat = cols.start_ns[o] - cols.start_ns[c]
        upper = int(lat.min())
        tight, loose, n_tight = _lower_bounds(cols, lk, sel)
        lower = tight if tight is not None else loose
        where = f"device {dev}" if dev >= 0 else "the GPU"
        if upper >= -tol and (lower is None or lower <= tol):
            if upper >= rules.clock_late_ns:
                meta.clock_unreliable = True
                meta.notes.append(
                    f"every GPU op on {where} starts at least {upper / 1e6:.1f} ms after its "
                    "launch call, and no copy or synchronisation tells a GPU clock offset "
                    "from a GPU that far behind: compute and host time cannot be split"
                )
            continue
        shift = _clock_shift(upper, tight, lat, rules)
        evidence = []
        if upper < -tol:
            evidence.append(f"GPU ops start up to {-upper / 1e6:.3f} ms before their launch calls")
        if lower is not None and lower > tol:
            evidence.append(
                f"GPU work ends up to {lower / 1e6:.3f} ms after the calls that "
                "wait for it returned"
            )
        what = " and ".join(evidence)
        if shift is None or (tight is None and loose is not None and loose > shift + tol):
            meta.clock_unreliable = True
            meta.notes.append(
                f"GPU and host clocks disagree on {where} ({what}) and no single offset fits "
                f"the {o.size} launch links: compute and host time cannot be split"
            )
            continue
        mine = is_gpu & (device_of_lane(cols.lanes)[cols.lane] == dev)
        cols.start_ns[mine] -= shift
        cols.end_ns[mine] -= shift
        meta.clock_shift_ns[int(dev)] = int(shift)
        meta.notes.append(
            f"GPU clock offset on {where}: {what}; GPU times shifted by "
            f"{-shift / 1e6:+.3f} ms to fit the {o.size} launch links"
            + (f" and {n_tight} copies that end before a call returns" if tight is not None else "")
        )


def device_of_lane(lanes: Sequence[str]) -> npt.NDArray[np.int64]:
    """Per lane: the device of a ``gpu:<device>:<stream>`` lane, else -1."""
    out = []
    for ln in lanes:
        parts = ln.split(":")
        ok = ln.startswith("gpu:") and len(parts) > 1 and parts[1].lstrip("-").isdigit()
        out.append(int(parts[1]) if ok else -1)
    return np.asarray(out, np.int64)


def build_rank(
    rank: int,
    cols: RawColumns,
    meta: RankMeta,
    patterns: NamePatterns,
    path: Path | str,
    *,
    kinds_final: bool = False,
    range_label: str = "range",
    no_ranges_hint: str = "",
) -> RankTimeline:
    """Apply the shared rules (kinds by name, training thread, steps, notes) → RankTimeline.

    ``kinds_final``: the format module already refined the kinds (it had to, to split
    ranks or processes); ``range_label`` names the format's ranges in messages ("NVTX
    range"); ``no_ranges_hint`` is said when the trace has no host ranges to take steps
    from.
    """
    cols, python = _split_python(cols)
    kind = cols.kind
    if not kinds_final:
        kind = refine_kinds(kind, patterns.flags(cols.names)[cols.name])
    kind, renamed = comm_by_launch(
        kind, cols.lane, cols.lanes, cols.start_ns, cols.end_ns, cols.launch_ns, patterns.rules
    )
    if renamed:
        meta.notes.append(
            f"{renamed} kernels with no communication name are communication: "
            "launched inside a collective operator or on the collectives' stream"
        )
    check_clocks(cols, kind, meta, patterns.rules)
    meta.main_lane = main_lane(cols.lanes, cols.lane, kind, cols.name, cols.names, meta.pid)
    is_gpu = _note_links(cols, meta, patterns.rules)
    steps, step_col, meta.main_lane = resolve_steps(
        cols.start_ns,
        cols.end_ns,
        kind,
        cols.lane,
        cols.name,
        cols.names,
        cols.lanes,
        meta.main_lane,
        patterns,
        path,
        range_label=range_label,
        no_ranges_hint=no_ranges_hint,
        python=None if patterns.explicit_step else python,  # frames, never steps, then
        kernel_launches=nputil.unique(cols.launch_ns[is_gpu & np.isin(kind, _KERNELS)]),
        launch_ns=cols.launch_ns,
    )
    if python is not None and not patterns.explicit_step:  # the step column covers them too
        cols, kind, step_col = _keep_chosen(cols, kind, step_col, python)
    return RankTimeline.from_columns(
        rank,
        start_ns=cols.start_ns,
        end_ns=cols.end_ns,
        kind=kind,
        lane=cols.lane,
        name=cols.name,
        lanes=cols.lanes,
        names=cols.names,
        step=step_col,
        launch_ns=cols.launch_ns,
        nbytes=cols.nbytes,
        coll_id=cols.coll_id,
        coll_name=cols.coll_name,
        coll_dtype=cols.coll_dtype,
        meta=meta,
        steps=steps,
        shape=cols.shape,
        shapes=cols.shapes,
        python=_frames(python),
    )


_KERNELS = [int(Kind.COMPUTE), int(Kind.COMM)]


def _note_links(cols: RawColumns, meta: RankMeta, rules: LoaderRules) -> npt.NDArray[np.bool_]:
    """Which rows are GPU work; a note when too few of them have a launch link."""
    gpu = gpu_lanes(cols.lanes)
    is_gpu: npt.NDArray[np.bool_] = gpu[cols.lane] if len(cols.lane) else np.zeros(0, bool)
    n_gpu = int(np.count_nonzero(is_gpu))
    linked = int(np.count_nonzero(is_gpu & (cols.launch_ns >= 0)))
    meta.has_gpu = meta.has_gpu or n_gpu > 0
    if n_gpu and linked < rules.launch_linked_min_ratio * n_gpu:
        meta.notes.append(
            f"only {linked} of {n_gpu} GPU ops have a launching runtime call in "
            "the trace; steps are assigned by time instead"
        )
    return is_gpu


_ROWS = (
    "start_ns",
    "end_ns",
    "kind",
    "lane",
    "name",
    "launch_ns",
    "nbytes",
    "coll_id",
    "coll_name",
    "coll_dtype",
    "shape",
)


def _rows(cols: RawColumns, idx: npt.NDArray[np.intp]) -> RawColumns:
    """The rows ``idx`` of ``cols`` (every per-row column)."""
    new: dict[str, Any] = {f: getattr(cols, f)[idx] for f in _ROWS if getattr(cols, f) is not None}
    return dataclasses.replace(cols, **new)


def _split_python(cols: RawColumns) -> tuple[RawColumns, RawColumns | None]:
    """The columns without their Python-function ranges, and those ranges (None: none)."""
    if cols.python_names is None or not len(cols.name):
        return cols, None
    py = cols.python_names[cols.name] & (cols.kind == Kind.ANNOTATION)
    if not py.any():
        return dataclasses.replace(cols, python_names=None), None
    base = _rows(cols, np.flatnonzero(~py))
    return dataclasses.replace(base, python_names=None), _rows(cols, np.flatnonzero(py))


def _frames(python: RawColumns | None) -> PythonFrames | None:
    """Every Python call, chosen as a step or not, as a frame (hostcause.python_sites)."""
    if python is None:
        return None
    return PythonFrames(
        python.start_ns.astype(np.int64),
        python.end_ns.astype(np.int64),
        python.lane.astype(np.int32),
        python.name.astype(np.int32),
    )


def _keep_chosen(
    cols: RawColumns, kind: npt.NDArray[np.int64], step_col: npt.NDArray[np.int32], py: RawColumns
) -> tuple[RawColumns, npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """The columns, kinds and step column with the Python ranges chosen as steps appended."""
    n = len(kind)
    chosen = np.flatnonzero(step_col[n:] >= 0)
    step_col = np.concatenate([step_col[:n], step_col[n:][chosen]])
    return _join(cols, py, chosen), np.concatenate([kind, py.kind[chosen]]), step_col


def _join(cols: RawColumns, extra: RawColumns, idx: npt.NDArray[np.intp]) -> RawColumns:
    """``cols`` with the rows ``idx`` of ``extra`` appended."""
    new: dict[str, Any] = {
        f: np.concatenate([getattr(cols, f), getattr(extra, f)[idx]])
        for f in _ROWS
        if getattr(cols, f) is not None
    }
    return dataclasses.replace(cols, **new)
