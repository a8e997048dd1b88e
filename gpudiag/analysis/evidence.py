"""Evidence first: what a trace can support, decided before it is judged.

Per rank, :func:`rank_facts` reads what the loader saw (``RankMeta``: host-operator id
holes, clocks, devices) and what the timeline holds (GPU ops of each kind, launch links);
:func:`limits` turns the facts of every rank into :class:`Limit` objects, each a sentence for
the verdict line and the notes. A limit *withholds* the split when the number it would
rest on was not seen; it *qualifies* it when the numbers stand but say little. Either way
no remedy promises a gain from time the trace did not see.

==================  ========  ============================================================
limit               effect    when (rules in ``Thresholds.evidence``)
==================  ========  ============================================================
sampled             withhold  ≥ ``sampled_hole_ratio`` (0.2) of the host operators' External
                              ids are followed by a hole (at least ``sampled_min_ids`` ids):
                              events were sampled or filtered out, so gaps are unseen time
no_gpu_activity     withhold  no kernel, copy or memset, yet the job used GPUs (GPUs in
                              ``deviceProperties``, the NCCL backend, ``nccl:*`` ops, CUDA
                              runtime calls, ``aten::_local_scalar_dense``)
comm_only           withhold  GPU activity is only communication (and copies): no compute
clock               withhold  GPU and host clocks disagree beyond correction
                              (:func:`gpudiag.traces.common.check_clocks`)
short               qualify   at most one analysed step with fewer than ``few_gpu_ops`` (100)
                              GPU ops
unlinked            qualify   fewer than half of the GPU ops have a launching call
==================  ========  ============================================================

Pure: it reads timelines and results, never files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudiag.analysis import words
from gpudiag.config import EvidenceRules
from gpudiag.traces.common import LAUNCH_LINKED_MIN_RATIO
from gpudiag.traces.schema import GPU_BUSY_KINDS, Kind, RankTimeline

WITHHOLD = "withhold"
QUALIFY = "qualify"
_GPU_SIGNS = re.compile(r"^(nccl:|ncclKernel|ncclDevKernel)|_local_scalar_dense$|^cuda[A-Z]")


@dataclass(frozen=True)
class Limit:
    """One thing the trace cannot support, for which ranks, and what it does to the verdict."""

    kind: str  # "sampled", "no_gpu_activity", "comm_only", "clock", "short", "unlinked"
    effect: str  # WITHHOLD or QUALIFY
    message: str
    ranks: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:  # noqa: D102
        return {"kind": self.kind, "effect": self.effect, "message": self.message,
                "ranks": list(self.ranks)}  # fmt: skip


def rank_facts(tl: RankTimeline, steps: int, gpu_ops_in_steps: int, step_ns: int) -> dict[str, Any]:
    """What one rank's trace holds, for :func:`limits` (and the JSON evidence)."""
    meta = tl.meta
    gpu = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    kinds = np.bincount(tl.kind[gpu].astype(np.int64), minlength=len(Kind)) if len(tl) else None
    busy = gpu & np.isin(tl.kind, [int(k) for k in GPU_BUSY_KINDS])
    facts: dict[str, Any] = {
        "steps": steps,
        "step_ns": step_ns,
        "gpu_ops": int(np.count_nonzero(busy)),
        "gpu_ops_in_steps": gpu_ops_in_steps,
        "compute_kernels": int(kinds[Kind.COMPUTE]) if kinds is not None else 0,
        "comm_kernels": int(kinds[Kind.COMM]) if kinds is not None else 0,
        "gpu_ops_linked": int(np.count_nonzero(busy & (tl.launch_ns >= 0))),
    }
    facts.update({k: int(v) for k, v in meta.coverage.items()})
    if meta.clock_unreliable:
        facts["clock_unreliable"] = True
    if meta.clock_shift_ns:
        facts["clock_shift_ns"] = {str(d): int(v) for d, v in meta.clock_shift_ns.items()}
    if not facts["gpu_ops"]:
        facts["gpu_signs"] = _gpu_signs(tl)
    return facts


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
    signs += hits
    return signs


def _sign_word(name: str) -> str:
    if name.startswith("nccl"):
        return "NCCL operations"
    if name.endswith("_local_scalar_dense"):
        return "aten::_local_scalar_dense (a GPU-to-host read)"
    return "CUDA runtime calls"


def limits(facts: Mapping[int, Mapping[str, Any]], rules: EvidenceRules) -> list[Limit]:
    """The limits of the traces of every rank, each naming the ranks it applies to."""
    found: dict[tuple[str, str, str], list[int]] = {}
    for rank in sorted(facts):
        for kind, effect, message in _rank_limits(facts[rank], rules):
            found.setdefault((kind, effect, message), []).append(rank)
    out = []
    for (kind, effect, message), ranks in found.items():
        who = "" if len(facts) == 1 else f"{words.ranks(ranks)}: "
        out.append(Limit(kind, effect, who + message, ranks))
    order = {"clock": 0, "no_gpu_activity": 1, "comm_only": 2, "sampled": 3, "short": 4}
    return sorted(out, key=lambda lim: (lim.effect != WITHHOLD, order.get(lim.kind, 9)))


def _rank_limits(f: Mapping[str, Any], rules: EvidenceRules) -> list[tuple[str, str, str]]:
    out = []
    if f.get("clock_unreliable"):
        out.append(("clock", WITHHOLD, "GPU and host clocks disagree beyond correction: "
                    "compute and host time cannot be split"))  # fmt: skip
    if not f["gpu_ops"]:
        signs = f.get("gpu_signs") or []
        if signs:
            out.append(("no_gpu_activity", WITHHOLD,
                        "cannot split compute from host time: the trace holds no GPU activity, "
                        f"though the job used GPUs ({', '.join(signs)})"))  # fmt: skip
    elif not f["compute_kernels"] and f["comm_kernels"]:
        out.append(("comm_only", WITHHOLD,
                    "the trace holds only communication on the GPU (no compute kernel): a "
                    "communication-only extract cannot show compute or host time"))  # fmt: skip
    ids, holes = f.get("host_op_ids", 0), f.get("host_op_id_holes", 0)
    if ids >= rules.sampled_min_ids and holes >= rules.sampled_hole_ratio * ids:
        span = f.get("host_op_id_span", ids)
        out.append(("sampled", WITHHOLD,
                    f"the trace is sampled or filtered: {ids:,} of {span:,} host-operator ids "
                    f"are present ({ids / span:.1%}, {holes:,} holes), so the gaps between kept "
                    "events are unseen time, not idle time"))  # fmt: skip
    if f["gpu_ops"] and f["steps"] <= 1 and f["gpu_ops_in_steps"] < rules.few_gpu_ops:
        out.append(("short", QUALIFY,
                    f"only {f['gpu_ops_in_steps']} GPU ops in {f['steps']} step of "
                    f"{words.duration(int(f['step_ns']))}: too little to generalise"))  # fmt: skip
    if f["gpu_ops"] and f["gpu_ops_linked"] < LAUNCH_LINKED_MIN_RATIO * f["gpu_ops"]:
        out.append(("unlinked", QUALIFY,
                    f"only {f['gpu_ops_linked']} of {f['gpu_ops']} GPU ops have a launching call "
                    "in the trace: steps are assigned by time"))  # fmt: skip
    return out


def withheld(lims: Sequence[Limit]) -> list[Limit]:
    """The limits that withhold the split."""
    return [lim for lim in lims if lim.effect == WITHHOLD]
