"""Iterations from a repeating sequence of kernel names, when a trace marks none (issue 29)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpudiag.config import LoaderRules
from gpudiag.traces.schema import I64, HostSteps, Kind, gpu_lanes

_KERNELS = [int(Kind.COMPUTE), int(Kind.COMM)]
_NAME_MAX = 60  # a kernel's name quoted in the note, cut to this length


def kernel_steps(
    start: I64,
    end: I64,
    kind: npt.NDArray[np.integer],
    lane: npt.NDArray[np.integer],
    name: npt.NDArray[np.integer],
    names: Sequence[str],
    lanes: Sequence[str],
    launch_ns: I64,
    rules: LoaderRules,
) -> HostSteps | str:
    """Iterations where the kernels, in launch order, repeat one sequence of names.

    The smallest period ``p`` (at most ``rules.kernel_period_max`` kernels) whose longest
    exactly repeating run holds at least ``rules.user_step_min_ranges`` repeats and
    ``rules.user_step_coverage_ratio`` of the kernels' GPU time. The run is cut where the
    host waits longest between launches within a period (a loop's boundary: it fetches
    the next input there); each iteration's host range starts just after the previous
    iteration's last launch. Returns the steps, else why there are none ("" without kernels
    to repeat).
    """
    gpu = gpu_lanes(lanes)
    k = np.flatnonzero(gpu[lane] & np.isin(kind, _KERNELS)) if len(lane) else np.zeros(0, np.intp)
    reps_min = rules.user_step_min_ranges
    if k.size < reps_min:
        return ""
    key = np.where(launch_ns[k] >= 0, launch_ns[k], start[k])
    order = np.lexsort((start[k], key))
    k, key = k[order], key[order]
    seq = name[k].astype(np.int64)
    cum = np.concatenate(([0], np.cumsum(end[k] - start[k])))
    total = int(cum[-1])
    gaps = np.diff(key, prepend=key[0])
    found = None
    for p in range(1, min(k.size // reps_min, rules.kernel_period_max) + 1):
        eq = seq[:-p] == seq[p:]
        if np.count_nonzero(eq) < (reps_min - 1) * p:
            continue
        a, length = _longest_run(eq)
        reps = (length + p) // p
        held = cum[a + reps * p] - cum[a]
        if reps >= reps_min and held >= rules.user_step_coverage_ratio * total:
            cut = _boundary(
                gaps[a : a + reps * p].reshape(reps, p), rules.kernel_period_pause_factor
            )
            if cut is not None and (length - cut[0]) // p + 1 >= reps_min:
                found = (p, a, (length - cut[0]) // p + 1, cut)
                break
    if found is None:
        return (
            f"no sequence of kernels repeats {reps_min} times over "
            f"{rules.user_step_coverage_ratio:.0%} of the GPU time with a pause in launching "
            "between repeats"
        )
    p, a, count, (r, pause) = found
    cuts = a + r + p * np.arange(count)
    host_s = key[cuts].copy()
    host_s[1:] = key[cuts[1:] - 1] + 1
    if cuts[0] > 0:  # the first begins a typical loop gap before its launch, after the last one
        host_s[0] = max(int(key[cuts[0] - 1]) + 1, int(key[cuts[0]]) - pause)
    last = int(cuts[-1]) + p - 1
    host_e = np.append(host_s[1:], key[last] + 1)
    share = (cum[last + 1] - cum[cuts[0]]) / max(total, 1)
    first = names[int(seq[cuts[0]])]
    first = first if len(first) <= _NAME_MAX else first[: _NAME_MAX - 1] + "…"
    note = (
        f"no step markers or iteration ranges: {cuts.size} iterations from a repeating "
        f"sequence of {p} kernels (from '{first}'; {share:.0%} of the GPU time)"
    )
    return HostSteps(host_s, host_e, np.arange(cuts.size, dtype=np.int64), "kernels", [note])


def _boundary(gap: npt.NDArray[np.int64], ratio: float) -> tuple[int, int] | None:
    """Where a period's repeats meet, and the launch gap there (None: they do not pause).

    The offset whose launch gap, the median over the repeats, is the longest and at least
    ``ratio`` times the median gap.

    ``gap``: per repeat (row) and kernel (column), the wait since the previous launch. Parts
    of one iteration (a model's layers) are launched back to back; a loop pauses between
    iterations to fetch the next input.
    """
    per = np.median(gap[1:], axis=0)
    r = int(np.argmax(per))
    if per[r] < ratio * max(float(np.median(gap[1:])), 1.0):
        return None
    return r, int(per[r])


def _longest_run(eq: npt.NDArray[np.bool_]) -> tuple[int, int]:
    """Start and length of the longest run of True in ``eq``."""
    d = np.diff(np.concatenate(([0], eq.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    i = int(np.argmax(ends - starts))
    return int(starts[i]), int(ends[i] - starts[i])
