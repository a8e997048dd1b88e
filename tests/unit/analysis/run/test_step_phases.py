"""Step phases from the telemetry (issue 30, point 7), on hand-built steps with known phases.

The pre-forward phase's growth is input wait whatever makes the batch (no DataLoader wait
is recorded here at all), offline over the rank's floor and live over the least phase seen
so far; a constant pre-forward (host work every step does) is not; the rank and phase
that hold the others back are named.
"""

from __future__ import annotations

from gpudiag.analysis.model.diagnosis import RunStep
from gpudiag.analysis.run.online import LiveRules
from gpudiag.analysis.run.phases import phase_frontier, with_input_wait
from gpudiag.config import SteadyRules, Thresholds

MS = 1_000_000


def _steps(
    n: int = 34,
    onset: int = 20,
    slow_ms: float = 300.0,
    work_ms: float = 100.0,
    lag: dict[int, float] | None = None,
) -> list[RunStep]:
    """Two ranks: 5 ms of host work before the forward, ``work_ms`` of forward+backward;
    from ``onset`` the job's own batch function takes ``slow_ms`` more; ``lag`` adds
    forward time to a rank."""
    out, t = [], 0
    for s in range(n):
        pre = 5.0 + (slow_ms if s >= onset else 0.0)
        fwd = {r: 30.0 + (lag or {}).get(r, 0.0) for r in (0, 1)}
        step = pre + max(fwd.values()) + work_ms - 30.0 + 2.0
        for r in (0, 1):
            bwd = step - pre - fwd[r] - 2.0
            out.append(
                RunStep(
                    r,
                    s,
                    t,
                    round(step * MS),
                    0,
                    None,
                    round(bwd * MS),
                    False,
                    round(pre * MS),
                    round(fwd[r] * MS),
                    2 * MS,
                )
            )
        t += round(step * MS)
    return out


def test_the_pre_forward_growth_is_input_wait_offline() -> None:
    steps = _steps()
    keep = {(s.rank, s.step) for s in steps if s.step >= 1}
    out = with_input_wait(steps, keep, SteadyRules())
    by = {(s.rank, s.step): s for s in out}
    assert by[(0, 10)].data_wait_ns == 0  # the 5 ms every step does is not input wait
    assert by[(0, 25)].data_wait_ns == 300 * MS  # the growth: the batch function's 300 ms
    assert by[(1, 25)].loader_wait_ns == 0  # the DataLoader's own wait is kept
    # a constant pre-forward phase: no input wait anywhere
    flat = with_input_wait(_steps(slow_ms=0.0), keep, SteadyRules())
    assert all(s.data_wait_ns == 0 for s in flat)


def test_a_slower_batch_function_raises_an_input_bound_alert_within_two_steps() -> None:
    live = LiveRules(Thresholds())
    raised = []
    steps = _steps()
    for n in range(34):
        live.add_steps(s for s in steps if s.step == n)
        raised += [a for a in live.evaluate(10**18 + n) if a.state == "raised"]
    assert raised, "no alert"
    first = raised[0]
    assert first.kind == "data_bound" and first.ranks == [0, 1]
    assert 20 <= first.step <= 22


def test_a_constant_pre_forward_phase_raises_nothing() -> None:
    live = LiveRules(Thresholds())
    steps = _steps(slow_ms=0.0)
    for n in range(34):
        live.add_steps(s for s in steps if s.step == n)
        assert live.evaluate(10**18 + n) == []


def test_the_rank_and_phase_that_hold_the_others_back() -> None:
    steps = _steps(slow_ms=0.0, lag={1: 150.0})
    keep = {(s.rank, s.step) for s in steps}
    f = phase_frontier(steps, keep)
    assert f is not None
    assert (f.rank, f.phase, f.steps, f.steps_compared) == (1, "forward", 34, 34)
    assert f.excess_ns_median == 150 * MS
    # no phases recorded: nothing to attribute
    bare = [
        RunStep(s.rank, s.step, s.start_ns, s.duration_ns, 0, None, s.backward_ns, False)
        for s in steps
    ]
    assert phase_frontier(bare, keep) is None


def test_one_ranks_longer_pre_forward_is_its_straggler_alert_not_input_bound() -> None:
    # rank 1 alone spends 300 ms more before its forward from step 20; rank 0 waits for it
    # in backward: the straggler alert carries it (no data-bound alert for that rank)
    live = LiveRules(Thresholds())
    out, t = [], 0
    for s in range(34):
        pre = {0: 5.0, 1: 5.0 + (300.0 if s >= 20 else 0.0)}
        step = max(pre.values()) + 100.0
        for r in (0, 1):
            bwd = step - pre[r] - 30.0 - 2.0
            out.append(
                RunStep(
                    r,
                    s,
                    t,
                    round(step * MS),
                    0,
                    None,
                    round(bwd * MS),
                    False,
                    round(pre[r] * MS),
                    30 * MS,
                    2 * MS,
                )
            )
        t += round(step * MS)
    raised = []
    for n in range(34):
        live.add_steps(x for x in out if x.step == n)
        raised += [a for a in live.evaluate(10**18 + n) if a.state == "raised"]
    assert [(a.kind, a.ranks) for a in raised] == [("straggler", [1])]
    assert 20 <= raised[0].step <= 22
