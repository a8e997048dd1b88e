"""A format's raw columns → RankTimeline: the rules every format shares, applied once.

:func:`build_rank` refines kinds by name, checks the GPU/CPU clocks against the launch
links (:func:`check_clocks`), picks the training thread, resolves the steps
(:mod:`gpudiag.traces.core.step_ranges`) and notes what the trace covers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpudiag.config import LoaderRules
from gpudiag.traces.core.common import (
    DEFAULT_RULES,
    NamePatterns,
    RawColumns,
    main_lane,
    refine_kinds,
)
from gpudiag.traces.core.step_ranges import resolve_steps
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

# GPU/CPU clocks. A GPU op cannot start before its launch call starts, and an op launched by
# a blocking call (a synchronous copy) ends before that call returns. Violations beyond
# ``LoaderRules.clock_tolerance_ns`` mean the GPU clock is offset from the host's.
_BLOCKING_LAUNCH = re.compile(r"^(cuda|hip)Memcpy(2D)?(_v\d+)?$|^hipMemcpyWithStream$")
# Of a blocking copy call, only a device-to-host copy is complete when it returns (a pageable
# host-to-device copy returns once staged, a device-to-device one at once).
_COMPLETE_ON_RETURN = re.compile(r"^Memcpy DtoH\b")


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


def check_clocks(
    cols: RawColumns,
    kind: npt.NDArray[np.int64],
    meta: RankMeta,
    rules: LoaderRules = DEFAULT_RULES,
) -> None:
    """Detect a GPU/CPU clock offset per device from the launch links; correct it or say so.

    Per device, with S/E a GPU op's start/end and L/R its launch call's start/return:
    the offset Δ (GPU clock − host clock) satisfies Δ ≤ min(S − L) over every linked op
    (no op starts before its launch) and Δ ≥ max(E − R) over the device-to-host copies of
    blocking calls (``cudaMemcpy``: such a copy ends before the call returns). When either
    bound is violated by more than ``rules.clock_tolerance_ns`` the GPU times are shifted by
    the blocking copies' bound (else by the launch bound) and a note says so; when the
    bounds contradict each other or the shift leaves more than ``rules.clock_residue_ratio``
    of ops starting before their launch, nothing is shifted and ``meta.clock_unreliable``
    is set: compute and host time are not split.
    """
    if not len(cols.start_ns):
        return
    tol = rules.clock_tolerance_ns
    gpu_lane = np.array([ln.startswith("gpu:") for ln in cols.lanes], bool)
    is_gpu = gpu_lane[cols.lane]
    rt = np.flatnonzero((kind == Kind.RUNTIME) & ~is_gpu)
    ops = np.flatnonzero(is_gpu & (cols.launch_ns >= 0))
    if not rt.size or not ops.size:
        return
    order = rt[np.argsort(cols.start_ns[rt], kind="stable")]
    rs = cols.start_ns[order]
    k = np.searchsorted(rs, cols.launch_ns[ops])
    hit = k < rs.size
    hit[hit] = rs[k[hit]] == cols.launch_ns[ops[hit]]
    ops, call = ops[hit], order[k[hit]]
    if not ops.size:
        return
    blocking_name = np.array([bool(_BLOCKING_LAUNCH.search(n)) for n in cols.names], bool)
    dtoh = np.array([bool(_COMPLETE_ON_RETURN.search(n)) for n in cols.names], bool)
    device = device_of_lane(cols.lanes)[cols.lane[ops]]
    for dev in np.unique(device).tolist():
        sel = device == dev
        o, c = ops[sel], call[sel]
        lat = cols.start_ns[o] - cols.start_ns[c]
        upper = int(lat.min())
        blk = blocking_name[cols.name[c]] & dtoh[cols.name[o]]
        lower = int((cols.end_ns[o[blk]] - cols.end_ns[c[blk]]).max()) if blk.any() else None
        where = f"device {dev}" if dev >= 0 else "the GPU"
        if upper >= -tol and (lower is None or lower <= tol):
            if upper >= rules.clock_late_ns:
                meta.notes.append(
                    f"every GPU op on {where} starts at least {upper / 1e6:.1f} ms after its "
                    "launch call: the GPU clock may be offset from the host's, or the GPU ran "
                    "that far behind for the whole trace (not corrected)"
                )
            continue
        shift = _clock_shift(upper, lower, lat, rules)
        evidence = []
        if upper < -tol:
            evidence.append(f"GPU ops start up to {-upper / 1e6:.3f} ms before their launch calls")
        if lower is not None and lower > tol:
            evidence.append(
                f"blocking copies end up to {lower / 1e6:.3f} ms after their calls returned"
            )
        what = " and ".join(evidence)
        if shift is None:
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
            + (f" and {int(np.count_nonzero(blk))} blocking copies" if blk.any() else "")
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
    kind = cols.kind
    if not kinds_final:
        kind = refine_kinds(kind, patterns.flags(cols.names)[cols.name])
    check_clocks(cols, kind, meta, patterns.rules)
    meta.main_lane = main_lane(cols.lanes, cols.lane, kind, cols.name, cols.names, meta.pid)
    gpu = np.array([ln.startswith("gpu:") for ln in cols.lanes], bool)
    is_gpu = gpu[cols.lane] if len(cols.lane) else np.zeros(0, bool)
    n_gpu = int(np.count_nonzero(is_gpu))
    linked = int(np.count_nonzero(is_gpu & (cols.launch_ns >= 0)))
    meta.has_gpu = meta.has_gpu or n_gpu > 0
    if n_gpu and linked < patterns.rules.launch_linked_min_ratio * n_gpu:
        meta.notes.append(
            f"only {linked} of {n_gpu} GPU ops have a launching runtime call in "
            "the trace; steps are assigned by time instead"
        )
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
    )
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
    )
