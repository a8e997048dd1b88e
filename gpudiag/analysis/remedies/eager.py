"""The remedy for eager operator overhead: the host busy inside operators, the GPU idle.

analysis/causes.py names the cause ``eager`` when a host thread of the rank (the training
thread or an autograd thread) is inside an operator for most of the time the GPU computes
nothing: each eager operator costs CPU time in dispatch, autograd bookkeeping and its
launches however small its kernels are. What fits is fewer operators (torch.compile),
replaying the step without the host (CUDA graphs) and more work per operator (larger
batches) — not "move logging out of the loop", which is for time *between* operators.
Its row (with the host remedies' gain and evidence) is in analysis/host_remedies.py.
"""

from __future__ import annotations

from gpudiag.analysis.findings.causes import figures_of as _figures
from gpudiag.analysis.model.diagnosis import Finding
from gpudiag.analysis.remedies.remedy import Context
from gpudiag.analysis.remedies.remedy import compiled as _compiled
from gpudiag.analysis.remedies.remedy import native as _native


def title(f: Finding, c: Context) -> str:
    """What to do, minus what the trace shows already done (graphs, torch.compile)."""
    if _native(c):
        return "Cut host work between kernels: fewer, larger kernels, CUDA graphs"
    graphs = bool(_figures(f).graphs_launched)
    compiled = _compiled(c)
    if graphs and compiled:
        return "Cut eager operator overhead: larger batches, graphs over the eager parts"
    if graphs:
        return "Cut eager operator overhead: torch.compile, larger batches"
    if compiled:
        return "Cut eager operator overhead: compile the eager parts, CUDA graphs, larger batches"
    return "Cut eager operator overhead: torch.compile, CUDA graphs, larger batches"


def detail(f: Finding, c: Context) -> str:
    """Why the host is the limit, and the remedies in the order they usually pay."""
    head = (
        f"The host is busy executing operators one by one while the GPU waits — "
        f"{_figures(f).text or 'CPU time inside operators'}. "
    )
    if _native(c):
        return head + (
            "Give each kernel more work, fuse small kernels, and capture the "
            "iteration in a CUDA graph (cudaStreamBeginCapture / cudaGraphLaunch)."
        )
    compile_ = (
        "extend torch.compile to the parts still run eagerly (it is in use) — the "
        "model, the loss and the optimizer step (fused=True or foreach=True) — "
        if _compiled(c)
        else "torch.compile the model and loss and use fused optimizers (fused=True or "
        "foreach=True), so far fewer operators are dispatched a step; "
    )
    graphs = (
        "capture the parts still run eagerly in CUDA graphs; "
        if _figures(f).graphs_launched
        else "capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or "
        "torch.cuda.graphs) so the host no longer issues each kernel; "
    )
    return head + (
        "Each eager operator costs tens of microseconds of CPU time in dispatch, autograd "
        "and launch however small its kernels: " + compile_ + graphs + "and raise the "
        "batch size per step so each operator does more work. torch.profiler's operator "
        "self CPU times show which operators cost the most."
    )
