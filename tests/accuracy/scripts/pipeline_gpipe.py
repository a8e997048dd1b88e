"""A 2-stage GPipe pipeline over gloo on CPU, the way a user writes one with isend/irecv.

Stage 0 runs the first half of an MLP on each of ``--micro`` micro-batches and sends the
activations to stage 1 (``dist.isend``); stage 1 receives them (``dist.irecv`` + wait),
runs the second half and the loss, and sends the gradients back in the backward phase
(all forwards, then all backwards: GPipe). Each stage's forward and backward per
micro-batch take about the same time (``--work`` seconds of matrix work, measured), so the
schedule's bubble is (p − 1)/(m + p − 1). The script profiles itself (no schedule) with a
``record_function(f"step {i}")`` range per iteration and measures, with its own clock,
the time each stage is blocked in ``wait()`` on a receive, written to
``truth-<rank>.json`` — the bubble measured independently of gpudiag.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function


def busy(seconds: float, x: torch.Tensor) -> torch.Tensor:
    """Matrix work for about ``seconds`` (calibrated once per process)."""
    for _ in range(max(1, round(seconds / busy.per_iter))):  # type: ignore[attr-defined]
        x = torch.tanh(x @ busy.w)  # type: ignore[attr-defined]
    return x


def calibrate(dim: int) -> None:
    busy.w = torch.randn(dim, dim) / dim**0.5  # type: ignore[attr-defined]
    x = torch.randn(64, dim)
    t0 = time.perf_counter()
    for _ in range(50):
        x = torch.tanh(x @ busy.w)  # type: ignore[attr-defined]
    busy.per_iter = (time.perf_counter() - t0) / 50  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--work", type=float, default=0.02)
    p.add_argument("--dim", type=int, default=256)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    calibrate(a.dim)
    peer = 1 - rank
    act = torch.zeros(64, a.dim)
    recv_wait: list[float] = []
    starts: list[float] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(a.steps):
            starts.append(time.perf_counter())
            blocked = 0.0
            with record_function(f"step {i}"):
                sends = []
                for _ in range(a.micro):  # forward of every micro-batch
                    if rank == 1:
                        t = time.perf_counter()
                        dist.irecv(act, src=peer).wait()
                        blocked += time.perf_counter() - t
                    out = busy(a.work, act)
                    if rank == 0:
                        sends.append(dist.isend(out.contiguous(), dst=peer))
                for _ in range(a.micro):  # backward of every micro-batch
                    if rank == 0:
                        t = time.perf_counter()
                        dist.irecv(act, src=peer).wait()
                        blocked += time.perf_counter() - t
                    grad = busy(a.work, act)
                    if rank == 1:
                        sends.append(dist.isend(grad.contiguous(), dst=peer))
                for s in sends:
                    s.wait()
            recv_wait.append(blocked)
        starts.append(time.perf_counter())
    out = Path(a.out)
    prof.export_chrome_trace(str(out / f"rank-{rank}.pt.trace.json.gz"))
    truth = [
        {"step": i, "period_s": starts[i + 1] - starts[i], "recv_wait_s": recv_wait[i]}
        for i in range(a.steps)
    ]
    (out / f"truth-{rank}.json").write_text(json.dumps({"micro": a.micro, "steps": truth}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
