"""The loader core shared by the format modules: name patterns, kinds, ranks, threads, steps.

A format module (:mod:`~gpudiag.traces.kineto`, :mod:`~gpudiag.traces.nsys`) turns its
file into raw columns — times, a coarse kind per interval, lanes, interned names, launch
times — and hands them to :func:`build_rank`, which applies the rules every format
shares, once:

* **kinds by name**: a kernel matching ``comm_kernel_re`` is communication; a host range
  matching ``comm_host_re`` is communication, ``data_re`` data loading, the step pattern a
  step (:class:`NamePatterns`);
* **the training thread** (:func:`main_lane`): the host lane with the step ranges, else
  with the ``Optimizer.step`` ranges, else the process's main thread (tid = pid), else
  the busiest host lane;
* **steps** (:func:`resolve_steps`): numbered step ranges on the training thread
  (``ProfilerStep#N``, ``gpudiag.step#N`` or ``--step-marker``), else the user's own
  iteration range found among the NVTX / ``record_function`` ranges
  (:func:`find_user_steps`), else periods ending where ``Optimizer.step`` ranges end, else
  one window over the trace; an explicit ``--step-marker`` that matches nothing, matches
  ranges on several threads or ranges that overlap themselves is an error naming the
  problem;
* **coverage notes**: GPU work without a launching runtime call, and where steps came
  from.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag import lazyre
from gpudiag.config import (
    AUTO_STEP_RE,
    DEFAULT_COMM_HOST_RE,
    DEFAULT_COMM_KERNEL_RE,
    DEFAULT_DATA_RE,
    LoaderRules,
    Thresholds,
)
from gpudiag.errors import InputError
from gpudiag.nputil import unique, unique_index
from gpudiag.records import dataclass
from gpudiag.traces.schema import I64, HostSteps, Kind, RankMeta, RankTimeline

OPTIMIZER_STEP = "Optimizer.step#"
# Optimizer.step ranges are user annotations since PyTorch 1.10; older (2021) traces file
# them as operators ("Operator"/"cpu_op").
_OPT_KINDS = (Kind.ANNOTATION, Kind.CPU_OP)
STEP_MAX = np.iinfo(np.int32).max

# Every time a loader accepts lies in [TIME_MIN_NS, TIME_MAX_NS] (about 1897 … 2116 as
# Unix epoch ns): the difference of any two then fits in int64, so the analysis's
# subtractions cannot wrap. Values outside are damaged and dropped (counted in notes).
TIME_MAX_NS = 2**62
TIME_MIN_NS = -(2**61)
RANK_MAX = np.iinfo(np.int32).max

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)
# Per-operator ranges (``aten::mul``, ``MulBackward0``, NCCL/CUDA/MPI API calls): never steps,
# left out of the "most frequent ranges" hint so they do not crowd the user's own out.
_OP_RANGE = lazyre.compile(
    r"::|Backward(N|\d*)$|^nccl[A-Z]|^cuda[A-Z]|^record_param_comms$|^P?MPI_"
)
_NUMBERED = lazyre.compile(r"(^|[\s#_:-])N$")
# Ranges of libraries and frameworks: never a training step (DALI's own ranges, NCCL's,
# cuDNN/cuBLAS, PyTorch's emit_nvtx operator ranges, torch.compile graphs, the profiler's
# and the optimizer's own ranges, gpudiag's).
LIBRARY_RANGE = lazyre.compile(
    r"^\[DALI\]|^nccl|^rccl|^(cudnn|cublas|cublasLt|cutlass|cufft|curand|cusparse)|::|"
    r", seq = |, op_id = |^autograd::|^## .* ##$|^Optimizer\.|^ProfilerStep#|"
    r"^enumerate\(|^gpudiag\.|Backward\d*$|^nvFusion|^nvfuser|^FusionExecutor|^CudaCodeGen|"
    r"^MPI(_|$)|^PMPI_",
    re.IGNORECASE,
)
# Phases, not iterations: an epoch or a train/eval phase encloses many steps.
PHASE_RANGE = lazyre.compile(
    r"\bepochs?\b|^\s*(train|training|test|testing|eval|evaluation|val|validation|"
    r"inference|warm-?up)\s*$",
    re.IGNORECASE,
)
STEP_NAME_HINT = lazyre.compile(r"step|iter|batch|train|\bit\b", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


DEFAULT_RULES = LoaderRules()


@dataclass(frozen=True)
class LoadOptions:
    """How inputs are read: the name patterns, an explicit step marker, the nsys binary."""

    comm_kernel_re: str = DEFAULT_COMM_KERNEL_RE
    comm_host_re: str = DEFAULT_COMM_HOST_RE
    data_re: str = DEFAULT_DATA_RE
    step_marker: str | None = None  # None: automatic (ProfilerStep#N, gpudiag.step#N, …)
    nsys: str | None = None  # nsys binary for exporting .nsys-rep reports (else found)
    rules: LoaderRules = DEFAULT_RULES  # step-finding and clock-check limits (Thresholds.loader)

    @classmethod
    def from_thresholds(cls, th: Thresholds, nsys: str | None = None) -> LoadOptions:
        """The options that the thresholds' patterns imply."""
        return cls(th.comm_kernel_re, th.comm_host_re, th.data_re, th.step_re, nsys, th.loader)


class NamePatterns:
    """The compiled patterns of a load, applied to each distinct name once."""

    COMM_KERNEL, COMM_HOST, DATA, STEP = range(4)

    def __init__(self, opts: LoadOptions) -> None:
        self.explicit_step = opts.step_marker is not None
        self.rules = opts.rules
        self.step_re = opts.step_marker if opts.step_marker is not None else AUTO_STEP_RE
        self.rx = [re.compile(p) for p in (opts.comm_kernel_re, opts.comm_host_re,
                                           opts.data_re, self.step_re)]  # fmt: skip

    def flags(self, names: Sequence[str]) -> npt.NDArray[np.bool_]:
        """One row per name: matches comm kernel, comm host, data, step."""
        return np.array([[bool(r.search(n)) for r in self.rx] for n in names], dtype=bool).reshape(
            len(names), len(self.rx)
        )

    def step_number(self, name: str) -> int | None:
        """The step number in a step range's name (group 1 of the pattern), if any."""
        m = self.rx[self.STEP].search(name)
        if m is None or not m.groups() or m.group(1) is None:
            return None
        try:
            return int(m.group(1))
        except ValueError:
            return None


def refine_kinds(
    kind: npt.NDArray[np.int64], name_flags: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """Kinds by name, for intervals whose name flags are ``name_flags`` (one row each).

    Kernels matching the comm-kernel pattern become COMM; host ranges (operators and
    annotations) matching the comm-host, data or step pattern become COMM, DATALOADER or
    STEP, in that order of precedence from last to first.
    """
    out: npt.NDArray[np.int64] = kind.copy()
    out[(kind == Kind.COMPUTE) & name_flags[:, NamePatterns.COMM_KERNEL]] = Kind.COMM
    host_range = (kind == Kind.CPU_OP) | (kind == Kind.ANNOTATION)
    out[host_range & name_flags[:, NamePatterns.COMM_HOST]] = Kind.COMM
    out[host_range & name_flags[:, NamePatterns.DATA]] = Kind.DATALOADER
    out[host_range & name_flags[:, NamePatterns.STEP]] = Kind.STEP
    return out


def rank_from_filename(path: Path) -> int | None:
    """The rank number in a file name (``rank-3``, ``rank3``, ``worker_3``), if any."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def check_rank(value: Any, path: Path | str, what: str, hint: str, low: int = 0) -> int:
    """``value`` as a rank (or a world size with ``low=1``); InputError when impossible.

    A rank is an integer in [``low``, 2^31 − 1]; booleans, strings, negative and huge
    values are refused with one line naming ``what``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= RANK_MAX:
        raise InputError(
            path, f"{what} is {json_words(value)}: not a rank (an integer {low} … {RANK_MAX})", hint
        )
    return int(value)


def json_words(value: Any) -> str:
    """A JSON value in words for a message: the number itself, else its type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value!r:.40}"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def dropped_notes(dropped: Mapping[str, int]) -> list[str]:
    """One note per reason something was dropped: ``"12 events with invalid timestamps …"``."""
    return [f"{n} {why}" for why, n in sorted(dropped.items()) if n]


def main_lane(
    lanes: Sequence[str],
    lane: npt.NDArray[np.integer],
    kind: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    pid: int | str | None = None,
) -> int:
    """The training thread: steps, else Optimizer.step ranges, else tid == pid, else busiest.

    Only host (``cpu:``) lanes are candidates.
    """
    if not len(lane):
        return -1
    host = np.array([ln.startswith("cpu:") for ln in lanes], bool)[lane]
    opt_names = [i for i, s in enumerate(names) if s.startswith(OPTIMIZER_STEP)]
    for mask in (
        kind == Kind.STEP,
        np.isin(name, opt_names) & np.isin(kind, _OPT_KINDS),
    ):
        mask = mask & host
        if mask.any():
            return int(np.bincount(lane[mask]).argmax())
    if pid is not None and f"cpu:{pid}" in lanes:
        return list(lanes).index(f"cpu:{pid}")
    busy = host & (kind != Kind.OS_WAIT)  # a thread that mostly waits is not the busiest
    if busy.any():
        return int(np.bincount(lane[busy], minlength=len(lanes)).argmax())
    return -1


def frequent_ranges(names: Sequence[str], name: npt.NDArray[np.integer], top: int = 6) -> str:
    """The most frequent range names, digits folded (``Batch N``), for a --step-marker hint."""
    if not len(name):
        return ""
    counts: Counter[str] = Counter()
    per_name = np.bincount(name, minlength=len(names))
    for i in np.flatnonzero(per_name).tolist():
        counts[re.sub(r"\d+", "N", names[i])] += int(per_name[i])
    user = [(n, c) for n, c in counts.items() if not _OP_RANGE.search(n)] or list(counts.items())
    # Numbered ranges (``Batch N``, ``iteration N``) first: steps are usually numbered.
    user.sort(key=lambda nc: (not _NUMBERED.search(nc[0]), -nc[1], nc[0]))
    return ", ".join(f"'{n}' ×{c}" for n, c in user[:top])


@dataclass
class RawColumns:
    """What a format module hands to :func:`build_rank`; kinds are coarse (before names)."""

    start_ns: I64
    end_ns: I64
    kind: npt.NDArray[np.int64]
    lane: npt.NDArray[np.int64]
    name: npt.NDArray[np.int64]
    lanes: list[str]
    names: list[str]
    launch_ns: I64
    nbytes: I64
    coll_id: I64 | None = None
    coll_name: npt.NDArray[np.int64] | None = None


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
            evidence.append(f"blocking copies end up to {lower / 1e6:.3f} ms after their calls "
                            "returned")  # fmt: skip
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
        meta.notes.append(f"only {linked} of {n_gpu} GPU ops have a launching runtime call in "
                          "the trace; steps are assigned by time instead")  # fmt: skip
    steps, step_col, meta.main_lane = resolve_steps(
        cols.start_ns, cols.end_ns, kind, cols.lane, cols.name, cols.names, cols.lanes,
        meta.main_lane, patterns, path, range_label=range_label, no_ranges_hint=no_ranges_hint,
    )  # fmt: skip
    return RankTimeline.from_columns(
        rank, start_ns=cols.start_ns, end_ns=cols.end_ns, kind=kind, lane=cols.lane,
        name=cols.name, lanes=cols.lanes, names=cols.names, step=step_col,
        launch_ns=cols.launch_ns, nbytes=cols.nbytes, coll_id=cols.coll_id,
        coll_name=cols.coll_name, meta=meta, steps=steps,
    )  # fmt: skip


def resolve_steps(
    start: I64,
    end: I64,
    kind: npt.NDArray[np.integer],
    lane: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    lanes: Sequence[str],
    main: int,
    patterns: NamePatterns,
    path: Path | str,
    *,
    range_label: str = "range",
    no_ranges_hint: str = "",
) -> tuple[HostSteps, npt.NDArray[np.int32], int]:
    """The host steps of a rank, the step column and the training thread.

    The step column holds the numbers on the step ranges, else -1; the training thread is
    the lane of the step ranges when they decide it.
    """
    step_col = np.full(len(start), -1, np.int32)
    steps = np.flatnonzero(kind == Kind.STEP)
    if steps.size:
        steps = _marker_steps(steps, start, end, lane, lanes, main, patterns, path)
        numbers = _step_numbers(steps, name, names, patterns, path)
        _, first_of = unique_index(numbers)  # drop repeated numbers
        keep = np.sort(first_of)
        steps, numbers = steps[keep], numbers[keep]
        step_col[steps] = numbers
        source = "marker" if patterns.explicit_step else "ProfilerStep"
        hs = HostSteps(start[steps], end[steps], numbers, source)
        return hs, step_col, int(lane[steps[0]])
    if patterns.explicit_step:
        _no_match(kind, name, names, patterns, path)
    user = find_user_steps(start, end, kind, lane, name, names, lanes, range_label,
                           rules=patterns.rules)  # fmt: skip
    if user is not None:
        idx, numbers, note, family = user
        step_col[idx] = numbers
        hs = HostSteps(start[idx], end[idx], numbers, "user_range", [note], family)
        return hs, step_col, int(lane[idx[0]])

    work = kind != Kind.OS_WAIT  # waits alone do not widen the window
    lo, hi = (int(start[work].min()), int(end[work].max())) if work.any() else (0, 0)
    opt_names = [i for i, s in enumerate(names) if s.startswith(OPTIMIZER_STEP)]
    opt = np.flatnonzero(np.isin(name, opt_names) & np.isin(kind, _OPT_KINDS))
    if main >= 0:
        opt = opt[lane[opt] == main]
    if opt.size >= 2:
        ends = np.sort(end[opt])
        host_s = np.concatenate(([lo], ends[:-1]))
        note = (f"no step markers or iteration ranges: {opt.size} steps inferred from the "
                "ends of Optimizer.step ranges")  # fmt: skip
        hs = HostSteps(host_s, ends, np.arange(opt.size, dtype=np.int64), "optimizer", [note])
        return hs, step_col, main
    phase = find_user_steps(start, end, kind, lane, name, names, lanes, range_label, phase=True,
                            rules=patterns.rules)  # fmt: skip
    if phase is not None:
        idx, numbers, note, family = phase
        step_col[idx] = numbers
        hs = HostSteps(start[idx], end[idx], numbers, "user_range", [note], family)
        return hs, step_col, int(lane[idx[0]])
    ranges = kind == Kind.ANNOTATION
    if ranges.any():
        often = frequent_ranges(names, name[ranges])
        note = ("no step markers (ProfilerStep#N, gpudiag.step#N), iteration ranges or "
                "Optimizer.step: the whole trace is one window (most frequent ranges: "
                f"{often}; pick one with --step-marker REGEX)")  # fmt: skip
    else:
        hint = f" ({no_ranges_hint})" if no_ranges_hint else ""
        note = ("no step markers (ProfilerStep#N, gpudiag.step#N), iteration ranges or "
                f"Optimizer.step: the whole trace is one window{hint}")  # fmt: skip
    one = np.zeros(1, np.int64)
    return HostSteps(one + lo, one + hi, one * 0, "whole", [note]), step_col, main


def _marker_steps(
    steps: npt.NDArray[np.intp],
    start: I64,
    end: I64,
    lane: npt.NDArray[np.integer],
    lanes: Sequence[str],
    main: int,
    patterns: NamePatterns,
    path: Path | str,
) -> npt.NDArray[np.intp]:
    """Step-marker ranges on one thread, in start order.

    An explicit marker that matches ranges on several threads, or ranges that overlap each
    other, is an error.
    """
    threads = sorted({lanes[int(x)] for x in unique(lane[steps]).tolist()})
    if patterns.explicit_step and len(threads) > 1:
        raise InputError(
            path,
            f"step marker '{patterns.step_re}' matches ranges on {len(threads)} threads "
            f"({', '.join(t.removeprefix('cpu:') for t in threads[:4])})",
            "make the pattern match only the training loop's own range",
        )
    if main >= 0 and np.any(lane[steps] == main):
        steps = steps[lane[steps] == main]
    else:
        steps = steps[lane[steps] == np.bincount(lane[steps]).argmax()]
    steps = steps[np.argsort(start[steps], kind="stable")]
    if patterns.explicit_step and np.any(start[steps][1:] < end[steps][:-1]):
        raise InputError(
            path,
            f"step marker '{patterns.step_re}' matches ranges that overlap each other",
            "a step range must close before the next one opens: match the outermost "
            "per-iteration range only",
        )
    return steps


def _no_match(
    kind: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    patterns: NamePatterns,
    path: Path | str,
) -> None:
    """The error for an explicit step marker that matches no range."""
    annotations = (kind == Kind.ANNOTATION) | (kind == Kind.CPU_OP)
    hint = frequent_ranges(names, name[kind == Kind.ANNOTATION]) or frequent_ranges(
        names, name[annotations]
    )
    raise InputError(
        path,
        f"step marker '{patterns.step_re}' matches no range"
        + ("" if annotations.any() else " (the trace has no host ranges)"),
        f"most frequent ranges: {hint}; pass a regex that matches one of them (group 1 = "
        "the step number)" if hint else "mark steps with torch.profiler's schedule "
        "(ProfilerStep#N), torch.cuda.nvtx.range or `gpudiag run`",
    )  # fmt: skip


def _step_numbers(
    steps: npt.NDArray[np.intp],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    patterns: NamePatterns,
    path: Path | str,
) -> npt.NDArray[np.int64]:
    """Step numbers from the ranges' names (their order where a name has none)."""
    nums = []
    for i, j in enumerate(steps.tolist()):
        n = patterns.step_number(names[int(name[j])])
        nums.append(i if n is None else n)
    big = [n for n in nums if n > STEP_MAX]
    if big:
        raise InputError(
            path,
            f"step number {big[0]} is out of range (steps are numbered up to {STEP_MAX})",
            "the step ranges' names are damaged, or --step-marker's group 1 is not a step count",
        )
    return np.asarray(nums, np.int64)


def _family(name: str) -> str:
    """A range name with its numbers folded: ``step 12`` → ``step N``."""
    return _DIGITS.sub("N", name)


def _anchor_lanes(
    lanes: Sequence[str], lane: npt.NDArray[np.integer], kind: npt.NDArray[np.integer]
) -> tuple[list[int], npt.NDArray[np.bool_], str]:
    """Host threads with annotation ranges, most GPU launches (else operators) first.

    Returns the lanes, a mask of every launch (operator) and what to call them.
    """
    host = np.array([ln.startswith("cpu:") for ln in lanes], bool)[lane] if len(lane) else lane
    ranged = set(unique(lane[host & (kind == Kind.ANNOTATION)]).tolist())
    for k, what in ((Kind.RUNTIME, "launches"), (Kind.CPU_OP, "operators")):
        mask = host & (kind == k)
        if mask.any():
            counts = np.bincount(lane[mask], minlength=len(lanes))
            order = [
                int(x) for x in np.argsort(-counts, kind="stable") if counts[x] and x in ranged
            ]
            return order, mask, what
    return [], np.zeros(len(lane), bool), ""


def find_user_steps(
    start: I64,
    end: I64,
    kind: npt.NDArray[np.integer],
    lane: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    lanes: Sequence[str],
    range_label: str = "range",
    phase: bool = False,
    rules: LoaderRules = DEFAULT_RULES,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], str, str] | None:
    """The user's own iteration range (``step N``, ``iteration N``, ``Batch N``, ``train_step``).

    With ``phase``: a one-off user range instead (fewer than ``rules.user_step_min_ranges``
    ranges: a ``Jacobi solve``), or a range named as a phase however often it recurs
    (``Epoch 2``, ``test``), holding the same share of the launches, found only when no
    iteration range is: each of its ranges becomes one analysed window, so that setup and
    teardown outside it do not drive the verdict.

    Candidates are the annotation ranges (NVTX push/pop and start/end ranges of any domain,
    ``record_function``) of one thread, grouped by name with numbers folded, less the
    ranges of libraries (:data:`LIBRARY_RANGE`) and of phases (:data:`PHASE_RANGE`:
    epochs, train/eval). A family qualifies when it recurs (at least
    ``rules.user_step_min_ranges`` ranges), never overlaps itself, and its ranges hold at
    least ``rules.user_step_coverage_ratio`` of the thread's GPU launches (on CPU traces, its
    operators) made outside data-loading ranges. Threads are tried in order of launches
    (operators), among those with ranges: the first with a qualifying family is the
    training thread (a data-decoding thread may launch more, but has no iteration
    ranges). Of the qualifying families the
    outermost is chosen — one whose ranges mostly (≥ 90%) lie inside another qualifying
    family's ranges is not — then the one with more ranges, a name hint (step, iter,
    batch, train), the larger coverage.

    Returns (interval indices in start order, step numbers, the note saying so, the family
    name), or None.
    """
    anchors, events, what = _anchor_lanes(lanes, lane, kind)
    for anchor in anchors:
        found = _user_step_families(start, end, kind, lane, name, names, anchor, events, phase,
                                    rules)  # fmt: skip
        if phase:
            found = _bounding(found, start, end, lane, anchor, kind, rules.phase_max_share)
        if found:
            idx, numbers, note, fam = _choose(found, start, end, name, names, range_label, what)
            if phase:
                cov = max(f[2] for f in found if f[0] == fam)
                note = (f"the analysed phase is {range_label} '{fam}' ({idx.size} "
                        f"{'range' if idx.size == 1 else 'ranges'}, {cov:.0%} of the thread's "
                        f"{what} inside; each is one window): setup and teardown outside it "
                        "are left out")  # fmt: skip
            return idx, numbers, note, fam
    return None


def _bounding(
    found: list[tuple[str, npt.NDArray[np.intp], float]],
    start: I64,
    end: I64,
    lane: npt.NDArray[np.integer],
    anchor: int,
    kind: npt.NDArray[np.integer],
    max_share: float,
) -> list[tuple[str, npt.NDArray[np.intp], float]]:
    """Phase families that leave part of the thread's time outside (else they bound nothing)."""
    mine = (lane == anchor) & (kind != Kind.OS_WAIT)
    if not mine.any():
        return []
    span = int(end[mine].max() - start[mine].min())
    return [f for f in found
            if int((end[f[1]] - start[f[1]]).sum()) <= max_share * span]  # fmt: skip


def _user_step_families(
    start: I64,
    end: I64,
    kind: npt.NDArray[np.integer],
    lane: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    anchor: int,
    events: npt.NDArray[np.bool_],
    phase: bool = False,
    rules: LoaderRules = DEFAULT_RULES,
) -> list[tuple[str, npt.NDArray[np.intp], float]]:
    """The qualifying range families of one thread: (name, ranges in order, coverage)."""
    cand = np.flatnonzero((kind == Kind.ANNOTATION) & (lane == anchor))
    ev = np.sort(start[events & (lane == anchor)])
    # the iteration's own work: not what the thread does inside data loading (a loader
    # without workers runs its indexing and collation on this thread)
    loading = np.flatnonzero((kind == Kind.DATALOADER) & (lane == anchor))
    if loading.size:
        ls, le = start[loading], end[loading]
        order = np.argsort(ls)
        ls, reach = ls[order], np.maximum.accumulate(le[order])
        k = np.searchsorted(ls, ev, side="right") - 1
        ev = ev[~((k >= 0) & (ev < reach[np.maximum(k, 0)]))]
    families: dict[str, list[int]] = {}
    for i in unique(name[cand]).tolist():
        n = names[i]
        if LIBRARY_RANGE.search(n) or (PHASE_RANGE.search(n) and not phase):
            continue
        families.setdefault(_family(n), []).append(i)
    found = []
    for fam, ids in families.items():
        idx = cand[np.isin(name[cand], ids)]
        recurs = idx.size >= rules.user_step_min_ranges
        if recurs == phase and not (phase and PHASE_RANGE.search(fam)):
            continue  # an iteration recurs; a phase is one-off or named as one
        idx = idx[np.argsort(start[idx], kind="stable")]
        s, e = start[idx], end[idx]
        if np.any(s[1:] < e[:-1]):
            continue  # overlaps itself: not one iteration after another
        inside = np.searchsorted(s, ev, side="right") - 1
        covered = (inside >= 0) & (ev < e[np.maximum(inside, 0)])
        coverage = float(np.count_nonzero(covered) / ev.size) if ev.size else 0.0
        if coverage >= rules.user_step_coverage_ratio:
            found.append((fam, idx, coverage))
    return found


def _choose(
    found: list[tuple[str, npt.NDArray[np.intp], float]],
    start: I64,
    end: I64,
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    range_label: str,
    what: str,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], str, str]:
    """The outermost qualifying family, then the most ranges, a name hint, coverage."""
    outer = [f for f in found if not any(g is not f and _nested(f[1], g[1], start, end)
                                         for g in found)]  # fmt: skip
    fam, idx, coverage = max(
        outer or found,
        key=lambda f: (len(f[1]), bool(STEP_NAME_HINT.search(f[0])), f[2], f[0]),
    )
    note = (f"steps from {range_label} '{fam}' ({idx.size} ranges, {coverage:.0%} of the "
            f"thread's {what} inside)")  # fmt: skip
    return idx, _user_numbers(idx, name, names), note, fam


def _nested(inner: npt.NDArray[np.intp], outer: npt.NDArray[np.intp], start: I64, end: I64) -> bool:
    """At least 90% of ``inner``'s ranges lie within one of ``outer``'s ranges."""
    s, e = start[outer], end[outer]
    k = np.searchsorted(s, start[inner], side="right") - 1
    within = (k >= 0) & (end[inner] <= e[np.maximum(k, 0)]) & (start[inner] < e[np.maximum(k, 0)])
    return bool(np.count_nonzero(within) >= 0.9 * inner.size)


def _user_numbers(
    idx: npt.NDArray[np.intp], name: npt.NDArray[np.integer], names: Sequence[str]
) -> npt.NDArray[np.int64]:
    """The number in each range's name when they count up, else 0, 1, 2 … in order."""
    nums = []
    for j in idx.tolist():
        found = _DIGITS.findall(names[int(name[j])])
        nums.append(int(found[-1]) if found else -1)
    arr = np.asarray(nums, np.int64)
    if arr.min() >= 0 and arr.max() <= STEP_MAX and np.all(np.diff(arr) > 0):
        return arr
    return np.arange(idx.size, dtype=np.int64)
