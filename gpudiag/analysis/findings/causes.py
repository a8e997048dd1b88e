"""Decides which host-side cause explains a host-bound finding, with its evidence in one line.

From the flagged ranks' evidence (analysis/hostcause.py) over their analysed steps, the
first that holds, in this order:

1. **copies** — GPU copies with nothing computing beside them hold at least
   ``advice.launch_bound_share`` (half) of the "other" time: copy-bound;
2. **synchronisation**, **allocator**, **blocking copies**, **JIT compilation** — the
   class of runtime calls (``sync``, ``allocator``, ``copy``, ``jit``) with the most time
   on the training thread, when that time is at least ``advice.host_cause_share`` (a
   quarter) of the "other" time;
3. **launch-bound** — at least ``advice.launch_min_kernels`` (20) kernels a step with a
   median duration of at most ``advice.short_kernel_ns`` (50 µs), issued on average at
   most ``advice.launch_interval_ns`` (150 µs) apart (step time ÷ kernels), or GPU-idle
   gaps shorter than ``advice.launch_gap_ns`` holding half of the "other" time: the host
   cannot issue work as fast as the GPU runs it (the case CUDA graphs exist for); kernels
   issued further apart mean the host is busy elsewhere, which the next rules name;
4. **eager operator overhead** — a host thread of the rank (the training thread or an
   autograd thread, analysis/hostcause.py) is inside an operator while the GPU computes
   nothing for at least ``advice.eager_op_share`` (half) of the "other" time, and for
   longer than no thread is inside one: the host is busy executing eager operators
   (dispatch, autograd, launches one by one), the case torch.compile, CUDA graphs and
   larger batches fit;
5. **Python overhead** — no host thread of the rank is inside an operator, with the GPU
   computing nothing, for at least ``advice.host_cause_share`` of the "other" time;
6. **unknown** — none of the above (long gaps with no call to show for them).

Each named cause carries its own time: ``ns_per_step`` and ``step_share`` (of step time),
never more than the "other" time — copies: the copies alone; a class of calls: its calls;
launches: the launch calls or the GPU-idle gaps shorter than ``advice.launch_gap_ns``,
whichever is longer; eager overhead: the time inside operators with the GPU idle; Python:
the time between operators with the GPU idle. The verdict quotes that share beside the
finding's, and a remedy's gain never exceeds it. Each cause's text names the call or
activity, its time a step and the analysed steps ("… 120.0 ms a step, steps 3–5").

Graph launches (``cudaGraphLaunch``/``hipGraphLaunch``) are reported beside the cause:
CUDA graphs are then already in use and not suggested again.

A Python cause on a trace with Python frames (``python_function``: the ranks' evidence
``python_sites``, analysis/rank/hostcause.py) names where its time goes: ``call_sites``,
the innermost frames holding it with their time and calls a step, the top three in its
text; and, when the steps launch graphs, the part before each step's first graph launch
(``before_graph_ns_per_step``), which leads the text when it holds half of the time
("Python before the first graph launch: …"). Without such frames neither is set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.analysis.model import words
from gpudiag.analysis.model.causes import (
    CALL_CLASSES,
    CallClass,
    CallSite,
    HostCause,
    HostCauseKind,
)
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    RankSummary,
    Severity,
    StepBreakdown,
)
from gpudiag.analysis.model.metrics import ExposedCopiesMetrics, HostMetrics, VariabilityMetrics
from gpudiag.config import AdviceRules, Thresholds

CAUSES: tuple[HostCauseKind, ...] = (
    "copies",
    "sync",
    "allocator",
    "copy",
    "jit",
    "launch",
    "eager",
    "python",
    "unknown",
)
LABEL: dict[HostCauseKind, str] = {
    "copies": "host-device copies with nothing computing",
    "sync": "synchronisation",
    "allocator": "the memory allocator",
    "copy": "blocking copies",
    "jit": "JIT compilation",
    "launch": "kernel launches",
    "eager": "eager operator overhead",
    "python": "Python overhead between operators",
    "unknown": "host work the trace does not show",
}
# what to capture to see host work the trace does not show (verdict and remedy say it)
CAPTURE_HINT = "capture NVTX ranges and step markers to see it"
UNSEEN_HOST_WORK = (
    "No gain is given: the trace does not show what the host does in these "
    "gaps; mark the step's phases with NVTX ranges (torch.cuda.nvtx.range, "
    "record_function) and the steps with step markers to see it."
)
# CPU traces: what to capture when the step's thread shows no operator
CPU_CAPTURE_HINT = (
    "capture the step's phases with record_function ranges (or sample the "
    "process with py-spy) to see it"
)
_WHO = {
    "compute": "its own kernels",
    "communication": "a collective (other ranks)",
    "copy": "a copy",
    "nothing": "nothing on the GPU",
}


def cause_of(f: Finding) -> HostCause | None:
    """The host cause named on a finding (:func:`host_cause`), None when none."""
    m = f.metrics
    return m.cause if isinstance(m, (HostMetrics, VariabilityMetrics)) else None


# a finding with no host cause: every figure None (never read its kind: see cause_kind)
_NO_CAUSE = HostCause()


def figures_of(f: Finding) -> HostCause:
    """The host cause named on a finding for its figures: with none, one whose figures are None.

    Its ``kind`` tells nothing then: ask :func:`cause_kind`.
    """
    return cause_of(f) or _NO_CAUSE


def cause_json(f: Finding) -> dict[str, object]:
    """The host cause named on a finding as the JSON a remedy's evidence quotes; ``{}``: none."""
    cause = cause_of(f)
    return cause.to_json() if cause is not None else {}


def cause_kind(f: Finding) -> HostCauseKind | None:
    """The kind of the host cause named on a finding, None when none."""
    cause = cause_of(f)
    return cause.kind if cause is not None else None


def gpu_busy_share(waits: Mapping[str, float]) -> float:
    """Of a blocking call's time (``waits_for``), the share with the GPU running work."""
    return float(waits.get("compute", 0.0)) + float(waits.get("communication", 0.0))


def fmt_ns(ns: float) -> str:
    """A time quoted in a cause's evidence: 1.06 s, 35.1 ms, 14 µs (``words.duration``)."""
    return words.duration(ns, "evidence")


@dataclass(frozen=True)
class _Scope:
    """The flagged ranks and their analysed steps: what every rule of host_cause reads."""

    mine: list[RankSummary]
    kept: set[tuple[int, int]]
    numbers: list[int]  # the analysed steps' numbers
    n_steps: int
    other: int
    total: int
    rules: AdviceRules


def host_cause(
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    flagged: Sequence[int],
    rules: AdviceRules,
) -> HostCause:
    """The first cause that holds (module docstring), with the graphs and the "other" time."""
    which = set(flagged)
    sc = _Scope(
        mine=[r for r in ranks if r.rank in which],
        kept={(s.rank, s.step) for s in steps},
        numbers=sorted({s.step for s in steps if s.rank in which}),
        n_steps=max(sum(1 for s in steps if s.rank in which), 1),
        other=sum(s.other_ns for s in steps if s.rank in which),
        total=sum(s.duration_ns for s in steps if s.rank in which),
        rules=rules,
    )
    graphs = sum(_api(r, "graph", sc.kept)[0] for r in sc.mine)
    found = None
    if sc.other > 0:
        order = (_copies_cause, _api_cause, _launch_cause, _op_cause)
        found = next((c for rule in order if (c := rule(sc)) is not None), None)
    return dataclasses.replace(
        found or _done("unknown", ""),
        graphs_launched=graphs > 0,
        other_ns_per_step=sc.other // sc.n_steps,
    )


def cpu_host_cause(ranks: Sequence[RankSummary], flagged: Sequence[int]) -> HostCause | None:
    """CPU traces: cause ``unknown`` when no flagged rank's step thread runs an operator.

    None when one does (its time outside operators is Python/host overhead) or when the
    trace records no such count. With no operator on the step's thread in the analysed
    steps, nothing the trace holds says where the step's time goes.
    """
    which = set(flagged)
    cov: list[Mapping[str, Any]] = [r.evidence.coverage or {} for r in ranks if r.rank in which]
    if not cov or any(c.get("step_thread_ops_in_steps", 1) for c in cov):
        return None
    host = sum(int(c.get("host_ops_in_steps", 0)) for c in cov)
    where = (
        f"{words.plural(host, 'host event')} in them, all on other threads"
        if host
        else "no host event in them"
    )
    return HostCause(
        kind="unknown",
        label=LABEL["unknown"],
        text=f"the step's thread runs no operator in the analysed steps ({where})",
        capture=CPU_CAPTURE_HINT,
        ns_per_step=0,
    )


def _copies_cause(sc: _Scope) -> HostCause | None:
    copies = sum(_series(r, r.evidence.copies_alone or {}, sc.kept)[0] for r in sc.mine)
    if copies < sc.rules.launch_bound_share * sc.other:
        return None
    mem = _memory(sc.mine, sc.rules)
    text = (
        f"GPU copies with nothing computing: {fmt_ns(copies / sc.n_steps)} a step "
        f"({words.percent(copies / sc.total)} of step time, {_steps_text(sc.numbers)}; "
        f"{mem} memory)"
    )
    cause = _done("copies", text, sc, copies)
    return dataclasses.replace(cause, share=copies / sc.other, pageable=mem == "pageable")


def _api_cause(sc: _Scope) -> HostCause | None:
    best: tuple[int, CallClass | None] = (0, None)
    for c in CALL_CLASSES:
        ns = sum(_api(r, c, sc.kept)[0] for r in sc.mine)
        if ns > best[0]:
            best = (ns, c)
    ns, cls = best
    if cls is None or ns < sc.rules.host_cause_share * sc.other:
        return None
    mine = sc.mine
    api = _top_api(mine, cls)
    in_steps = sorted({n for r in mine for n in _api(r, cls, sc.kept)[1]})
    longest = max((_entry(r, cls).get("longest_ns", 0) for r in mine), default=0)
    apis = list(dict.fromkeys(a for r in mine for a in _entry(r, cls).get("apis", [api])))
    ops = [str(_entry(r, cls).get("longest_op")) for r in mine if _entry(r, cls).get("longest_op")]
    each = ns / max(len(in_steps), 1) / max(len(mine), 1)
    where = (
        f"in each of {_steps_text(in_steps)}"
        if len(in_steps) > 1
        else f"in {_steps_text(in_steps)}"
    )
    share = min(ns / sc.other, 1.0)
    text = (
        f"{' and '.join(apis[:2])} {fmt_ns(each)} {where} ({words.percent(share)} of the "
        f"host time); longest call {fmt_ns(longest)}" + (f" in {ops[0]}" if ops else "")
    )
    calls_per_step, bytes_median = None, None
    if cls == "copy":
        calls = sum(int(_entry(r, cls).get("calls", 0)) for r in mine)
        calls_per_step = round(calls / max(len(in_steps), 1) / max(len(mine), 1))
        sizes = [int(_entry(r, cls).get("bytes_median", -1)) for r in mine]
        bytes_median = max(sizes, default=-1)
    waits = waits_for(mine, cls) if cls in ("sync", "copy") else {}
    if waits:
        who = max(waits, key=lambda k: waits[k])
        text += f"; it waits for {_WHO[who]} ({words.percent(waits[who])})"
    return dataclasses.replace(
        _done(cls, text, sc, ns),
        api=api,
        share=share,
        steps=in_steps,
        longest_ns=longest,
        calls_per_step=calls_per_step,
        bytes_median=bytes_median,
        waits_for=waits or None,
    )


def _launch_cause(sc: _Scope) -> HostCause | None:
    kps = [float(r.evidence.kernels_per_step or 0) for r in sc.mine]
    med = [int(r.evidence.kernel_ns_median or 0) for r in sc.mine]
    short_gaps = sum(
        int(g.short_gaps_ns or 0)
        for r in sc.mine
        if (g := r.evidence.gpu_idle_in_steps) is not None
    )
    top = max(kps, default=0.0)
    apart = (sc.total / sc.n_steps) / top if top else 0.0
    many_short = (
        bool(kps)
        and min(kps) >= sc.rules.launch_min_kernels
        and 0 < max(med) <= sc.rules.short_kernel_ns
        and apart <= sc.rules.launch_interval_ns
    )
    if not many_short and short_gaps < sc.rules.launch_bound_share * sc.other:
        return None
    launch = sum(_api(r, "launch", sc.kept)[0] for r in sc.mine)
    sync = sum(_api(r, "sync", sc.kept)[0] for r in sc.mine) / sc.n_steps
    held = f"synchronisation {fmt_ns(sync)} a step" if sync else "no synchronisation"
    text = (
        f"{top:.0f} kernels a step, median {fmt_ns(float(nputil.median(med)))}, issued "
        f"{fmt_ns(apart)} apart (launch calls {fmt_ns(launch / sc.n_steps)} a step, GPU "
        f"idle in gaps under {fmt_ns(sc.rules.launch_gap_ns)} "
        f"{fmt_ns(min(short_gaps, sc.other) / sc.n_steps)} a step; {held}; "
        f"{_steps_text(sc.numbers)})"
    )
    # what launches hold: the launch calls or the short GPU-idle gaps between kernels
    return dataclasses.replace(
        _done("launch", text, sc, max(launch, short_gaps)),
        kernels_per_step=top,
        kernel_ns_median=int(nputil.median(med)),
    )


def _op_cause(sc: _Scope) -> HostCause | None:
    """Eager operator overhead or Python between operators (module docstring, 4 and 5)."""
    ops = {k: sum(_series(r, _host_ops(r, k), sc.kept)[0] for r in sc.mine) for k in _HOST_OPS}
    if not any(r.evidence.host_ops for r in sc.mine):
        return _python_old(sc)  # evidence recorded before host_ops
    inside, between = ops["in_ops_idle"], ops["between_idle"]
    if inside >= sc.rules.eager_op_share * sc.other and inside >= between:
        threads = max((e["threads"] if (e := r.evidence.host_ops) else 0) or 1 for r in sc.mine)
        kps = max((float(r.evidence.kernels_per_step or 0) for r in sc.mine), default=0.0)
        med = max((int(r.evidence.kernel_ns_median or 0) for r in sc.mine), default=0)
        who = (
            (
                f"training thread {fmt_ns(ops['training'] / sc.n_steps)} and "
                + ("autograd thread" if threads == 2 else "autograd threads")
                + f" {fmt_ns(ops['other_threads'] / sc.n_steps)} inside operators a step"
            )
            if threads > 1
            else "all on the training thread"
        )
        kern = (
            (
                f"; {kps:.0f} kernels a step, median {fmt_ns(med)}, launch calls "
                f"{fmt_ns(ops['launch'] / sc.n_steps)} a step"
            )
            if kps
            else ""
        )
        text = f"CPU time inside operators with the GPU idle {_share_text(sc, inside, who + kern)}"
        return dataclasses.replace(_done("eager", text, sc, inside), share=inside / sc.other)
    if between < sc.rules.host_cause_share * sc.other:
        return None
    sites = _call_sites(sc)
    before = sum(_series(r, _before_graph(r), sc.kept)[0] for r in sc.mine)
    where = _sites_text(sites)
    if before and before >= _MOST * between:
        text = (
            f"Python before the first graph launch: {fmt_ns(min(before, sc.other) / sc.n_steps)}"
            f" a step ({_steps_text(sc.numbers)}; {words.percent(before / between)} of the "
            f"time between operators, the GPU idle){where}"
        )
    else:
        text = f"no host thread inside an operator, the GPU idle, {_share_text(sc, between)}{where}"
    return dataclasses.replace(
        _done("python", text, sc, between),
        share=between / sc.other,
        call_sites=sites or None,
        before_graph_ns_per_step=min(before, sc.other) // sc.n_steps if before else None,
    )


# the share of the Python time before the first graph launch that names it so
_MOST = 0.5
# call sites a Python cause records, and those its text names
_CALL_SITES, _SITES_NAMED = 5, 3


def _call_sites(sc: _Scope) -> list[CallSite]:
    """The Python frames holding the flagged ranks' Python time, most first (python_sites)."""
    ns: dict[str, int] = {}
    calls: dict[str, int] = {}
    for r in sc.mine:
        if (e := r.evidence.python_sites) is None:
            continue
        for site in e["sites"]:
            name, steps = site["name"], e["steps"]
            own = {"steps": steps, "ns_per_step": site["ns_per_step"]}
            ns[name] = ns.get(name, 0) + _series(r, own, sc.kept)[0]
            calls[name] = calls.get(name, 0) + sum(
                c
                for n, c in zip(steps, site["calls_per_step"], strict=False)
                if (r.rank, n) in sc.kept
            )
    top = sorted((n for n in ns if ns[n] > 0), key=lambda n: (-ns[n], n))[:_CALL_SITES]
    return [
        CallSite(
            name=n,
            ns_per_step=ns[n] // sc.n_steps,
            calls_per_step=round(calls[n] / sc.n_steps),
        )
        for n in top
    ]


def _sites_text(sites: Sequence[CallSite]) -> str:
    """``, mostly in dict.__getitem__ (1,207 calls a step, 11.0 ms) and …``; '' with none."""
    if not sites:
        return ""
    named = [
        f"{c.name} ({c.calls_per_step:,} {words.plural(c.calls_per_step, 'call', count=False)}"
        f" a step, {fmt_ns(c.ns_per_step)})"
        for c in sites[:_SITES_NAMED]
    ]
    return ", mostly in " + (
        ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]
    )


def _before_graph(r: RankSummary) -> Mapping[str, list[int]]:
    """The rank's Python time before each step's first graph launch as ``{steps, ns_per_step}``."""
    e: Mapping[str, Any] = r.evidence.python_sites or {}
    return {"steps": e.get("steps", []), "ns_per_step": e.get("before_graph_ns_per_step", [])}


def _python_old(sc: _Scope) -> HostCause | None:
    """Python overhead from the training thread's operator share alone (older evidence)."""
    op_share = [r.evidence.host_op_share for r in sc.mine]
    outside = [1.0 - float(x) for x in op_share if x is not None]
    if not outside or min(outside) < sc.rules.host_cause_share:
        return None
    ns = round(min(outside) * sc.total)
    text = f"the training thread is between operators {_share_text(sc, ns)}"
    return dataclasses.replace(_done("python", text, sc, ns), share=min(outside))


def _share_text(sc: _Scope, ns: float, more: str = "") -> str:
    """``54% of each step (120.0 ms a step, steps 3–5)``: a cause's time, at most "other"."""
    ns = min(ns, sc.other)
    return (
        f"{words.percent(ns / sc.total if sc.total else 0.0)} of each step "
        f"({fmt_ns(ns / sc.n_steps)} a step, {_steps_text(sc.numbers)}"
        + (f"; {more})" if more else ")")
    )


# the per-step series of a rank's ``host_ops`` (analysis/rank/hostcause.py) _op_cause reads
_HOST_OPS = {
    "in_ops_idle": "in_ops_idle_ns_per_step",
    "between_idle": "between_idle_ns_per_step",
    "training": "training_ns_per_step",
    "other_threads": "other_threads_ns_per_step",
    "launch": "launch_ns_per_step",
}


def _host_ops(r: RankSummary, key: str) -> Mapping[str, list[int]]:
    """One per-step series of the rank's ``host_ops`` as ``{steps, ns_per_step}``."""
    e: Mapping[str, Any] = r.evidence.host_ops or {}
    return {"steps": e.get("steps", []), "ns_per_step": e.get(_HOST_OPS[key], [])}


def _memory(ranks: Sequence[RankSummary], rules: AdviceRules) -> str:
    """``pageable`` when pageable copies hold ``pageable_copy_share`` of the GPU copy time."""
    pageable = sum(int(r.evidence.pageable_copy_ns or 0) for r in ranks)
    gpu_copy = sum(int(r.evidence.copy_ns or 0) for r in ranks)
    if gpu_copy and pageable >= rules.pageable_copy_share * gpu_copy:
        return "pageable"
    return "pinned or device"


def _done(
    kind: HostCauseKind,
    text: str,
    sc: _Scope | None = None,
    own_ns: float = 0,
) -> HostCause:
    """A cause of ``kind``; with ``sc``, its own time (``own_ns``, at most the "other" time).

    ``ns_per_step`` and ``step_share``: what the verdict quotes and the remedy may gain.
    """
    if sc is None:
        return HostCause(kind=kind, label=LABEL[kind], text=text)
    ns = min(int(own_ns), sc.other)
    return HostCause(
        kind=kind,
        label=LABEL[kind],
        text=text,
        ns_per_step=ns // sc.n_steps,
        step_share=ns / sc.total if sc.total else 0.0,
    )


def _entry(r: RankSummary, cls: str) -> Mapping[str, Any]:
    return (r.evidence.host_api or {}).get(cls) or {}


def _api(r: RankSummary, cls: str, kept: set[tuple[int, int]]) -> tuple[int, list[int]]:
    """A class's time over the rank's analysed steps, and the steps it occurs in."""
    return _series(r, _entry(r, cls), kept)


def _series(
    r: RankSummary, e: Mapping[str, Any], kept: set[tuple[int, int]]
) -> tuple[int, list[int]]:
    """A per-step series' total over the rank's analysed steps, and the steps it is in."""
    total, where = 0, []
    for n, ns in zip(e.get("steps", []), e.get("ns_per_step", []), strict=False):
        if (r.rank, n) in kept and ns > 0:
            total += int(ns)
            where.append(int(n))
    return total, where


def _top_api(ranks: Sequence[RankSummary], cls: str) -> str:
    names = [str(_entry(r, cls).get("api")) for r in ranks if _entry(r, cls).get("api")]
    return max(set(names), key=names.count) if names else cls


def waits_for(ranks: Sequence[RankSummary], cls: str = "sync") -> dict[str, float]:
    """What the GPU ran while the ranks' calls of one class blocked (time-weighted shares)."""
    out: dict[str, float] = {}
    weights = 0.0
    for r in ranks:
        e = _entry(r, cls)
        w = float(e.get("ns") or 0) + float(e.get("gpu_busy_ns") or 0)  # the calls' whole time
        for k, v in (e.get("waits_for") or {}).items():
            out[k] = out.get(k, 0.0) + w * float(v)
        weights += w
    return {k: v / weights for k, v in out.items()} if weights else {}


def _steps_text(nums: Sequence[int]) -> str:
    if not nums:
        return "no analysed step"
    shown = words.fold(nums) if len(nums) <= 12 else words.fold(list(nums[:12])) + ", …"
    return ("step " if len(nums) == 1 else "steps ") + shown


def exposed_copies(
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    findings: Sequence[Finding],
    th: Thresholds,
) -> list[Finding]:
    """Copies with nothing computing beside them, ``advice.exposed_copy_share`` of a step.

    Ranks whose host-bound finding already names copies as its cause are left out.
    """
    named = {
        r
        for f in findings
        if f.kind == FindingKind.HOST_BOUND and cause_kind(f) == "copies"
        for r in f.ranks
    }
    kept = {(s.rank, s.step) for s in steps}
    totals: dict[int, int] = {}
    for s in steps:
        totals[s.rank] = totals.get(s.rank, 0) + s.duration_ns
    per: dict[int, float] = {}
    for r in ranks:
        total = totals.get(r.rank, 0)
        copies = _series(r, r.evidence.copies_alone or {}, kept)[0]
        if r.rank not in named and total and copies / total >= th.advice.exposed_copy_share:
            per[r.rank] = copies / total
    if not per:
        return []
    lo, hi = min(per.values()), max(per.values())
    span = (
        words.percent(lo)
        if round(lo, 2) == round(hi, 2)
        else (f"{words.percent(lo)}–{words.percent(hi)}")
    )
    mine = [r for r in ranks if r.rank in per]
    names = sorted(
        {str(e.name) for r in mine for e in r.evidence.top_kernels() if e.family == "memcpy"}
    )
    mem = _memory(mine, th.advice)
    what = f" ({', '.join(names[:2])}; {mem} memory)" if names else f" ({mem} memory)"
    return [
        Finding(
            kind=FindingKind.EXPOSED_COPIES,
            severity=Severity.WARNING,
            message=(
                f"{words.ranks(sorted(per))}: {span} of step time in host-device copies with "
                f"nothing computing beside them{what}"
            ),
            ranks=sorted(per),
            metrics=ExposedCopiesMetrics(
                per_rank={str(k): v for k, v in sorted(per.items())},
                threshold=th.advice.exposed_copy_share,
                pageable=mem == "pageable",
            ),
        )
    ]
