"""Collective mismatches recognised from the ranks' real error lines (tests/data/mismatch).

Truth from outside gpudiag: the lines torch and gloo printed for a known injected mismatch
(rank 0 all-reduces 1000 floats, rank 1 500); see tests/data/mismatch/README.md.
"""

from __future__ import annotations

import testpaths

from gpudiag.analysis.hangs.failure import classify, mismatch_words
from gpudiag.analysis.hangs.runend import run_end_findings
from gpudiag.analysis.model.diagnosis import Mode, RunSummary, Shares
from gpudiag.analysis.model.kinds import FindingKind
from gpudiag.analysis.verdict import verdict
from gpudiag.traces.runfiles.runend import RankEnd, RunEnd, parse_fault_log

DATA = testpaths.DATA / "mismatch"
PGW = (DATA / "pgwrapper_rank0_error.txt").read_text().strip()
GLOO = (DATA / "gloo_sz1_stderr.txt").read_text().strip()
RESET = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:51638: Connection reset by peer."


def test_torch_fingerprint_line_gives_the_sizes_and_ranks() -> None:
    assert mismatch_words(PGW) == "all_reduce sizes [1000] vs [500] (rank 0 vs rank 1)"
    other = PGW.replace(
        "OpType=ALLREDUCE, TensorShape=[500]", "OpType=BROADCAST, TensorShape=[500]"
    )
    assert mismatch_words(other) == "all_reduce vs broadcast (rank 0 vs rank 1)"


def test_gloo_size_line_gives_the_bytes() -> None:
    assert mismatch_words(GLOO) == "received 1000 bytes where 500 were expected"
    assert mismatch_words(RESET) is None


def test_mismatch_error_leads_the_verdict_as_a_mismatch() -> None:
    # rank 0 raised torch's fingerprint error in step 7; rank 1 lost its peer after
    end = RunEnd(
        ends=(
            RankEnd(0, 7, 1_000, False, error_ns=1_000, error=PGW),
            RankEnd(1, 7, 2_000, False, error_ns=2_000, error=RESET),
        ),
        exit_code=1,
    )
    assert classify(end.ends[0]).how == "mismatch"  # type: ignore[union-attr]
    (f,) = run_end_findings(end)
    assert f.kind == FindingKind.JOB_FAILED and f.metrics.mismatch is not None
    run = RunSummary(2, 2, 10, 1, 1, Shares(1.0, 0.0, 0.0, 0.0), 0.0, 0.0, Mode.TELEMETRY)
    v = verdict(run, [f])
    assert v.bottleneck == "mismatch"
    assert v.headline.startswith(
        "collective mismatch: all_reduce sizes [1000] vs [500] (rank 0 vs rank 1), in step 7"
    )


def test_abort_inside_a_collective_says_what_it_may_be() -> None:
    # sz1 as recorded: no stderr in the run directory, only rank 1's fault log (abort inside
    # all_reduce) and rank 0's lost peer; the verdict stays a failure, with the hint
    fault = (
        "Fatal Python error: Aborted\n\nThread 0x00007fb998c6fb80 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
        "line 3252 in all_reduce\n"
        '  File "/tmp/trial/job.py", line 30 in <module>\n'
    )
    _, threads = parse_fault_log(fault)
    end = RunEnd(
        ends=(
            RankEnd(0, 8, 2_000, False, error_ns=2_000, error=RESET),
            RankEnd(1, 8, 1_000, False, fault="Aborted", fault_threads=threads),
        ),
        exit_code=1,
    )
    (f,) = run_end_findings(end)
    assert f.ranks == [1] and f.metrics.how == "signal"
    assert "inside all_reduce" in f.message and "a possible collective mismatch" in f.message


def test_mismatch_gets_its_remedy_first() -> None:
    from gpudiag.analysis.remedies.advice import recommend

    end = RunEnd(ends=(RankEnd(0, 7, 1_000, False, error_ns=1_000, error=PGW),), exit_code=1)
    run = RunSummary(2, 2, 10, 1, 1, Shares(1.0, 0.0, 0.0, 0.0), 0.0, 0.0, Mode.TELEMETRY)
    (rec,) = recommend(run, [], [], run_end_findings(end))
    assert rec.id == "collective-mismatch"
    assert rec.detail.startswith("all_reduce sizes [1000] vs [500] (rank 0 vs rank 1). ")
