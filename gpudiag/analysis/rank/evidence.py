"""Evidence first: what a trace can support, decided before it is judged.

Per rank, :func:`rank_facts` reads what the loader saw (``RankMeta``: host-operator id
holes, clocks, devices) and what the timeline holds (GPU ops of each kind, launch links);
:func:`limits` turns the facts of every rank into :class:`Limit` objects, each a sentence for
the verdict line and the notes. A limit *withholds* the split when the number it would
rest on was not seen; it *qualifies* it when the numbers stand but say little. Either way
no remedy promises a gain from time the trace did not see, and a "short" qualification
(too little activity to generalise from) gives no gain and no what-if either: one short
step is no forecast (:func:`gains_supported`).

==================  ========  ============================================================
limit               effect    when (rules in ``Thresholds.evidence``)
==================  ========  ============================================================
sampled             withhold  ≥ ``sampled_hole_ratio`` (0.2) of the host operators' External
                              ids are followed by a hole (at least ``sampled_min_ids`` ids):
                              events were sampled or filtered out, so gaps are unseen time
no_gpu_activity     withhold  no kernel, copy or memset, yet the job used GPUs (GPUs in
                              ``deviceProperties``, the NCCL backend, ``nccl:*`` ops, CUDA
                              runtime calls; ``aten::_local_scalar_dense`` is named beside
                              them, never alone: ``.item()`` on a CPU tensor calls it too)
no_kernels          withhold  copies or memsets but no kernel at all: the program stopped
                              before its first kernel (tracing was on)
comm_only           withhold  GPU activity is only communication (and copies): no compute
clock               withhold  GPU and host clocks disagree beyond correction
                              (:func:`gpudiag.traces.core.rank_builder.check_clocks`)
short               qualify   at most one analysed step with fewer than ``few_gpu_ops`` (100)
                              GPU ops; on a CPU-only trace, fewer than ``few_host_ops`` (100)
                              host operators and collective ranges starting in it
unlinked            qualify   fewer than half of the GPU ops have a launching call
==================  ========  ============================================================

Pure: it reads timelines and results, never files.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Final

import numpy as np

from gpudiag._support.records import dataclass
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import Finding, FindingKind, Recommendation, Severity
from gpudiag.analysis.model.evidence import Coverage
from gpudiag.analysis.model.kinds import LimitEffect, LimitKind
from gpudiag.analysis.model.metrics import LimitedEvidenceMetrics, ShareMetrics
from gpudiag.config import LAUNCH_CALL_RE, EvidenceRules
from gpudiag.traces.schema import GPU_BUSY_KINDS, Kind, RankTimeline

WITHHOLD: Final = "withhold"
NO_GAIN = "No gain is given"  # how a remedy's detail says why it gives none
QUALIFY: Final = "qualify"
_GPU_SIGNS = re.compile(r"^(nccl:|ncclKernel|ncclDevKernel)|_local_scalar_dense$|^cuda[A-Z]")
# Operators that exist only on a GPU backend: cuDNN/MIOpen operators and their backward
# nodes, the flash / memory-efficient attention kernels' operators, Inductor's Triton
# kernels (its CPU code is C++, ``cpp_fused_*``), and torch.cuda's lazy initialisation
# (run at the first CUDA use, never by a CPU job).
_GPU_ONLY_OPS = re.compile(
    r"^aten::_?(cudnn|miopen)_|^aten::_(flash|efficient)_attention_|"
    r"^aten::_scaled_dot_product_(flash|efficient|cudnn)_attention$|^(Cudnn|Miopen)\w*Backward|"
    r"^triton_(poi|red|per|tem)_|^torch/cuda/__init__\.py\(\d+\): _lazy_init$"
)


@dataclass(frozen=True)
class Limit:
    """One thing the trace cannot support, for which ranks, and what it does to the verdict."""

    kind: LimitKind
    effect: LimitEffect  # WITHHOLD or QUALIFY
    message: str
    ranks: list[int] = field(default_factory=list)


def rank_facts(
    tl: RankTimeline,
    steps: int,
    gpu_ops_in_steps: int,
    step_ns: int,
    host_ops_in_steps: int = 0,
    step_thread_ops: int = 0,
) -> Coverage:
    """What one rank's trace holds, for :func:`limits` (and the JSON evidence).

    ``host_ops_in_steps``: host operators and collective ranges starting in the analysed
    steps, recorded for a trace without GPU activity (a CPU-only job's evidence), and
    ``step_thread_ops`` the operators among them on the step's own thread.
    """
    meta = tl.meta
    gpu = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    kinds = np.bincount(tl.kind[gpu].astype(np.int64), minlength=len(Kind)) if len(tl) else None
    busy = gpu & np.isin(tl.kind, [int(k) for k in GPU_BUSY_KINDS])
    facts: Coverage = {
        "steps": steps,
        "step_ns": step_ns,
        "gpu_ops": int(np.count_nonzero(busy)),
        "gpu_ops_in_steps": gpu_ops_in_steps,
        "compute_kernels": int(kinds[Kind.COMPUTE]) if kinds is not None else 0,
        "comm_kernels": int(kinds[Kind.COMM]) if kinds is not None else 0,
        "gpu_ops_linked": int(np.count_nonzero(busy & (tl.launch_ns >= 0))),
    }
    launches = _launch_facts(tl, gpu, busy)
    if launches is not None:
        facts["launch_calls"], facts["launch_calls_empty"], facts["kernels_unlinked"] = launches
    # the loader's sampling facts (traces/kineto: host operators' ids, their span and holes)
    cov = meta.coverage
    if "host_op_ids" in cov:
        facts["host_op_ids"] = int(cov["host_op_ids"])
    if "host_op_id_span" in cov:
        facts["host_op_id_span"] = int(cov["host_op_id_span"])
    if "host_op_id_holes" in cov:
        facts["host_op_id_holes"] = int(cov["host_op_id_holes"])
    if meta.clock_unreliable:
        facts["clock_unreliable"] = True
    if meta.clock_shift_ns:
        facts["clock_shift_ns"] = {str(d): int(v) for d, v in meta.clock_shift_ns.items()}
    if facts["gpu_ops"] and not facts["compute_kernels"] and not facts["comm_kernels"]:
        facts["copies"] = int(kinds[Kind.MEMCPY]) if kinds is not None else 0
        facts["memsets"] = int(kinds[Kind.MEMSET]) if kinds is not None else 0
    if not facts["gpu_ops"]:
        facts["gpu_signs"] = _gpu_signs(tl)
        facts["host_ops_in_steps"] = int(host_ops_in_steps)
        facts["step_thread_ops_in_steps"] = int(step_thread_ops)
    return facts


def _launch_facts(tl: RankTimeline, gpu: Any, busy: Any) -> tuple[int, int, int] | None:
    """Kernel-launch calls in the trace, those with no GPU op linked, kernels without a call."""
    if not len(tl) or not busy.any():
        return None
    rx = re.compile(LAUNCH_CALL_RE)
    is_launch = np.array([bool(rx.search(n)) for n in tl.names], bool)[tl.name]
    calls = tl.start_ns[is_launch & ~gpu & (tl.kind == Kind.RUNTIME)]
    if not calls.size:
        return None
    linked = np.unique(tl.launch_ns[busy & (tl.launch_ns >= 0)])
    empty = int(np.count_nonzero(~np.isin(calls, linked)))
    kernels = gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM])
    unlinked = int(np.count_nonzero(kernels & (tl.launch_ns < 0)))
    return int(calls.size), empty, unlinked


def _gpu_signs(tl: RankTimeline) -> list[str]:
    """What says that a trace without GPU activity comes from a GPU job."""
    meta = tl.meta
    signs = []
    if meta.devices:
        n = len(meta.devices)
        signs.append(f"deviceProperties lists {n} GPU{'s' if n != 1 else ''}")
    if (meta.backend or "").lower() == "nccl":
        signs.append("the NCCL backend")
    used = np.unique(tl.name).tolist() if len(tl) else []
    hits = sorted({_sign_word(tl.names[i]) for i in used if _GPU_SIGNS.search(tl.names[i])})
    only = [i for i in used if _GPU_ONLY_OPS.search(tl.names[i])]
    if only:
        n = int(np.count_nonzero(np.isin(tl.name, only)))
        first = tl.names[max(only, key=lambda i: int(np.count_nonzero(tl.name == i)))]
        hits.append(f"{n:,} operator{'s' if n != 1 else ''} that run only on a GPU ({first}, …)")
    strong = signs + [h for h in hits if not h.startswith("aten::")]
    # .item() on a CPU tensor calls _local_scalar_dense too: alone it says nothing
    return signs + hits if strong else []


def _sign_word(name: str) -> str:
    if name.startswith("nccl"):
        return "NCCL operations"
    if name.endswith("_local_scalar_dense"):
        return "aten::_local_scalar_dense (a GPU-to-host read)"
    return "CUDA runtime calls"


def limits(
    facts: Mapping[int, Mapping[str, Any]], rules: EvidenceRules, linked_min_ratio: float = 0.5
) -> list[Limit]:
    """The limits of the traces of every rank: one per kind, naming the ranks it applies to."""
    found: dict[tuple[LimitKind, LimitEffect], list[tuple[int, str, str]]] = {}
    for rank in sorted(facts):
        for kind, effect, lead, detail in _rank_limits(facts[rank], rules, linked_min_ratio):
            found.setdefault((kind, effect), []).append((rank, lead, detail))
    out = []
    for (kind, effect), hits in found.items():
        ranks = [r for r, _, _ in hits]
        lead = hits[0][1]
        details = sorted({d for _, _, d in hits if d})
        if len(facts) > 1:
            lead = f"{words.ranks(ranks)}: {lead}"
        if kind == "short" and len(details) > 1 and all(facts[r]["gpu_ops"] for r in ranks):
            details = [_short_range([facts[r] for r in ranks])]
        if len(details) == 1:
            message = lead.format(details[0])
        else:  # per-rank numbers differ: each rank's own
            each = "; ".join(f"rank {r}: {d}" for r, _, d in hits)
            message = lead.format(each)
        out.append(Limit(kind, effect, message, ranks))
    order = {
        "clock": 0,
        "no_gpu_activity": 1,
        "no_kernels": 1,
        "comm_only": 2,
        "sampled": 3,
        "filtered": 4,
        "short": 5,
    }
    return sorted(out, key=lambda lim: (lim.effect != WITHHOLD, order.get(lim.kind, 9)))


def _short_range(fs: Sequence[Mapping[str, Any]]) -> str:
    """``16–24 GPU ops in 1 step of 21.0 ms`` for several ranks' short traces."""
    ops = [int(f["gpu_ops_in_steps"]) for f in fs]
    durs = sorted({words.duration(int(f["step_ns"])) for f in fs})
    dur = durs[0] if len(durs) == 1 else f"{durs[0]}–{durs[-1]}"
    n = f"{min(ops)}–{max(ops)}" if min(ops) != max(ops) else str(ops[0])
    return f"{n} GPU ops in 1 step of {dur}"


# each limit a rank's facts can set: its kind, its effect, and its sentence (``{}``: the
# rank's numbers); _rank_limits decides which hold
_LIMIT_SENTENCES: dict[str, tuple[LimitKind, LimitEffect, str]] = {
    "clock": (
        "clock",
        WITHHOLD,
        "GPU and host clocks disagree beyond correction{}: compute and host time cannot be split",
    ),
    "no_gpu_activity": (
        "no_gpu_activity",
        WITHHOLD,
        "cannot split compute from host time: the trace holds no GPU activity, though the job "
        "used GPUs ({})",
    ),
    "no_kernels": (
        "no_kernels",
        WITHHOLD,
        "the trace holds {} but no kernel: tracing was on and the program stopped before its "
        "first kernel ran, so there is no GPU compute to split",
    ),
    "comm_only": (
        "comm_only",
        WITHHOLD,
        "the trace holds only communication on the GPU (no compute kernel){}: a "
        "communication-only extract cannot show compute or host time",
    ),
    "sampled": (
        "sampled",
        WITHHOLD,
        "the trace is sampled or filtered ({}), so the gaps between kept events are unseen "
        "time, not idle time",
    ),
    "filtered": (
        "filtered",
        WITHHOLD,
        "the trace is filtered ({}): the GPU work it left out is unseen time, not idle time",
    ),
    "short": ("short", QUALIFY, "only {}: too little to generalise"),
    "unlinked": (
        "unlinked",
        QUALIFY,
        "only {} GPU ops have a launching call in the trace: steps are assigned by time",
    ),
}


def _rank_limits(
    f: Mapping[str, Any], rules: EvidenceRules, linked_min_ratio: float
) -> list[tuple[LimitKind, LimitEffect, str, str]]:
    """(kind, effect, sentence with ``{}`` for the rank's numbers, the numbers)."""
    found = _content_limits(f, rules) + _size_limits(f, rules, linked_min_ratio)
    return [(*_LIMIT_SENTENCES[key], numbers) for key, numbers in found]


def _content_limits(f: Mapping[str, Any], rules: EvidenceRules) -> list[tuple[str, str]]:
    """What the trace lacks or leaves out: (limit, the rank's numbers)."""
    out: list[tuple[str, str]] = []
    if f.get("clock_unreliable"):
        out.append(("clock", ""))
    if not f["gpu_ops"]:
        signs = f.get("gpu_signs") or []
        if signs:
            out.append(("no_gpu_activity", ", ".join(signs)))
    elif not f["compute_kernels"] and not f["comm_kernels"]:
        copies = f"{f.get('copies', 0)} copies and {f.get('memsets', 0)} memsets"
        out.append(("no_kernels", copies))
    elif not f["compute_kernels"] and f["comm_kernels"]:
        out.append(("comm_only", ""))
    ids, holes = f.get("host_op_ids", 0), f.get("host_op_id_holes", 0)
    if ids >= rules.sampled_min_ids and holes >= rules.sampled_hole_ratio * ids:
        span = f.get("host_op_id_span", ids)
        out.append(("sampled", f"{ids / span:.1%} of the host operators' ids present"))
    # launch calls whose kernels are not in the trace — beyond what kernels without a link
    # could be (a trace whose links are broken holds its kernels: that is "unlinked")
    calls, empty = f.get("launch_calls", 0), f.get("launch_calls_empty", 0)
    missing = empty - f.get("kernels_unlinked", 0)
    if calls >= rules.filtered_min_launches and missing >= rules.filtered_launch_ratio * calls:
        out.append(("filtered", f"{empty:,} of {calls:,} kernel launch calls have no GPU op"))
    return out


def _size_limits(
    f: Mapping[str, Any], rules: EvidenceRules, linked_min_ratio: float
) -> list[tuple[str, str]]:
    """Too little to generalise from, or steps assigned by time: (limit, the numbers)."""
    out: list[tuple[str, str]] = []

    def step() -> str:
        return f"{f['steps']} step of {words.duration(int(f['step_ns']))}"

    if f["gpu_ops"] and f["steps"] <= 1 and f["gpu_ops_in_steps"] < rules.few_gpu_ops:
        out.append(("short", f"{f['gpu_ops_in_steps']} GPU ops in {step()}"))
    cpu_job = not f["gpu_ops"] and not f.get("gpu_signs")
    host_ops = int(f.get("host_ops_in_steps", 0))
    if cpu_job and f["steps"] <= 1 and host_ops < rules.few_host_ops:
        out.append(("short", f"{host_ops} host events in {step()}"))
    if f["gpu_ops"] and f["gpu_ops_linked"] < linked_min_ratio * f["gpu_ops"]:
        out.append(("unlinked", f"{f['gpu_ops_linked']} of {f['gpu_ops']}"))
    return out


def withheld(lims: Sequence[Limit]) -> list[Limit]:
    """The limits that withhold the split."""
    return [lim for lim in lims if lim.effect == WITHHOLD]


# Findings that rest on the split of step time: withheld with it.
SPLIT_FINDINGS = (
    FindingKind.IDLE_RATIO,
    FindingKind.HOST_BOUND,
    FindingKind.DATA_BOUND,
    FindingKind.COMM_BOUND,
    FindingKind.COMPUTE_BOUND,
    FindingKind.BELOW_PEAK,
)


def apply_limits(findings: Sequence[Finding], lims: Sequence[Limit]) -> list[Finding]:
    """The findings without those a withholding limit takes away, plus one per limit.

    A finding about the split of step time (idle, host-, data-, comm-, compute-bound)
    rests on time the trace did not see when a limit withholds the split for its ranks:
    it goes, for those ranks (a finding about other ranks too keeps them).
    """
    gone = {r for lim in withheld(lims) for r in lim.ranks}
    out = []
    for f in findings:
        if f.kind in SPLIT_FINDINGS and gone and f.ranks:
            keep = [r for r in f.ranks if r not in gone]
            if not keep:
                continue
            if keep != list(f.ranks):
                m = f.metrics
                if isinstance(m, ShareMetrics):
                    m = dataclasses.replace(
                        m, per_rank={k: v for k, v in m.per_rank.items() if int(k) in keep}
                    )
                f = dataclasses.replace(f, ranks=keep, metrics=m)
        out.append(f)
    for lim in lims:
        severity = Severity.WARNING if lim.effect == WITHHOLD else Severity.INFO
        out.append(
            Finding(
                FindingKind.LIMITED_EVIDENCE,
                severity,
                lim.message,
                ranks=list(lim.ranks),
                metrics=LimitedEvidenceMetrics(lim.kind, lim.effect),
            )
        )
    return out


def no_gain_limits(lims: Sequence[Limit]) -> list[Limit]:
    """The limits under which no gain (and no what-if) is given: withholding ones, "short".

    The time a withheld trace did not see (holes, GPU work it does not hold) cannot be
    promised back; one short step with little activity is too little to forecast from.
    Other qualifications (steps assigned by time) keep the gains.
    """
    return [lim for lim in lims if lim.effect == WITHHOLD or lim.kind == "short"]


def gains_supported(lims: Sequence[Limit]) -> bool:
    """Whether the remedies' gains and the what-if may be given (:func:`no_gain_limits`)."""
    return not no_gain_limits(lims)


def no_unseen_gains(recs: Sequence[Recommendation], lims: Sequence[Limit]) -> list[Recommendation]:
    """The remedies, with no gain estimated under :func:`no_gain_limits`, and why.

    Each keeps its advice; its detail ends with the reason no gain is given.
    """
    stop = no_gain_limits(lims)
    if not stop:
        return list(recs)
    why = f" No gain is given: {stop[0].message}."
    return [
        dataclasses.replace(
            r,
            estimated_gain_ns=None,
            estimated_gain_ratio=None,
            detail=r.detail if NO_GAIN in r.detail else r.detail + why,
        )
        for r in recs
    ]


def dropped_event_notes(dropped: Mapping[int, Mapping[str, int]]) -> list[str]:
    """One note per rank and reason for events or rows the loaders dropped or clamped."""
    return [
        f"rank {rank}: {n:,} {why}"
        for rank in sorted(dropped)
        for why, n in sorted(dropped[rank].items())
        if n
    ]


def judge_evidence(
    facts: Mapping[int, Mapping[str, Any]],
    dropped: Mapping[int, Mapping[str, int]],
    findings: Sequence[Finding],
    rules: EvidenceRules,
    linked_min_ratio: float = 0.5,
) -> tuple[list[Finding], list[Limit], list[str]]:
    """The findings as the limits leave them, the limits, and their notes (dropped events too).

    ``linked_min_ratio``: ``Thresholds.loader.launch_linked_min_ratio``, below which the
    loader assigned steps by time.
    """
    lims, notes = evidence_limits(facts, dropped, rules, linked_min_ratio)
    return apply_limits(findings, lims), lims, notes


def evidence_limits(
    facts: Mapping[int, Mapping[str, Any]],
    dropped: Mapping[int, Mapping[str, int]],
    rules: EvidenceRules,
    linked_min_ratio: float = 0.5,
) -> tuple[list[Limit], list[str]]:
    """What the traces cannot support (:func:`limits`), and the notes: dropped events, limits."""
    lims = limits(facts, rules, linked_min_ratio)
    return lims, dropped_event_notes(dropped) + [lim.message for lim in lims]
