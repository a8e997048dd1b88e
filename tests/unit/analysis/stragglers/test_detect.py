"""Straggler rules on synthetic runs whose answer is known by construction."""

import pytest

from gpudiag.analysis.model.diagnosis import Finding, GpuStats, RunStep, StepBreakdown, WholeRun
from gpudiag.analysis.model.metrics import CommBoundMetrics
from gpudiag.analysis.remedies.advice import recommend
from gpudiag.analysis.run.reconcile import comm_wait_for_stragglers
from gpudiag.analysis.run.whatif import what_if
from gpudiag.analysis.stragglers.detect import find_stragglers

MS = 1_000_000


def sync_steps(ranks=4, steps=8, base=(60, 5, 5), extra=None):
    """Synchronous steps: every rank ends together; a slow rank makes the others wait.

    base = (compute, data, other) ms per rank; extra[(rank, step)] = (dc, dd, do) added.
    """
    extra = extra or {}
    out = []
    for s in range(steps):
        busy = {}
        parts = {}
        for r in range(ranks):
            dc, dd, do = extra.get((r, s), (0, 0, 0))
            c, d, o = base[0] + dc, base[1] + dd, base[2] + do
            parts[r] = (c, d, o)
            busy[r] = c + d + o
        transfer = 5
        dur = max(busy.values()) + transfer
        for r in range(ranks):
            c, d, o = parts[r]
            wait = dur - busy[r]
            out.append(
                StepBreakdown(r, s, s * 200 * MS, dur * MS, c * MS, wait * MS, d * MS, o * MS, 0)
            )
    return out


def stragglers(steps, whole=None, gpus=()):
    return [f for f in find_stragglers(steps, whole, gpus=gpus) if f.kind == "straggler"]


def test_balanced_run_names_no_straggler():
    jitter = {(r, s): ((r * 7 + s * 3) % 5 - 2, 0, 0) for r in range(4) for s in range(8)}  # ±2 ms
    assert stragglers(sync_steps(extra=jitter)) == []


def test_single_rank_or_identical_ranks_names_none():
    assert stragglers(sync_steps(ranks=1, extra={(0, s): (30, 0, 0) for s in range(8)})) == []
    assert stragglers(sync_steps(ranks=2)) == []


def test_persistent_compute_straggler_with_cost():
    steps = sync_steps(extra={(2, s): (20, 0, 0) for s in range(8)})
    (f,) = stragglers(steps)
    assert f.ranks == [2] and f.persistent and f.cause == "compute"
    assert f.steps == []  # persistent: every step
    # three other ranks wait 20 ms for it in each of 8 steps
    assert f.wait_caused_ns == 3 * 20 * MS * 8
    assert f.metrics.median_excess_ns == 20 * MS
    assert f.metrics.score == pytest.approx(70 / 90)
    assert f.severity == "error"


def test_data_straggler_and_its_remedy_and_what_if():
    steps = sync_steps(ranks=2, extra={(1, s): (0, 30, 0) for s in range(8)})
    (f,) = stragglers(steps)
    assert (f.ranks, f.cause) == ([1], "data")
    wi = what_if(steps, [f])
    assert wi.step_time_ns == 105 * MS
    assert wi.if_straggler_at_median_speed_ns == 75 * MS
    assert wi.if_no_data_wait_ns == 70 * MS


def test_host_straggler_is_neither_compute_nor_data():
    (f,) = stragglers(sync_steps(extra={(3, s): (0, 0, 25) for s in range(8)}))
    assert (f.ranks, f.cause) == ([3], "host")


def test_intermittent_stall_every_4th_step():
    steps = sync_steps(ranks=2, steps=16, extra={(1, s): (0, 0, 50) for s in (3, 7, 11, 15)})
    (f,) = stragglers(steps)
    assert f.ranks == [1] and f.persistent is False
    assert f.steps == [3, 7, 11, 15]
    assert "every 4th step" in f.message
    assert f.severity == "warning"


def test_a_single_small_spike_is_noise_not_a_straggler():
    assert stragglers(sync_steps(ranks=2, steps=16, extra={(1, 5): (0, 0, 25)})) == []


def test_one_huge_hiccup_is_reported():
    (f,) = stragglers(sync_steps(ranks=2, steps=16, extra={(0, 9): (0, 0, 200)}))
    assert f.ranks == [0] and f.steps == [9]


def test_hardware_cause_from_nvml_slowdown():
    steps = sync_steps(extra={(1, s): (25, 0, 0) for s in range(8)})
    gpus = [
        GpuStats(
            f"GPU-{r}", r, "n0", 50, 0.9, 0.5, 300.0, 1980.0 if r != 1 else 1400.0, 80.0, 0.0, []
        )
        for r in range(4)
    ]
    (f,) = stragglers(steps, gpus=gpus)
    assert f.cause == "hardware"


def test_whole_run_telemetry_is_used_when_present():
    # telemetry: rank 1 spends 40 ms longer outside backward in every step; trace window agrees
    tele = []
    for s in range(12):
        for r in range(2):
            busy = 50 + (40 if r == 1 else 0)
            dur = 95
            tele.append(
                RunStep(r, s, s * 100 * MS, dur * MS, 1 * MS, None, (dur - busy) * MS, False)
            )
    whole = WholeRun(ranks=[], steps=tele)
    trace = sync_steps(ranks=2, steps=3, extra={(1, s): (0, 0, 40) for s in range(3)})
    (f,) = stragglers(trace, whole)
    assert f.metrics.source == "telemetry"
    assert f.metrics.steps_compared == 11  # the warm-up step is left out
    assert (f.ranks, f.cause, f.persistent) == ([1], "host", True)


def test_recommendation_names_the_rank_cause_and_gain():
    from gpudiag.analysis.model.diagnosis import RunSummary, Shares
    from gpudiag.analysis.run.summary import _shares  # noqa: F401  (shares are internal)

    steps = sync_steps(extra={(2, s): (20, 0, 0) for s in range(8)})
    fs = stragglers(steps)
    run = RunSummary(4, 4, 8, 95 * MS, 95 * MS, Shares(0.6, 0.2, 0.1, 0.1), 0.0, 0.4, "gpu")
    (rec,) = [r for r in recommend(run, [], steps, fs) if r.finding == "straggler"]
    assert rec.id == "investigate-rank-2" and "compute" in rec.title
    assert rec.estimated_gain_ns == 20 * MS
    assert rec.evidence["wait_caused_ns"] == fs[0].wait_caused_ns


def test_periodic_stall_through_the_profiled_window_is_confirmed_by_the_trace():
    # telemetry: rank 1 spends 50 ms more outside backward every 4th step; steps 5-9 were
    # profiled (left out of the telemetry comparison), the trace shows step 7's stall
    tele = []
    for s in range(16):
        for r in range(2):
            stall = 50 if (r == 1 and s % 4 == 3) else 0
            busy, dur = 50 + stall, 100 + 50 * (s % 4 == 3)
            tele.append(
                RunStep(r, s, s * 200 * MS, dur * MS, 0, None, (dur - busy) * MS, 5 <= s <= 9)
            )
    whole = WholeRun(ranks=[], steps=tele)
    extra = {(1, 7): (0, 0, 50)}
    trace = [s for s in sync_steps(ranks=2, steps=10, extra=extra) if 5 <= s.step <= 9]
    (f,) = stragglers(trace, whole)
    assert f.steps == [3, 7, 11, 15]
    assert "every 4th step" in f.message
    assert f.cause == "host"  # from the trace's step 7


def test_a_second_part_of_similar_size_is_named_too():
    # rank 3 sleeps 25 ms and computes 20 ms longer in every step (a contended core)
    (f,) = stragglers(sync_steps(extra={(3, s): (20, 0, 25) for s in range(8)}))
    assert (f.cause, f.metrics.also) == ("host", ["compute"])
    assert "(+25 ms a step) and computing longer (+20 ms)" in f.message
    # a small second part is left out
    (g,) = stragglers(sync_steps(extra={(3, s): (4, 0, 25) for s in range(8)}))
    assert g.metrics.also == [] and "computing" not in g.message


def _comm_bound(ranks, share=0.2):
    return Finding(
        "comm_bound",
        "warning",
        "rank 0: 20% of step time waiting",
        ranks=ranks,
        metrics=CommBoundMetrics({str(r): share for r in ranks}, 0.1),
    )


def test_comm_wait_spent_waiting_for_late_ranks_is_called_imbalance():
    # ranks take turns arriving last: no straggler, but rank 0's exposed wait is mostly sync
    steps = [
        StepBreakdown(0, s, s * 100 * MS, 100 * MS, 70 * MS, 20 * MS, 5 * MS, 5 * MS, 0)
        for s in range(4)
    ]
    sync = {(0, s): 16 * MS for s in range(4)}
    (f,) = comm_wait_for_stragglers([_comm_bound([0])], steps, sync)
    assert f.severity == "warning" and f.metrics.sync_wait_share == pytest.approx(0.8)
    assert "80% of it is waiting for other ranks to reach the collective" in f.message
    # with a straggler named, the straggler finding carries the lost time
    slow = Finding("straggler", "error", "rank 1 …", ranks=[1], cause="compute")
    _, g = comm_wait_for_stragglers([slow, _comm_bound([0])], steps, sync)
    assert g.severity == "info" and "waiting for the straggler (rank 1)" in g.message
    # mostly transfer: the finding is left as it was, with the share for the record
    (h,) = comm_wait_for_stragglers([_comm_bound([0])], steps, {(0, 0): 4 * MS})
    assert h.message == "rank 0: 20% of step time waiting" and h.metrics.sync_wait_share == 0.05


def test_straggler_computing_longer_in_backward_comes_from_the_trace_window():
    # DDP: rank 1 computes longer, mostly in backward; rank 0 waits for it inside its own
    # backward, so the telemetry (busy = step - backward) sees only rank 1's slower forward:
    # 6 ms a step, under the 10% (9.5 ms) threshold
    def tele(fwd_excess):
        return WholeRun(
            ranks=[],
            steps=[
                RunStep(
                    r, s, s * 100 * MS, 95 * MS, 1 * MS, None, (60 - fwd_excess * r) * MS, False
                )
                for s in range(12)
                for r in range(2)
            ],
        )

    trace = sync_steps(ranks=2, steps=5, extra={(1, s): (30, 0, 0) for s in range(5)})
    assert stragglers(sync_steps(ranks=2, steps=5), tele(6)) == []
    (f,) = stragglers(trace, tele(6))
    assert (f.ranks, f.cause, f.persistent) == ([1], "compute", True)
    assert f.metrics.source == "trace" and "seen in the profiled steps" in f.message
    # the profiled window alone, with telemetry that does not lean that way: the profiler
    # perturbs its few steps, so nothing is named
    assert stragglers(trace, tele(0)) == []
    # a rank the telemetry already names is not named twice
    (g,) = stragglers(trace, tele(40))
    assert g.metrics.source == "telemetry"
