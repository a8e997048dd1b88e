"""Hand-built pipeline-parallel traces with every bubble known by construction.

Each case is p Kineto traces (``rank-<s>.json.gz``, one per stage) of ``steps`` GPipe steps:
per step all m forwards (``fwd_gemm``, F µs each), then all m backwards (``bwd_gemm``,
B µs each, last micro-batch first); activations and gradients pass with ``send``/``recv``
(``ncclDevKernel_SendRecv``, as make_fixtures.py's ``pipeline_4stage``). A receive kernel
is launched at the start of the step or when the stage's GPU frees and spins until the data
arrives, as NCCL's does; every step begins with all stages free (its step range opens
after the previous step's optimizer, as a real step does).

What each stage does per step, from the schedule alone (no gpudiag):

* step time (m + p − 1)·(F + B); compute m·(F + B);
* idle (p − 1)·(F + B): the schedule's bubble (p − 1)/(m + p − 1);
* of it, blocked in receives: (p − 1)·(F + B) − s·B for stage s (stage s finishes its
  backward s·B before the step ends: a drain, not a wait) — :func:`recv_wait_us`;
* ``slow_recv`` µs added to every forward transfer from stage 0 to stage 1 (an injected slow
  link): every later forward, and the backward, shift by it; :func:`recv_wait_us` counts it.

``python tests/accuracy/make_pipeline_cases.py OUT_DIR`` writes every case in ``CASES``.
"""

from __future__ import annotations

import gzip
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from make_host_causes import _x  # one complete-event builder for the generators

PID0 = 2000
GAP_US = 200.0  # between one step's last kernel and the next step's first (optimizer)


@dataclass(frozen=True)
class Case:
    """One pipeline: p stages, m micro-batches, F/B µs per micro-batch, steps."""

    p: int
    m: int
    f: float = 1_000.0
    b: float = 2_000.0
    steps: int = 6
    slow_recv: float = 0.0  # µs added to each forward transfer of stage 0 → 1

    def step_us(self) -> float:
        """Step time: (m + p − 1)(F + B), plus the injected delay's shift of the schedule."""
        return (self.m + self.p - 1) * (self.f + self.b) + self.slow_recv

    def recv_wait_us(self, s: int) -> float:
        """Stage s's receive wait per step (drain excluded), from the construction."""
        # the delay holds stage ≥ 1 before its first forward, and stage 0 before its first
        # backward (every gradient comes later by it); the drain s·B is unchanged
        return (self.p - 1) * (self.f + self.b) - s * self.b + self.slow_recv

    def schedule_bubble(self) -> float:
        """(p − 1)/(m + p − 1): GPipe's idle share."""
        return (self.p - 1) / (self.m + self.p - 1)


#: GPipe p = 4 with m = 8 (schedule bubble 3/11 ≈ 27%) and m = 16 (3/19 ≈ 16%), both below
#: the 30% idle threshold; p = 2, m = 8 (1/9 ≈ 11%); m = 4 (3/7 ≈ 43%, above it); and m = 16
#: with a slow 0 → 1 link (15 ms a step: waits (6 + 15)/72 ≈ 29% against the schedule's 16%).
CASES = {
    "gpipe_p4_m8": Case(4, 8),
    "gpipe_p4_m16": Case(4, 16),
    "gpipe_p2_m8": Case(2, 8),
    "gpipe_p4_m4": Case(4, 4),
    "gpipe_p4_m16_slowlink": Case(4, 16, slow_recv=15_000.0),
}


class _Stage:
    def __init__(self, rank: int) -> None:
        self.rank, self.pid, self.corr = rank, PID0 + rank, 1
        self.ev: list[dict[str, Any]] = [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": self.pid,
                "tid": self.pid,
                "args": {"name": "python3"},
            },
        ]

    def kernel(self, name: str, start: float, dur: float, stream: int = 7, **args: Any) -> None:
        launch = start - 50.0
        self.ev.append(
            _x(
                "cuda_runtime",
                "cudaLaunchKernel",
                self.pid,
                self.pid,
                launch,
                2.0,
                correlation=self.corr,
            )
        )
        self.ev.append(
            _x(
                "kernel",
                name,
                self.rank,
                stream,
                start,
                dur,
                correlation=self.corr,
                device=self.rank,
                stream=stream,
                **args,
            )
        )
        self.corr += 1


def stage_trace(c: Case, s: int) -> dict[str, Any]:
    """Stage s's trace: ``c.steps`` GPipe steps back to back."""
    g = _Stage(s)
    t = 1_000.0
    for k in range(c.steps):
        # the step range opens 100 µs before its first kernel (whose launch lies inside it)
        g.ev.append(
            _x("user_annotation", f"ProfilerStep#{k}", g.pid, g.pid, t - 100.0, c.step_us() + 100.0)
        )
        _step(g, c, s, t)
        t += c.step_us() + GAP_US
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": 1_790_000_000_000_000_000,
        "distributedInfo": {"backend": "nccl", "rank": s, "world_size": c.p},
        "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)],
        "traceEvents": g.ev,
    }


def _step(g: _Stage, c: Case, s: int, t0: float) -> None:
    free = t0  # the GPU is free when the step begins

    def recv(start: float, src: int) -> None:
        begin = min(free, start - 20.0)
        g.kernel(
            "ncclDevKernel_SendRecv",
            begin,
            start - begin,
            stream=40,
            **{"Collective name": "recv", "Src Rank": src},
        )

    delay = c.slow_recv if s > 0 else 0.0  # every forward on stages ≥ 1 waits for it
    for j in range(c.m):
        start = t0 + (s + j) * c.f + delay
        if s > 0:
            recv(start, s - 1)
        g.kernel("fwd_gemm", start, c.f)
        free = start + c.f
        if s < c.p - 1:
            g.kernel(
                "ncclDevKernel_SendRecv",
                start + c.f,
                20.0,
                stream=40,
                **{"Collective name": "send", "Dst Rank": s + 1},
            )
    back0 = t0 + (c.p - 1 + c.m) * c.f + c.slow_recv
    for k in range(c.m):
        start = back0 + (c.p - 1 - s + k) * c.b
        if s < c.p - 1:
            recv(start, s + 1)
        g.kernel("bwd_gemm", start, c.b)
        free = start + c.b
        if s > 0:
            g.kernel(
                "ncclDevKernel_SendRecv",
                start + c.b,
                20.0,
                stream=40,
                **{"Collective name": "send", "Dst Rank": s - 1},
            )


def build(name: str, out: Path) -> Path:
    """Write case ``name``'s stage traces under out/name; the folder."""
    c = CASES[name]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(c.p):
        data = json.dumps(stage_trace(c, s), separators=(",", ":")).encode()
        (folder / f"rank-{s}.json.gz").write_bytes(gzip.compress(data, mtime=0))
    return folder


if __name__ == "__main__":
    for n in CASES:
        build(n, Path(sys.argv[1]))
