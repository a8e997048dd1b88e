"""The per-rank unit of work the fan-out runs: one rank source read, each of its ranks analysed."""

from __future__ import annotations

import dataclasses
from typing import Literal

from gpudiag._support.records import dataclass
from gpudiag.analysis.rank.analyse import RankResult, rank_result
from gpudiag.config import Thresholds
from gpudiag.traces.schema import RankSource

# ``parts``: each rank's classified timeline is kept as well; ``full``: with the raw kernels.
TimelineMode = Literal["parts", "full"]


@dataclass(frozen=True)
class RankWork:
    """Read one source (the traces layer) and analyse each of its ranks (analysis' rank step).

    The API builds one, the fan-out (:mod:`gpudiag.fanout.pool`) runs it on each source in
    worker processes or on Dask workers, so only compact per-rank results cross processes;
    the cache (:mod:`gpudiag.fanout.cache`) keys an entry on its settings. Small and
    picklable, like the sources it is given.
    """

    thresholds: Thresholds
    timeline: TimelineMode | None = None

    def __call__(self, source: RankSource) -> list[RankResult]:
        """The results of each rank ``source`` holds, labelled with the source."""
        return [
            dataclasses.replace(
                rank_result(tl, self.thresholds, self.timeline), source=source.label
            )
            for tl in source.load()
        ]
