"""Steps from a rank's ranges, the same way for every format (:func:`resolve_steps`).

Numbered step ranges on the training thread (``ProfilerStep#N``, ``gpudiag.step#N`` or
``--step-marker``), else the user's own iteration range found among the NVTX /
``record_function`` ranges (:func:`find_user_steps`), else periods ending where
``Optimizer.step`` ranges end, else one window over the trace; an explicit
``--step-marker`` that matches nothing, matches ranges on several threads or ranges that
overlap themselves is an error naming the problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpudiag._support.nputil import unique, unique_index
from gpudiag.config import LoaderRules
from gpudiag.errors import InputError
from gpudiag.traces.core.common import (
    DEFAULT_RULES,
    LIBRARY_RANGE,
    OPT_KINDS,
    OPTIMIZER_STEP,
    PHASE_RANGE,
    STEP_MAX,
    STEP_NAME_HINT,
    NamePatterns,
    RawColumns,
    frequent_ranges,
)
from gpudiag.traces.core.kernel_period import kernel_steps
from gpudiag.traces.schema import I64, HostSteps, Kind

_DIGITS = re.compile(r"\d+")
# A Python frame's name, ``file.py(LINE): function``: its file and line are the function's
# identity, not a number to fold (another line is another function)
_PY_FRAME = re.compile(r"^\S.*\(\d+\): \S+$")


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
    python: RawColumns | None = None,
    kernel_launches: I64 | None = None,
    launch_ns: I64 | None = None,
) -> tuple[HostSteps, npt.NDArray[np.int32], int]:
    """The host steps of a rank, the step column and the training thread.

    The step column holds the numbers on the step ranges, else -1; the training thread is
    the lane of the step ranges when they decide it. ``python``: the rank's Python-function
    ranges, candidate iteration ranges after the user's own (:func:`python_steps`); the step
    column then covers them too, after the rank's rows. ``kernel_launches``: the sorted
    start times of kernel launches; ``launch_ns``: the rows' (-1: none; :func:`_by_kernels`).
    """
    refused = ""
    step_col = np.full(len(start) + (len(python.start_ns) if python else 0), -1, np.int32)
    if np.any(kind == Kind.STEP):
        return _markers(start, end, kind, lane, name, names, lanes, main, patterns, path, step_col)
    if patterns.explicit_step:
        _no_match(kind, name, names, patterns, path)
    user = find_user_steps(
        start, end, kind, lane, name, names, lanes, range_label, rules=patterns.rules
    )
    if user is not None:
        idx, numbers, note, family = user
        step_col[idx] = numbers
        hs = HostSteps(start[idx], end[idx], numbers, "user_range", [note], family)
        return hs, step_col, int(lane[idx[0]])
    if python is not None:
        launches = kernel_launches if kernel_launches is not None else np.zeros(0, np.int64)
        found = python_steps(start, end, kind, lane, names, lanes, python, patterns.rules, launches)
        if isinstance(found, str):
            refused = found + "; "
        elif found is not None:
            hs, idx, lane_of = found
            step_col[len(start) + idx] = hs.number
            return hs, step_col, lane_of
    work = kind != Kind.OS_WAIT  # waits alone do not widen the window
    lo, hi = (int(start[work].min()), int(end[work].max())) if work.any() else (0, 0)
    opt_names = [i for i, s in enumerate(names) if s.startswith(OPTIMIZER_STEP)]
    opt = np.flatnonzero(np.isin(name, opt_names) & np.isin(kind, OPT_KINDS))
    if main >= 0:
        opt = opt[lane[opt] == main]
    if opt.size >= 2:
        ends = np.sort(end[opt])
        host_s = np.concatenate(([lo], ends[:-1]))
        note = (
            f"no step markers or iteration ranges: {opt.size} steps inferred from the "
            "ends of Optimizer.step ranges"
        )
        hs = HostSteps(host_s, ends, np.arange(opt.size, dtype=np.int64), "optimizer", [note])
        return hs, step_col, main
    phase = find_user_steps(
        start, end, kind, lane, name, names, lanes, range_label, phase=True, rules=patterns.rules
    )
    if phase is not None:
        idx, numbers, note, family = phase
        step_col[idx] = numbers
        hs = HostSteps(start[idx], end[idx], numbers, "user_range", [note], family)
        return hs, step_col, int(lane[idx[0]])
    if launch_ns is not None and not refused:  # Python said its repeats are parts of one
        k = _by_kernels(start, end, kind, lane, name, names, lanes, launch_ns, patterns)
        if isinstance(k, HostSteps):
            return _hinted(k, refused, no_ranges_hint), step_col, main
        refused += k
    note = _whole_note(kind, name, names, no_ranges_hint)
    one = np.zeros(1, np.int64)
    return HostSteps(one + lo, one + hi, one * 0, "whole", [refused + note]), step_col, main


def _by_kernels(
    start: I64,
    end: I64,
    kind: npt.NDArray[np.integer],
    lane: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    lanes: Sequence[str],
    launch_ns: I64,
    patterns: NamePatterns,
) -> HostSteps | str:
    """Iterations from a repeating kernel sequence, tried last, else why not ("; " ended).

    See :mod:`~gpudiag.traces.core.kernel_period`; not tried when a repeating Python
    function was refused as parts of one iteration.
    """
    k = kernel_steps(start, end, kind, lane, name, names, lanes, launch_ns, patterns.rules)
    return k if isinstance(k, HostSteps) or not k else k + "; "


def _hinted(hs: HostSteps, refused: str, hint: str) -> HostSteps:
    """Steps found from the kernels, their note with what was refused and the format's hint."""
    hs.notes[0] = refused + hs.notes[0] + (f" ({hint})" if hint else "")
    return hs


def _markers(
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
    step_col: npt.NDArray[np.int32],
) -> tuple[HostSteps, npt.NDArray[np.int32], int]:
    """Steps from the step-marker ranges (numbered, on one thread, repeated numbers dropped)."""
    steps = _marker_steps(
        np.flatnonzero(kind == Kind.STEP), start, end, lane, lanes, main, patterns, path
    )
    numbers = _step_numbers(steps, name, names, patterns, path)
    keep = np.sort(unique_index(numbers)[1])  # drop repeated numbers
    steps, numbers = steps[keep], numbers[keep]
    step_col[steps] = numbers
    source = "marker" if patterns.explicit_step else "ProfilerStep"
    hs = HostSteps(start[steps], end[steps], numbers, source)
    return hs, step_col, int(lane[steps[0]])


def _whole_note(
    kind: npt.NDArray[np.integer], name: npt.NDArray[np.integer], names: Sequence[str], hint: str
) -> str:
    """Why the trace is one window, with the most frequent ranges to pick a marker from."""
    ranges = kind == Kind.ANNOTATION
    if ranges.any():
        often = frequent_ranges(names, name[ranges])
        return (
            "no step markers (ProfilerStep#N, gpudiag.step#N), iteration ranges or "
            "Optimizer.step: the whole trace is one window (most frequent ranges: "
            f"{often}; pick one with --step-marker REGEX)"
        )
    hint = f" ({hint})" if hint else ""
    return (
        "no step markers (ProfilerStep#N, gpudiag.step#N), iteration ranges or "
        f"Optimizer.step: the whole trace is one window{hint}"
    )


def python_steps(
    start: I64,
    end: I64,
    kind: npt.NDArray[np.integer],
    lane: npt.NDArray[np.integer],
    names: Sequence[str],
    lanes: Sequence[str],
    python: RawColumns,
    rules: LoaderRules,
    kernel_launches: I64,
) -> tuple[HostSteps, npt.NDArray[np.intp], int] | str | None:
    """Iterations from repeating Python-function ranges (a worker's ``execute_model``).

    The same rule as the user's ranges (:func:`find_user_steps`), on the Python-function
    ranges alone: a function called at least ``rules.user_step_min_ranges`` times on one
    thread, never inside itself, whose calls hold ``rules.user_step_coverage_ratio`` of the
    thread's launches; the outermost such function. Its calls are parts of one iteration
    (a model's layers, a forward's convolutions), not iterations, when the thread launches
    kernels between consecutive calls in ``rules.iteration_gap_launch_ratio`` of the gaps:
    between iterations a loop fetches the next input, it does not compute. Returns the
    steps, the chosen ranges (indices into ``python``) and the training thread; the reason
    when the chosen function is refused; None when none qualifies.
    """
    pairs = (python.lane << 32) | python.name
    _, inv, counts = np.unique(pairs, return_inverse=True, return_counts=True)
    often = np.flatnonzero(counts.reshape(-1)[inv.reshape(-1)] >= rules.user_step_min_ranges)
    if not often.size:
        return None
    n = len(start)
    # the rank's own ranges are no candidates here (they were tried): only its launches count
    own = np.where(np.isin(kind, [Kind.ANNOTATION, Kind.STEP]), -1, kind)
    found = find_user_steps(
        np.concatenate([start, python.start_ns[often]]),
        np.concatenate([end, python.end_ns[often]]),
        np.concatenate([own, np.full(often.size, Kind.ANNOTATION)]),
        np.concatenate([lane, python.lane[often]]),
        np.concatenate([np.zeros(n, np.int64), python.name[often]]),
        names,
        lanes,
        "Python function",
        rules=rules,
        fold=_py_family,
    )
    if found is None:
        return None
    idx, numbers, note, family = found
    mine = often[idx - n]
    anchor = int(python.lane[mine[0]])
    calls = np.sort(start[(kind == Kind.RUNTIME) & (lane == anchor)])
    launched = calls[np.isin(calls, kernel_launches)]
    s, e = python.start_ns[mine], python.end_ns[mine]
    between = np.searchsorted(launched, s[1:]) - np.searchsorted(launched, e[:-1], side="right")
    busy_gaps = int(np.count_nonzero(between > 0))
    if mine.size > 1 and busy_gaps >= rules.iteration_gap_launch_ratio * (mine.size - 1):
        return (
            f"Python function '{family}' ({mine.size} calls) is not the iteration: kernels "
            f"are launched between its calls in {busy_gaps} of {mine.size - 1} gaps (parts "
            "of one iteration)"
        )
    parent = _one_parent_call(start, end, lane, python, mine, anchor)
    if parent is not None:
        return (
            f"Python function '{family}' ({mine.size} calls) is not the iteration: its calls "
            f"all lie in one call of '{names[int(python.name[parent])]}', which starts and "
            "ends inside the trace (parts of one iteration)"
        )
    hs = HostSteps(
        python.start_ns[mine], python.end_ns[mine], numbers, "user_range", [note], family
    )
    return hs, mine, int(python.lane[mine[0]])


def _one_parent_call(
    start: I64,
    end: I64,
    lane: npt.NDArray[np.integer],
    python: RawColumns,
    mine: npt.NDArray[np.intp],
    anchor: int,
) -> int | None:
    """The innermost Python call holding all of ``mine`` when it starts and ends in the trace.

    A loop's caller was running when the capture began (its frame is cut at the trace's
    edges); a call that begins and ends inside the capture was captured once, whole.
    """
    on = python.lane == anchor
    s0, e0 = int(python.start_ns[mine].min()), int(python.end_ns[mine].max())
    holds = np.flatnonzero(on & (python.start_ns <= s0) & (python.end_ns >= e0))
    holds = holds[~np.isin(holds, mine)]
    if not holds.size:
        return None
    inner = int(holds[np.argmax(python.start_ns[holds])])
    own = lane == anchor
    first = min(int(start[own].min(initial=s0)), int(python.start_ns[on].min()))
    last = max(int(end[own].max(initial=e0)), int(python.end_ns[on].max()))
    if python.start_ns[inner] > first and python.end_ns[inner] < last:
        return inner
    return None


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
        "the step number)"
        if hint
        else "mark steps with torch.profiler's schedule "
        "(ProfilerStep#N), torch.cuda.nvtx.range or `gpudiag run`",
    )


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


def _py_family(name: str) -> str:
    """A Python function's family: a frame (``model.py(88): step``) as it is, else folded."""
    return name if _PY_FRAME.match(name) else _family(name)


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
    fold: Callable[[str], str] = _family,
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
        found = _user_step_families(
            start, end, kind, lane, name, names, anchor, events, phase, rules, fold
        )
        if phase:
            found = _bounding(found, start, end, lane, anchor, kind, rules.phase_max_share)
        if found:
            idx, numbers, note, fam = _choose(found, start, end, name, names, range_label, what)
            if phase:
                cov = max(f[2] for f in found if f[0] == fam)
                note = (
                    f"the analysed phase is {range_label} '{fam}' ({idx.size} "
                    f"{'range' if idx.size == 1 else 'ranges'}, {cov:.0%} of the thread's "
                    f"{what} inside; each is one window): setup and teardown outside it "
                    "are left out"
                )
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
    return [f for f in found if int((end[f[1]] - start[f[1]]).sum()) <= max_share * span]


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
    fold: Callable[[str], str] = _family,
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
        families.setdefault(fold(n), []).append(i)
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
    outer = [
        f for f in found if not any(g is not f and _nested(f[1], g[1], start, end) for g in found)
    ]
    fam, idx, coverage = max(
        outer or found,
        key=lambda f: (len(f[1]), bool(STEP_NAME_HINT.search(f[0])), f[2], f[0]),
    )
    note = (
        f"steps from {range_label} '{fam}' ({idx.size} ranges, {coverage:.0%} of the "
        f"thread's {what} inside)"
    )
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
