"""The warm-up cut shortens a rank's per-step evidence with its steps.

The cut is a run-level decision made once every rank is in; the rank's per-step evidence
(a pipeline stage's receive waits, Nsight's sampled GPU metrics) was measured over all of
the rank's steps. Left as it was, a stage's bubble divided the warm-up step's receive wait
by the steady steps' time (CI: 0.52 measured where the job's own clock said 0.44).
"""

from __future__ import annotations

from gpudiag.analysis.model.diagnosis import Mode, RankEvidence, StepBreakdown, StepSource
from gpudiag.analysis.rank.analyse import RankResult
from gpudiag.analysis.run.reconcile import without_warmup
from gpudiag.config import Thresholds
from gpudiag.traces.schema import RankMeta

MS = 1_000_000


def _result(rank: int, durations_ms: list[int], waits_ms: list[int]) -> RankResult:
    steps = []
    t = 0
    for i, d in enumerate(durations_ms):
        steps.append(StepBreakdown(rank, i, t, d * MS, d * MS, 0, 0, 0, 0))
        t += d * MS
    ev = RankEvidence(
        p2p_recv_wait_ns=sum(waits_ms) * MS,
        p2p_recv_wait_ns_per_step=[w * MS for w in waits_ms],
        gpu_metrics_per_step={"SM Active": [float(w) for w in waits_ms]},
    )
    return RankResult(rank, RankMeta(), Mode.CPU, StepSource.USER_RANGE, steps, evidence=ev)


def test_the_warmup_steps_wait_leaves_with_the_step():
    # step 0 is 5x the rest on both ranks: warm-up
    results = [_result(r, [500, 100, 100, 100, 100], [300, 40, 40, 40, 40]) for r in (0, 1)]
    kept, warm = without_warmup(results, Thresholds())
    assert [f.steps for f in warm] == [[0]]
    for r in kept:
        assert [s.step for s in r.steps] == [1, 2, 3, 4]
        assert r.evidence.p2p_recv_wait_ns_per_step == [40 * MS] * 4
        assert r.evidence.p2p_recv_wait_ns == 160 * MS
        assert r.evidence.gpu_metrics_per_step == {"SM Active": [40.0] * 4}


def test_no_warmup_leaves_the_evidence_as_it_was():
    results = [_result(0, [100, 100, 100, 100], [40, 40, 40, 40])]
    kept, warm = without_warmup(results, Thresholds())
    assert warm == [] and kept[0].evidence is results[0].evidence
