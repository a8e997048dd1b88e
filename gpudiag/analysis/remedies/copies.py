"""The remedies for host-device copies with nothing computing beside them (copy-bound runs).

Two rows of :data:`gpudiag.analysis.remedies.advice.RULES`, chosen from what the copies are:

* **overlap** (``exposed-copies``): copy on a side stream with ``non_blocking`` so copies
  run behind kernels. Overlap hides at most the compute there is to hide behind: the gain
  is the copies' time per step, never more than the flagged ranks' compute per step.
  Pinned memory is advised only where the copies are from pageable memory (CUPTI's
  memory kinds in the copy names: Kineto's ``(Pageable -> Device)``, Nsight's
  ``srcKind``/``dstKind``); where a top copy names pinned memory the detail says it is
  pinned already; where no memory kind is recorded, pinning is advised conditionally.
* **move less** (``copy-less``): when the copies hold at least ``advice.copy_over_compute``
  (2) × the compute per step, no overlap can hide them: keep the data resident on the GPU,
  stop re-uploading or offloading it. Its gain is the copies' time per step — what moving
  none of that data would save, an upper bound; moving half saves about half.
"""

from typing import TypedDict

from gpudiag.analysis.findings.causes import cause_json, cause_kind, fmt_ns
from gpudiag.analysis.findings.causes import figures_of as _figures
from gpudiag.analysis.model.diagnosis import Finding, FindingKind, Mode
from gpudiag.analysis.model.metrics import ExposedCopiesMetrics
from gpudiag.analysis.remedies.remedy import Context, Remedy, const
from gpudiag.analysis.remedies.remedy import native as _native


def copies_ns(f: Finding, c: Context) -> int:
    """The copies with nothing beside them per step (the cause's, else the finding's share)."""
    if f.kind == FindingKind.EXPOSED_COPIES:
        return round(f.metrics.share() * c.step_ns)
    own = int(_figures(f).ns_per_step or 0)
    return min(own, c.median_part(f.ranks, "other_ns", "mean"))


def compute_ns(f: Finding, c: Context) -> int:
    """The flagged ranks' compute per step: all that copies could hide behind."""
    return c.median_part(f.ranks, "compute_ns", "mean")


def pageable(f: Finding) -> bool:
    """The copies are from (or to) pageable host memory."""
    if f.kind == FindingKind.EXPOSED_COPIES:
        return isinstance(f.metrics, ExposedCopiesMetrics) and f.metrics.pageable
    return bool(_figures(f).pageable)


def pinned_seen(f: Finding, c: Context) -> bool:
    """A top copy of the flagged ranks names pinned host memory (``… (Pinned -> Device)``)."""
    return any(
        "Pinned" in str(e.name)
        for r in f.ranks
        if r in c.ranks
        for e in c.ranks[r].evidence.top_kernels()
        if e.family == "memcpy"
    )


def dwarfed(f: Finding, c: Context) -> bool:
    """The copies hold at least ``copy_over_compute`` × the compute per step."""
    return copies_ns(f, c) >= c.rules.copy_over_compute * max(compute_ns(f, c), 1)


def _overlap_gain(f: Finding, c: Context) -> int | None:
    return min(copies_ns(f, c), compute_ns(f, c)) or None


def _overlap_title(f: Finding, _c: Context) -> str:
    if pageable(f):
        return "Hide host-device copies: pinned memory, non_blocking, a side stream"
    return "Overlap host-device copies with compute: non_blocking copies on a side stream"


def _what(f: Finding) -> str:
    return str(_figures(f).text or "copies alone")


def _overlap_detail(f: Finding, c: Context) -> str:
    cp, comp = copies_ns(f, c), compute_ns(f, c)
    head = (
        "Most of the time outside compute is memory copies with nothing running beside "
        f"them ({_what(f)}). "
    )
    bound = (
        f"Overlap can hide at most the compute there is to hide them behind: "
        f"{fmt_ns(comp)} a step against {fmt_ns(cp)} of copies. "
    )
    if _native(c):
        pin = (
            "allocate host buffers pinned (cudaMallocHost) and "
            if pageable(f)
            else "the host memory is already pinned: "
            if pinned_seen(f, c)
            else "if the host buffers are pageable, pin them (cudaMallocHost); "
        )
        return (
            head
            + bound
            + pin[:1].upper()
            + pin[1:]
            + (
                "copy with cudaMemcpyAsync on a stream of its own and overlap the copies with "
                "kernels."
            )
        )
    pin = (
        "allocate host tensors in pinned memory (DataLoader(pin_memory=True) or .pin_memory()), "
        if pageable(f)
        else "the host memory is already pinned: "
        if pinned_seen(f, c)
        else "if the host tensors are pageable, pin them "
        "(DataLoader(pin_memory=True), .pin_memory()); "
    )
    return (
        head
        + bound
        + pin[:1].upper()
        + pin[1:]
        + (
            "copy with .to(device, non_blocking=True), prefetch the next batch on a side CUDA "
            "stream, and avoid device-to-host copies inside the step (.cpu(), .item(), "
            ".tolist())."
        )
    )


def _less_detail(f: Finding, c: Context) -> str:
    cp, comp = copies_ns(f, c), compute_ns(f, c)
    return (
        f"The copies ({fmt_ns(cp)} a step) dwarf the compute ({fmt_ns(comp)} a step): no "
        "overlap can hide them, only moving less data can. Keep weights and inputs "
        "resident on the GPU instead of re-uploading them each step, turn off CPU "
        "offload where the GPU memory allows it, and if this is loading (a one-off), "
        "leave it out of the measured steps. Moving none of this data would save at "
        f"most {fmt_ns(cp)} a step; moving half saves about half."
    )


class CopiesEvidence(TypedDict):
    """A copy remedy's evidence: the copies alone, the compute beside, and the host cause."""

    copies_alone_ns_per_step: int
    compute_ns_per_step: int
    pageable: bool
    ranks: list[int]
    cause: dict[str, object]  # the host cause's JSON (HostCause.to_json), {} when none


def _evidence(f: Finding, c: Context) -> CopiesEvidence:
    return CopiesEvidence(
        copies_alone_ns_per_step=copies_ns(f, c),
        compute_ns_per_step=compute_ns(f, c),
        pageable=pageable(f),
        ranks=f.ranks,
        cause=cause_json(f),
    )


def _gpu(f: Finding, c: Context) -> bool:
    if c.run.mode != Mode.GPU:
        return False
    return f.kind == FindingKind.EXPOSED_COPIES or cause_kind(f) == "copies"


OVERLAP = Remedy(
    id=const("exposed-copies"),
    title=_overlap_title,
    detail=_overlap_detail,
    gain=_overlap_gain,
    evidence=_evidence,
    applies=_gpu,
)

MOVE_LESS = Remedy(
    id=const("copy-less"),
    title=const("Move less data between host and device: keep it resident on the GPU"),
    detail=_less_detail,
    gain=lambda f, c: copies_ns(f, c) or None,
    evidence=_evidence,
    applies=lambda f, c: _gpu(f, c) and dwarfed(f, c),
)
