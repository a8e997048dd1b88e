"""A rank whose collective timed out waited for a peer: the job_failed finding names the peer.

Truth from outside gpudiag: hand-built rank ends and stacks (which rank stopped calling
collectives is the input), as in /tmp/trial/hang2 (rank 1 stopped at step 8; rank 0's gloo
timeout fired: ``Timed out waiting 45000ms for recv operation to complete``).
"""

from __future__ import annotations

from gpudiag.analysis.hangs.runend import run_end_findings
from gpudiag.analysis.model.kinds import FindingKind
from gpudiag.traces.runfiles.flightrec import Frame, RankStacks, ThreadStack
from gpudiag.traces.runfiles.runend import RankEnd, RunEnd

# rank 0's error line in /tmp/trial/hang2/ranks/rank-0.steps.jsonl (gloo, torch 2.13)
TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 45000ms for recv operation to complete"
)
LIB = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _failed(end: RunEnd):  # type: ignore[no-untyped-def]
    (f,) = [f for f in run_end_findings(end) if f.kind == FindingKind.JOB_FAILED]
    return f


def test_timeout_names_the_rank_behind() -> None:
    # rank 1 finished 5 steps, rank 0 finished 8 and timed out in step 8; torchrun killed 1
    end = RunEnd(
        ends=(
            RankEnd(0, 8, 9_000, False, error_ns=9_000, error=TIMEOUT),
            RankEnd(1, 5, 5_000, False),
        ),
        exit_code=1,
    )
    f = _failed(end)
    assert f.ranks == [1] and f.steps == [8]
    assert f.message.startswith(
        "rank 1 never reached step 8 (finished 5): rank 0's collective "
        "timed out waiting for it in step 8"
    )
    assert "failed first" not in f.message
    m = f.metrics
    assert (m.first_rank, m.how, m.waited_for, m.waited_for_evidence) == (
        0,
        "timeout",
        [1],
        "steps",
    )


def test_timeout_names_the_rank_outside_the_collective() -> None:
    # both ranks finished 8 steps (as in hang2); rank 1's stack is outside any collective
    waiting = ThreadStack(
        "MainThread", True, (Frame("all_reduce", LIB, 3245), Frame("<module>", "/job/job.py", 20))
    )
    idle = ThreadStack("MainThread", True, (Frame("<module>", "/job/job.py", 17),))
    stacks = (
        RankStacks("a", 0, 1, 8, (waiting,), {}, None, "off"),
        RankStacks("b", 1, 1, 8, (idle,), {}, None, "off"),
    )
    end = RunEnd(
        ends=(
            RankEnd(0, 8, 9_000, False, error_ns=9_000, error=TIMEOUT),
            RankEnd(1, 8, 5_000, False),
        ),
        stacks=stacks,
        exit_code=1,
    )
    f = _failed(end)
    assert f.ranks == [1]
    assert f.message.startswith("rank 1 never entered all_reduce (stacks): rank 0's")
    assert f.metrics.waited_for_evidence == "stacks"


def test_timeout_without_evidence_says_so() -> None:
    end = RunEnd(
        ends=(
            RankEnd(0, 8, 9_000, False, error_ns=9_000, error=TIMEOUT),
            RankEnd(1, 8, 5_000, False),
        ),
        exit_code=1,
    )
    f = _failed(end)
    assert f.ranks == [0] and f.metrics.waited_for is None
    assert "a peer never arrived; the run does not record which" in f.message


def test_hang_root_gets_the_first_remedy() -> None:
    # hang1's stacks as recorded: rank 0 inside all_reduce, rank 1 at job.py:17 (sleeping)
    from gpudiag.analysis.model.diagnosis import Mode, RunSummary, Shares
    from gpudiag.analysis.remedies.advice import recommend

    waiting = ThreadStack(
        "MainThread", True, (Frame("all_reduce", LIB, 3245), Frame("<module>", "/job/job.py", 20))
    )
    idle = ThreadStack("MainThread", True, (Frame("<module>", "/job/job.py", 17),))
    stacks = (
        RankStacks("a", 0, 1, 8, (waiting,), {}, None, "off"),
        RankStacks("b", 1, 1, 8, (idle,), {}, None, "off"),
    )
    end = RunEnd(ends=(RankEnd(0, 8, 9_000, False), RankEnd(1, 8, 5_000, False)), stacks=stacks)
    findings = run_end_findings(end)
    run = RunSummary(2, 2, 4, 80, 90, Shares(1.0, 0.0, 0.0, 0.0), 0.0, 0.0, Mode.TELEMETRY)
    (rec,) = recommend(run, [], [], findings)
    assert rec.id == "hang-rank-1" and rec.estimated_gain_ns is None
    assert rec.title == "Find why rank 1 never entered all_reduce"
    assert "Rank 1 was in <module> (job.py:17) while rank 0 waited" in rec.detail
