"""Issue 11: cross-rank verdicts on cases whose answer is known by construction.

Real gloo jobs with injected, measured effects: a rank that stalls every 4th step seen in a
6-step profiler window; a rank that enters each step late, profiled for one step; 2-stage
GPipe pipelines with 2 and 8 micro-batches whose receive waits the job measures with its
own clock. And the shared all-to-all trace, which must get no DDP remedy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import job_env
from noisy_host import TEARDOWN_CRASH

import gpudiag
from gpudiag.analysis.model.diagnosis import StepBreakdown
from gpudiag.analysis.run.whatif import what_if
from gpudiag.analysis.stragglers.detect import find_stragglers

pytest.importorskip("torch")

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MS = 1_000_000


def torchrun(tmp: Path, nproc: int, *args: str) -> Path:
    """Run a job under torchrun (gloo, CPU); its own traces land in ``tmp``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *args,
    ]
    for _ in range(2):
        r = subprocess.run(
            cmd, env=job_env(), capture_output=True, text=True, timeout=300, check=False, cwd=tmp
        )
        traces = list(tmp.rglob("*.json.gz"))
        # a rare gloo/Kineto abort at interpreter exit, after every trace was written
        if r.returncode == 0 or (TEARDOWN_CRASH in r.stderr and len(traces) == nproc):
            return tmp
        for t in traces:
            t.unlink()
    raise AssertionError(r.stderr[-3000:])


@pytest.mark.slow
def test_periodic_stall_in_a_six_step_window_is_named_not_called_persistent(tmp_path):
    # rank 1 sleeps 1 s in every 4th step (3, 7, 11); the profiler records steps 3-8.
    # A stall is named when it stands 3.5 robust standard deviations above the excesses of
    # the window. With six CPU hogs beside the job on 2 cores that SD measured 88-91 ms
    # (limit 307-319 ms; 20-55 ms on a quiet host, 80 ms a step); CI, at 243 ms a step,
    # missed a 0.5 s stall on both tries (read as a late-arrival straggler). 1 s stands
    # clear of that; a run that misses still runs once more, in a fresh directory.
    for attempt in range(2):
        out = tmp_path / f"run{attempt}"
        out.mkdir()
        torchrun(
            out,
            2,
            "-m",
            "gpudiag.demo.train",
            "--steps",
            "12",
            "--batch",
            "1024",
            "--pin",
            "--profile-dir",
            str(out),
            "--profile-wait",
            "2",
            "--profile-active",
            "6",
            "--sleep-rank",
            "1",
            "--sleep-s",
            "1.0",
            "--sleep-every",
            "4",
        )
        d = gpudiag.analyze(out, jobs=1)
        found = [f for f in d.findings if f.kind == "straggler"]
        if [f.persistent for f in found] == [False]:
            break
    assert sorted({s.step for s in d.steps}) == [3, 4, 5, 6, 7, 8]
    (f,) = [f for f in d.findings if f.kind == "straggler"]
    assert f.ranks == [1] and f.persistent is False and f.steps == [3, 7]
    assert "stalled in 2 of 6 profiled steps (3 and 7" in f.message
    assert "too few steps to tell persistent from periodic" in f.message
    assert 0.85e9 < f.metrics.median_excess_ns < 1.3e9  # the injected 1 s
    # rank 0 waits ~1 s at each of the 2 stalls, once: DDP's two buckets' all-reduces run
    # side by side on gloo's threads and wait for rank 1 together (summed, it read ~4 s)
    assert 1.7e9 < f.wait_caused_ns < 2.6e9, f.wait_caused_ns
    assert d.collectives.per_rank["0"].sync_wait_ns < 2.6e9
    assert 0 <= f.metrics.step_time_ns_if_median_speed <= f.metrics.step_time_ns_median


@pytest.mark.slow
def test_late_rank_is_named_from_one_profiled_step(tmp_path):
    # 4 ranks; rank 2 sleeps 0.3 s before each forward; one step profiled
    torchrun(tmp_path, 4, str(SCRIPTS / "late_rank.py"), "--out", str(tmp_path))
    d = gpudiag.analyze(tmp_path, jobs=1)
    assert d.run.ranks == 4 and d.run.steps == 1
    (f,) = [f for f in d.findings if f.kind == "straggler"]
    assert f.ranks == [2] and f.metrics.source == "late_arrival"
    assert f.cause == "host"
    late = d.collectives.late_arrival
    # everyone waits for it at the step's first collective; on a busy host the later
    # ones are a race, so the waiting, not the count, names it
    assert late["2"].waited_ns >= 0.5 * sum(v.waited_ns for v in late.values())
    assert f.metrics.wait_share >= 0.5
    assert 0.2e9 < f.metrics.waited_ns_per_step < 0.5e9  # the injected 0.3 s
    (comm,) = [f for f in d.findings if f.kind == "comm_bound"]
    assert "waiting for the straggler (rank 2)" in comm.message


@pytest.mark.slow
def test_balanced_run_names_no_late_rank(tmp_path):
    # the same job with no injected delay: nothing above the noise
    torchrun(tmp_path, 4, str(SCRIPTS / "late_rank.py"), "--out", str(tmp_path), "--late-s", "0")
    d = gpudiag.analyze(tmp_path, jobs=1)
    assert d.run.ranks == 4
    # 4 ranks on 2 cores: a rank the scheduler descheduled for tens of ms really is late,
    # but nothing comes near the injected 300 ms (a third of it at most)
    late = [f for f in d.findings if f.kind == "straggler"]
    assert all(getattr(f.metrics, "waited_ns_per_step", 0) < 100 * MS for f in late), late


@pytest.fixture(scope="module", params=[2, 8])
def gpipe(request, tmp_path_factory) -> tuple[int, Path]:
    tmp = tmp_path_factory.mktemp(f"gpipe_m{request.param}")
    torchrun(
        tmp, 2, str(SCRIPTS / "pipeline_gpipe.py"), "--out", str(tmp), "--micro", str(request.param)
    )
    return request.param, tmp


@pytest.mark.slow
def test_pipeline_bubble_matches_the_jobs_own_receive_waits(gpipe):
    m, tmp = gpipe
    d = gpudiag.analyze(tmp, jobs=1)
    pipe = d.collectives.pipeline
    assert (pipe.stages, pipe.micro_batches, pipe.schedule) == (2, m, "gpipe")
    assert pipe.ideal_bubble_ratio == pytest.approx(1 / (m + 1))
    for rank in (0, 1):
        truth = {
            t["step"]: t for t in json.loads((tmp / f"truth-{rank}.json").read_text())["steps"]
        }
        mine = [s for s in d.steps if s.rank == rank]
        want = sum(truth[s.step]["recv_wait_s"] for s in mine) / sum(
            truth[s.step]["period_s"] for s in mine
        )
        assert pipe.stage_bubble_ratio[str(rank)] == pytest.approx(want, abs=0.05), (rank, want)


@pytest.mark.slow
def test_pipeline_waits_are_the_bubble_not_comm_or_stragglers(gpipe):
    m, tmp = gpipe
    d = gpudiag.analyze(tmp, jobs=1)
    kinds = {f.kind for f in d.findings}
    assert "straggler" not in kinds and "comm_bound" not in kinds
    ids = [r.id for r in d.recommendations]
    assert not {"comm-overlap", "grad-accumulation", "grad-compression"} & set(ids)
    if m == 2:  # bubble 1/3: more micro-batches is the first remedy
        assert "pipeline_bubble" in kinds and ids[0] == "pipeline-microbatches"


def test_all_to_all_gets_no_ddp_gradient_remedy(kineto_sets):
    # sampled_2rank_a2a is event-sampled (~1.4% of its operators kept): its split is
    # withheld (issue 20, evidence first), so it names no communication remedy at all now;
    # what must hold is that its all-to-all never draws a DDP gradient remedy
    d = gpudiag.analyze(kineto_sets / "sampled_2rank_a2a", jobs=1)
    ids = {r.id for r in d.recommendations}
    # TorchRec's embedding all-to-all (KJT, FBGEMM in the trace) is never MoE (issue 20);
    # the embedding remedy itself is withheld with the split (a100x8_r3 gets it)
    assert "moe-all-to-all" not in ids
    assert not {"comm-overlap", "grad-accumulation", "grad-compression"} & ids
    assert d.verdict is not None and d.verdict.bottleneck == "unknown"


def test_amd_trace_gets_rccl_advice(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "mi300x_ddp8_r0_rccl", jobs=1)
    ids = [r.id for r in d.recommendations]
    assert "rccl-tuning" in ids and "nccl-tuning" not in ids
    (tune,) = [r for r in d.recommendations if r.id == "rccl-tuning"]
    assert "xGMI" in tune.detail and "NVLink" not in tune.detail


def test_overlapping_remedies_say_so(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "mi300x_ddp8_r0_rccl", jobs=1)
    grad = {r.id: r for r in d.recommendations}
    assert "grad-accumulation" in grad["comm-overlap"].overlaps_with
    assert d.what_if.if_all_ns <= min(d.what_if.if_comm_overlapped_ns, d.what_if.if_no_data_wait_ns)


def test_what_ifs_stay_between_zero_and_the_current_step():
    # a property over 300 random synchronous runs: 2-8 ranks, 1-12 steps, random parts
    for seed in range(300):
        rng = np.random.default_rng(seed)
        ranks, n = int(rng.integers(2, 9)), int(rng.integers(1, 13))
        steps = []
        for s in range(n):
            for r in range(ranks):
                parts = rng.integers(0, 50 * MS, size=4)
                if rng.random() < 0.2:
                    parts[int(rng.integers(0, 4))] += int(rng.integers(0, 2_000 * MS))
                c, w, d, o = (int(x) for x in parts)
                steps.append(StepBreakdown(r, s, s * 10**10, c + w + d + o, c, w, d, o, 0))
        found = find_stragglers(steps)
        wi = what_if(steps, found)
        for v in (
            wi.if_comm_overlapped_ns,
            wi.if_no_data_wait_ns,
            wi.if_straggler_at_median_speed_ns,
            wi.if_all_ns,
        ):
            assert v is None or 0 <= v <= wi.step_time_ns, (seed, wi)
        for f in found:
            m = f.metrics
            # a persistent straggler's on the mean step (its cost's base), a stall's the median
            now = m.step_time_ns_mean if f.persistent else m.step_time_ns_median
            assert 0 <= m.step_time_ns_if_median_speed <= now, seed
