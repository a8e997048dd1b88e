"""Issue 21: which rank failed first, from how each rank ended; the verdict leads with it."""

from __future__ import annotations

from gpudiag.analysis.hangs.failure import classify, failures
from gpudiag.analysis.hangs.runend import run_end_findings
from gpudiag.analysis.model.diagnosis import Mode, RunSummary, Shares
from gpudiag.analysis.model.kinds import FindingKind
from gpudiag.analysis.verdict import verdict
from gpudiag.traces.runfiles.runend import RankEnd, RunEnd, parse_fault_log

FAULT = """Fatal Python error: Aborted

Thread 0x00007efc0e6296c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/site-packages/gpudiag/collect/hangdump.py", line 128 in run

Thread 0x00007efc2dea2b80 (most recent call first):
  File "/site-packages/gpudiag/collect/patches.py", line 797 in wrapper
  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 72 in main
  File "/job/train.py", line 83 in <module>

Extension modules: numpy._core._multiarray_umath (total: 1)
"""


def two_rank_run() -> RunSummary:
    return RunSummary(2, 2, 10, 1, 1, Shares(1.0, 0.0, 0.0, 0.0), 0.0, 0.0, Mode.TELEMETRY)


RESET = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:7396: Connection reset by peer."
TIMEOUT = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms"


def test_fault_log_parse() -> None:
    title, threads = parse_fault_log(FAULT)
    assert title == "Aborted" and len(threads) == 2
    assert threads[1].frames[0].name == "wrapper"
    assert threads[1].frames[-1].name == "<module>"


def test_abort_is_first_then_the_peer_that_lost_it() -> None:
    _, threads = parse_fault_log(FAULT)
    ends = [
        RankEnd(0, 7, 2_000, False, error_ns=2_000, error=RESET),
        RankEnd(1, 7, 1_000, False, fault="Aborted", fault_threads=threads),
    ]
    first, second = failures(ends)
    assert (first.rank, first.step, first.how, first.collective) == (1, 7, "signal", "all_reduce")
    assert first.where == "main (train.py:72) ← <module> (train.py:83)"
    assert (second.rank, second.how) == (0, "connection")


def test_vanished_rank_is_first_when_peers_lost_it_but_not_beside_a_timeout() -> None:
    vanished = RankEnd(1, 4, 500, False)
    assert failures([RankEnd(0, 4, 900, False, error_ns=900, error=RESET), vanished])[0].rank == 1
    # a timeout on rank 0: rank 1 was stopped after it (torchrun ends the others)
    got = failures([RankEnd(0, 4, 900, False, error_ns=900, error=TIMEOUT), vanished])
    assert [(f.rank, f.how) for f in got] == [(0, "timeout"), (1, "killed")]


def test_mismatch_line_and_normal_end() -> None:
    mm = "RuntimeError: Received data size doesn't match expected size: collective mismatch?"
    assert classify(RankEnd(0, 3, 1, False, error_ns=1, error=mm)).how == "mismatch"
    assert classify(RankEnd(0, 3, 1, True)) is None


def test_failure_leads_the_verdict() -> None:
    _, threads = parse_fault_log(FAULT)
    end = RunEnd(
        ends=(
            RankEnd(0, 7, 2_000, False, error_ns=2_000, error=RESET),
            RankEnd(1, 7, 1_000, False, fault="Aborted", fault_threads=threads),
        ),
        exit_code=1,
    )
    (f,) = run_end_findings(end)
    assert f.kind == FindingKind.JOB_FAILED and f.ranks == [1] and f.steps == [7]
    run = two_rank_run()
    v = verdict(run, [f])
    assert v.bottleneck == "failure" and v.ranks == [1]
    assert v.headline.startswith("failed: rank 1 failed first, in step 7: it died of a fatal")


def test_interrupted_run() -> None:
    end = RunEnd(
        ends=(RankEnd(0, 5, 1, False, error_ns=1, error="KeyboardInterrupt: "),),
        exit_code=1,
        interrupted=True,
    )
    (f,) = run_end_findings(end)
    v = verdict(two_rank_run(), [f])
    assert v.interrupted and v.headline.startswith("interrupted in step 5 (Ctrl-C); until then: ")
    assert "interrupted (Ctrl-C) in step 5" in f.message


def test_stacks_alone_name_the_rank_outside_the_collective() -> None:
    from gpudiag.analysis.hangs.cases import hang_cases
    from gpudiag.traces.runfiles.flightrec import Frame, RankStacks, ThreadStack

    lib = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    waiting = ThreadStack(
        "MainThread",
        True,
        (
            Frame("all_reduce", lib, 3245),
            Frame("train_step", "/job/train.py", 57),
            Frame("main", "/job/train.py", 88),
        ),
    )
    stuck = ThreadStack(
        "MainThread",
        True,
        (
            Frame("sleep", "/usr/lib/python3.11/time.py", 1),
            Frame("load_batch", "/job/data.py", 12),
            Frame("main", "/job/train.py", 80),
        ),
    )
    stacks = [
        RankStacks("a", 0, 1, 5, (waiting,), {}, None, "off"),
        RankStacks("b", 1, 1, 5, (stuck,), {}, None, "off"),
    ]
    (case,) = hang_cases(None, stacks, world=3)
    assert case.culprits == (1,) and case.waiting == (0,) and case.op == "all_reduce"
    assert case.where[1] == "load_batch (data.py:12) ← main (train.py:80)"
    assert case.evidence == "stacks" and case.incomplete  # rank 2 never answered
    assert "no answer from rank 2" in case.message
