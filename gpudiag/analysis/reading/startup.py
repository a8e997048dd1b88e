"""The one-off work at a trace's edges: start-up (by kind) and teardown, found by mechanism.

Start-up items (docs/definitions.md, "Reading"), each a host interval of the rank:

* **calls**: runtime calls before the first kernel that last ``reading.startup_call_min_ns``
  and that no later call of their name repeats (none lasts ``reading.startup_repeat_ratio``
  of it): context creation, first allocations, lazy module loading in the first launch;
* **compilation**: runtime calls of the JIT class (NVRTC/hipRTC, module loading and
  linking) and host ranges that say they compile;
* **autotuning**: innermost operators that try several algorithms: at least
  ``reading.autotune_min_trials`` kernels of at least two names launched inside, and as
  many synchronisations (each trial timed);
* **first calls**: the first call of a name (runtime call, operator or range) that lasts
  ``startup_call_min_ns`` while at least two later calls each last under
  ``startup_repeat_ratio`` of it (lazy set-up inside a first call).

Compilation, autotuning and first calls count only before the steady pattern: in the first
of several steps, anywhere in a one-window trace (there, only the part before the first
kernel is cut; the rest is reported and decides whether start-up dominates). A kind other
than calls counts when its items hold ``startup_call_min_ns`` in all.

Teardown: runtime calls after the last GPU work that last ``startup_call_min_ns`` and that
no earlier call of their name repeats (destroying the context, freeing the pools).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpudiag._support import lazyre, nputil
from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.rank.hostcause import API_CLASSES
from gpudiag.config import ReadingRules
from gpudiag.traces.schema import Kind, RankTimeline

# A host range that says it compiles (``compileFusion``, ``torch.compile``, ``NVRTC``)
COMPILE_RANGE = lazyre.compile(r"(?i)compil|^(nvrtc|hiprtc)")
_BLOCKING = lazyre.compile("|".join(API_CLASSES[c].pattern for c in ("sync", "copy")))
_MIN = int(np.iinfo(np.int64).min)
_MAX = int(np.iinfo(np.int64).max)
Items = dict[str, npt.NDArray[np.intp]]  # kind → interval indices


def startup_items(
    tl: RankTimeline, gpu: npt.NDArray[np.bool_], first_step_end: int | None, rules: ReadingRules
) -> tuple[Items, int]:
    """The start-up items by kind, and where the cut ends (the items before the steady work).

    ``first_step_end``: the end of the first of several steps (None: one window).
    """
    kernels = gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM])
    first = int(tl.start_ns[kernels].min()) if kernels.any() else _MAX
    host = ~gpu & np.isin(tl.kind, [Kind.RUNTIME, Kind.CPU_OP, Kind.ANNOTATION])
    dur = tl.end_ns - tl.start_ns
    items: Items = {}
    calls = _one_off(tl, ~gpu & (tl.kind == Kind.RUNTIME), tl.start_ns < first, rules, dur)
    if calls.size:
        items["calls"] = calls
    early = tl.start_ns < (first_step_end if first_step_end is not None else _MAX)
    for kind, idx in (
        ("compilation", _compiling(tl, host & early)),
        ("autotuning", _autotuning(tl, gpu, host & early & (tl.kind == Kind.CPU_OP), rules)),
        ("first calls", _first_calls(tl, gpu, host & early, rules, dur)),
    ):
        # those no earlier kind took (np.setdiff1d, without its import of numpy.ma)
        taken = np.zeros(len(tl), bool)
        for v in items.values():
            taken[v] = True
        idx = nputil.unique(idx)
        idx = idx[~taken[idx]]
        if idx.size and iv.total(iv.union(tl.start_ns[idx], tl.end_ns[idx])) >= (
            rules.startup_call_min_ns
        ):
            items[kind] = idx
    every = np.concatenate(list(items.values())) if items else np.zeros(0, np.intp)
    cut = every[tl.start_ns[every] < first] if first_step_end is None else every
    return items, int(tl.end_ns[cut].max()) if cut.size else _MIN


def teardown_items(
    tl: RankTimeline, gpu: npt.NDArray[np.bool_], rules: ReadingRules
) -> npt.NDArray[np.intp]:
    """Runtime calls after the last GPU work, one-off (no earlier call of their name repeats)."""
    busy = gpu & (tl.kind != Kind.OS_WAIT)
    if not busy.any():
        return np.zeros(0, np.intp)
    last = int(tl.end_ns[busy].max())
    calls = ~gpu & (tl.kind == Kind.RUNTIME)
    dur = tl.end_ns - tl.start_ns
    cand = np.flatnonzero(calls & (tl.start_ns >= last) & (dur >= rules.startup_call_min_ns))
    before = np.flatnonzero(calls & (tl.start_ns < last))
    return np.asarray(
        [i for i in cand.tolist() if _longest(tl, before, i) < rules.startup_repeat_ratio * dur[i]],
        np.intp,
    )


def by_name(tl: RankTimeline, idx: npt.NDArray[np.intp], top: int = 4) -> dict[str, int]:
    """The items' time by name (the union of each name's intervals), the longest ``top``."""
    out: dict[str, int] = {}
    for nid in np.unique(tl.name[idx]).tolist():
        mine = idx[tl.name[idx] == nid]
        out[tl.names[nid]] = iv.total(iv.union(tl.start_ns[mine], tl.end_ns[mine]))
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])


def kinds_ns(tl: RankTimeline, items: Items) -> dict[str, int]:
    """Each kind's time (the union of its items)."""
    return {k: iv.total(iv.union(tl.start_ns[i], tl.end_ns[i])) for k, i in items.items()}


def _longest(tl: RankTimeline, among: npt.NDArray[np.intp], i: int) -> int:
    same = among[tl.name[among] == tl.name[i]]
    return int((tl.end_ns[same] - tl.start_ns[same]).max(initial=0))


def _one_off(
    tl: RankTimeline,
    calls: npt.NDArray[np.bool_],
    before: npt.NDArray[np.bool_],
    rules: ReadingRules,
    dur: npt.NDArray[np.int64],
) -> npt.NDArray[np.intp]:
    """Calls ``before`` that last the minimum and that no later call of their name repeats."""
    cand = np.flatnonzero(calls & before & (dur >= rules.startup_call_min_ns))
    later = np.flatnonzero(calls & ~before)
    keep = [
        i for i in cand.tolist() if _longest(tl, later, i) < rules.startup_repeat_ratio * dur[i]
    ]
    return np.asarray(keep, np.intp)


def _compiling(tl: RankTimeline, host: npt.NDArray[np.bool_]) -> npt.NDArray[np.intp]:
    """JIT-class runtime calls and host ranges that say they compile."""
    jit = API_CLASSES["jit"]
    names = np.fromiter(
        (
            bool(jit.search(n)) or bool(COMPILE_RANGE.search(n))
            for n in (tl.names[i] for i in range(len(tl.names)))
        ),
        bool,
        len(tl.names),
    )
    ok = host & names[tl.name] & np.isin(tl.kind, [Kind.RUNTIME, Kind.ANNOTATION])
    return np.flatnonzero(ok)


def _autotuning(
    tl: RankTimeline, gpu: npt.NDArray[np.bool_], ops: npt.NDArray[np.bool_], rules: ReadingRules
) -> npt.NDArray[np.intp]:
    """Innermost operators inside which several kernels are launched and timed one by one."""
    sync_names = np.fromiter(
        (bool(API_CLASSES["sync"].search(n)) for n in tl.names), bool, len(tl.names)
    )
    syncs = np.flatnonzero(~gpu & (tl.kind == Kind.RUNTIME) & sync_names[tl.name])
    kern = np.flatnonzero(gpu & (tl.kind == Kind.COMPUTE) & (tl.launch_ns >= 0))
    if syncs.size < rules.autotune_min_trials or kern.size < rules.autotune_min_trials:
        return np.zeros(0, np.intp)
    s_sync = np.sort(tl.start_ns[syncs])
    order = np.argsort(tl.launch_ns[kern])
    k_at, k_name = tl.launch_ns[kern][order], tl.name[kern][order]
    # every operator at once: the syncs and kernel launches inside it (one searchsorted
    # each), then the few with enough of both checked for two kernel names
    cand = np.flatnonzero(ops)
    a, b = tl.start_ns[cand], tl.end_ns[cand]
    n_sync = np.searchsorted(s_sync, b) - np.searchsorted(s_sync, a)
    lo, hi = np.searchsorted(k_at, a), np.searchsorted(k_at, b)
    enough = (n_sync >= rules.autotune_min_trials) & (hi - lo >= rules.autotune_min_trials)
    hits = [
        i
        for i, x, y in zip(
            cand[enough].tolist(), lo[enough].tolist(), hi[enough].tolist(), strict=True
        )
        if np.unique(k_name[x:y]).size >= 2
    ]
    idx = np.asarray(hits, np.intp)
    inner = [
        i
        for i in hits
        if not np.any(
            (idx != i)
            & (tl.start_ns[idx] >= tl.start_ns[i])
            & (tl.end_ns[idx] <= tl.end_ns[i])
            & (tl.lane[idx] == tl.lane[i])
        )
    ]
    return np.asarray(inner, np.intp)


def _first_calls(
    tl: RankTimeline,
    gpu: npt.NDArray[np.bool_],
    host: npt.NDArray[np.bool_],
    rules: ReadingRules,
    dur: npt.NDArray[np.int64],
) -> npt.NDArray[np.intp]:
    """First calls of a name far longer than each of (at least two) later calls of it.

    ``host``: the candidate items (runtime calls, operators, ranges) of the steady pattern's
    start; their later calls are looked for on their own thread, anywhere in the trace. A
    call during which the GPU works half the time or more is the GPU's time (a slow first
    iteration: warm-up), not the host's one-off set-up.
    """
    work = gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET])
    busy = iv.union(tl.start_ns[work], tl.end_ns[work])
    kinds = np.isin(tl.kind, [Kind.RUNTIME, Kind.CPU_OP, Kind.ANNOTATION])
    # a blocking call lasts as long as the GPU work it waits for: its length is not its own
    waits = np.fromiter((bool(_BLOCKING.search(n)) for n in tl.names), bool, len(tl.names))[
        tl.name
    ] & (tl.kind == Kind.RUNTIME)
    out = []
    for i in np.flatnonzero(host & ~waits & (dur >= rules.startup_call_min_ns)).tolist():
        same = np.flatnonzero(kinds & (tl.name == tl.name[i]) & (tl.lane == tl.lane[i]))
        if tl.start_ns[same].min() < tl.start_ns[i]:
            continue  # not the first call of its name
        later = same[tl.start_ns[same] > tl.start_ns[i]]
        if later.size < 2 or dur[later].max() >= rules.startup_repeat_ratio * dur[i]:
            continue
        if 2 * int(iv.measure(busy, [tl.start_ns[i]], [tl.end_ns[i]])[0]) < dur[i]:
            out.append(i)
    idx = np.asarray(out, np.intp)
    return np.asarray([i for i in out if not _inside_another(tl, idx, i)], np.intp)


def _inside_another(tl: RankTimeline, idx: npt.NDArray[np.intp], i: int) -> bool:
    """Interval ``i`` lies inside another of ``idx`` on its thread."""
    return bool(
        np.any(
            (idx != i)
            & (tl.start_ns[idx] <= tl.start_ns[i])
            & (tl.end_ns[idx] >= tl.end_ns[i])
            & (tl.lane[idx] == tl.lane[i])
        )
    )
