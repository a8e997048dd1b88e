"""Tiny timelines for unit tests: a few lines build a 2-rank, 3-step run with known answers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpudiag.traces.core.common import LoadOptions, NamePatterns, RawColumns
from gpudiag.traces.core.rank_builder import build_rank
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline, RunTimeline

MS = 1_000_000


@dataclass
class TimelineBuilder:
    """Collects intervals in milliseconds; ``build()`` returns a validated RankTimeline."""

    rank: int = 0
    main_tid: int = 100
    device: int = 0
    rows: list[tuple[int, int, int, str, int, int]] = field(default_factory=list)
    # (start_ns, end_ns, kind, lane, name, launch_ns)

    def _add(
        self,
        kind: Kind,
        lane: str,
        name: str,
        start_ms: float,
        end_ms: float,
        launch_ms: float | None = None,
    ) -> TimelineBuilder:
        launch = -1 if launch_ms is None else round(launch_ms * MS)
        self.rows.append((round(start_ms * MS), round(end_ms * MS), int(kind), lane, name, launch))  # type: ignore[arg-type]
        return self

    def step(self, n: int, start: float, end: float) -> TimelineBuilder:
        return self._add(Kind.STEP, f"cpu:{self.main_tid}", f"ProfilerStep#{n}", start, end)

    def op(self, name: str, start: float, end: float, tid: int | None = None) -> TimelineBuilder:
        return self._add(Kind.CPU_OP, f"cpu:{tid or self.main_tid}", name, start, end)

    def data(self, start: float, end: float) -> TimelineBuilder:
        name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
        return self._add(Kind.DATALOADER, f"cpu:{self.main_tid}", name, start, end)

    def host_comm(
        self, name: str, start: float, end: float, tid: int | None = None
    ) -> TimelineBuilder:
        return self._add(Kind.COMM, f"cpu:{tid or self.main_tid}", name, start, end)

    def kernel(
        self,
        start: float,
        end: float,
        launch: float | None = None,
        stream: int = 7,
        name: str = "gemm",
    ) -> TimelineBuilder:
        return self._add(Kind.COMPUTE, f"gpu:{self.device}:{stream}", name, start, end, launch)

    def nccl(
        self,
        start: float,
        end: float,
        launch: float | None = None,
        stream: int = 21,
        name: str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    ) -> TimelineBuilder:
        return self._add(Kind.COMM, f"gpu:{self.device}:{stream}", name, start, end, launch)

    def memcpy(self, start: float, end: float, launch: float | None = None) -> TimelineBuilder:
        return self._add(Kind.MEMCPY, f"gpu:{self.device}:7", "Memcpy HtoD", start, end, launch)

    def build(self, options: LoadOptions | None = None) -> RankTimeline:
        """The timeline as a loader would return it: through the loader core's rules."""
        lanes = sorted({r[3] for r in self.rows})
        names = sorted({r[4] for r in self.rows})
        rows = sorted(self.rows)
        meta = RankMeta(source=f"builder-rank{self.rank}", fmt="test", pid=self.main_tid)
        cols = RawColumns(
            start_ns=np.array([r[0] for r in rows], np.int64),
            end_ns=np.array([r[1] for r in rows], np.int64),
            kind=np.array([r[2] for r in rows], np.int64),
            lane=np.array([lanes.index(r[3]) for r in rows], np.int64),
            name=np.array([names.index(r[4]) for r in rows], np.int64),
            lanes=lanes,
            names=names,
            launch_ns=np.array([r[5] for r in rows], np.int64),
            nbytes=np.full(len(rows), -1, np.int64),
        )
        return build_rank(
            self.rank,
            cols,
            meta,
            NamePatterns(options or LoadOptions()),
            meta.source,
            kinds_final=True,
        )


def gpu_run(ranks: int = 2, steps: int = 3, slow_rank: int | None = None) -> RunTimeline:
    """A run of ``ranks`` GPU ranks: each 10 ms step has 6 ms compute then 2 ms NCCL."""
    out = []
    for r in range(ranks):
        b = TimelineBuilder(rank=r)
        extra = 3.0 if r == slow_rank else 0.0
        for s in range(steps):
            t = s * 10.0
            b.step(s, t, t + 9.5)
            b.kernel(t + 1.0, t + 7.0 + extra, launch=t + 0.5)
            b.nccl(t + 7.0 + extra, t + 9.0 + extra, launch=t + 0.6)
        out.append(b.build())
    return RunTimeline.of(out)
