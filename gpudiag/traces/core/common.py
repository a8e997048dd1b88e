"""The loader core shared by the format modules: options, name patterns, kinds, ranks, threads.

A format module (:mod:`~gpudiag.traces.kineto`, :mod:`~gpudiag.traces.nsys`) turns its
file into raw columns (:class:`RawColumns`) — times, a coarse kind per interval, lanes,
interned names, launch times — and hands them to
:func:`~gpudiag.traces.core.rank_builder.build_rank`, which applies the rules every format
shares, once:

* **kinds by name**: a kernel matching ``comm_kernel_re`` is communication; a host range
  matching ``comm_host_re`` is communication, ``data_re`` data loading, the step pattern a
  step (:class:`NamePatterns`, :func:`refine_kinds`);
* **the training thread** (:func:`main_lane`): the host lane with the step ranges, else
  with the ``Optimizer.step`` ranges, else the process's main thread (tid = pid), else
  the busiest host lane;
* **steps** (:func:`~gpudiag.traces.core.step_ranges.resolve_steps`): numbered step ranges on
  the training thread (``ProfilerStep#N``, ``gpudiag.step#N`` or ``--step-marker``), else
  the user's own iteration range found among the NVTX / ``record_function`` ranges
  (:func:`~gpudiag.traces.core.step_ranges.find_user_steps`), else periods ending where
  ``Optimizer.step`` ranges end, else one window over the trace; an explicit
  ``--step-marker`` that matches nothing, matches ranges on several threads or ranges that
  overlap themselves is an error naming the problem;
* **GPU/CPU clocks** (:func:`~gpudiag.traces.core.rank_builder.check_clocks`) and **coverage
  notes**: GPU work without a launching runtime call, and where steps came from.

This module holds the shared vocabulary (the limits every loader checks, the options, the
patterns, rank numbers, the training thread); :mod:`~gpudiag.traces.core.step_ranges` finds the
steps and :mod:`~gpudiag.traces.core.rank_builder` builds the rank.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import lazyre
from gpudiag._support.records import dataclass
from gpudiag.config import (
    AUTO_STEP_RE,
    DEFAULT_COMM_HOST_RE,
    DEFAULT_COMM_KERNEL_RE,
    DEFAULT_DATA_RE,
    LoaderRules,
    Thresholds,
)
from gpudiag.errors import InputError
from gpudiag.traces.schema import I64, Kind

OPTIMIZER_STEP = "Optimizer.step#"
# Optimizer.step ranges are user annotations since PyTorch 1.10; older (2021) traces file
# them as operators ("Operator"/"cpu_op").
OPT_KINDS = (Kind.ANNOTATION, Kind.CPU_OP)
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
        self.rx = [
            re.compile(p)
            for p in (opts.comm_kernel_re, opts.comm_host_re, opts.data_re, self.step_re)
        ]

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
        np.isin(name, opt_names) & np.isin(kind, OPT_KINDS),
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
    coll_dtype: npt.NDArray[np.int64] | None = None
    shape: npt.NDArray[np.int64] | None = None  # index into shapes, -1: none (RankTimeline)
    shapes: list[str] | None = None
    # per name: a Python function's (Kineto python_function): its ranges are only candidate
    # iteration ranges (resolve_steps), dropped from the timeline unless chosen as steps
    python_names: npt.NDArray[np.bool_] | None = None
