"""Issue 12: nothing gpudiag does hurts the job.

Every test injects a fault into a real 2-rank gloo job under `gpudiag run` and checks
the job's exit code and output against the same job run directly: an exception in each
rank hook (``GPUDIAG_FAULT=hook:…``); a trace export, a disk that fills up and an exit hook
failing in one run (three losses that leave each other's evidence); an output directory the
ranks cannot write, NVML losing a GPU or blocking mid-run, gpudiag itself SIGKILLed, and jobs
that spawn processes or exec another program. gpudiag's own losses land in the manifest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_runner import ROOT, job_env
from run_helpers import DEMO, TORCHRUN, run_direct

from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import load_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

STEPS = 8
JOB = [
    *TORCHRUN,
    str(DEMO),
    "--steps",
    str(STEPS),
    "--hidden",
    "64",
    "--layers",
    "2",
    "--batch",
    "16",
    "--print-loss",
]
WINDOW = "2:5"
SLEEP_S = 0.4  # the killed run: rank 0 sleeps in each step, so the job outlives the kill


@pytest.fixture(scope="module")
def direct_runs() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """The job run directly, once per distinct command (the tests share them)."""
    return {}


# Options that change neither the job's exit nor what it prints (its loss at every step):
# the profiler window it opens itself, fork DataLoader workers (the same batches, in
# order) and a rank's sleep in each step. The job with them prints what the job without
# them prints, directly as under gpudiag, so their runs compare against the one direct run
# of the job without them.
SAME_OUTPUT = (
    ("--profile-from", "3"),
    ("--workers", "2"),
    ("--sleep-rank", "0"),
    ("--sleep-s", str(SLEEP_S)),
)


def _direct(cache: dict[tuple[str, ...], Any], cmd: list[str]) -> subprocess.CompletedProcess[str]:
    for opt in SAME_OUTPUT:
        n = len(opt)
        cmd = next(
            ([*cmd[:i], *cmd[i + n :]] for i in range(len(cmd)) if tuple(cmd[i : i + n]) == opt),
            cmd,
        )
    key = tuple(cmd)
    if key not in cache:
        cache[key] = run_direct(cmd)
        assert cache[key].returncode == 0, cache[key].stderr[-3000:]
    return cache[key]


def _gpudiag(out: Path, cmd: list[str], fault: str = "", window: str = WINDOW) -> Any:
    env = {"GPUDIAG_FAULT": fault} if fault else None
    from cli_runner import run_cli

    return run_cli(
        "run",
        "--out",
        str(out),
        "--no-analyze",
        "--profile-steps",
        window,
        "--",
        *cmd,
        env=env,
        cwd=ROOT,
        timeout=180,
    )


def _same_as_direct(r: Any, direct: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == direct.returncode, r.stderr[-3000:]
    assert r.stdout == direct.stdout


def _manifest(out: Path) -> rundir.RunManifest:
    return rundir.read_manifest(out / "manifest.json")


# -- an exception inside each hook -----------------------------------------------------

HOOK_FAULTS = {
    # site: (job arguments, steps every rank still reports). The data, backward and comm
    # wrappers' faults are checked in-process (tests/unit/collect/rank/test_hook_faults.py:
    # the job's call is unchanged); a real job checks one wrapped site end to end (the step)
    # and the two profiler sites, which only a real torch.profiler reaches.
    "hook:step@3": ([], [0, 1, 2]),
    "hook:profiler": ([], [0]),  # fails right after opening the window (warm-up, step 1)
    "hook:job_profiler": (["--profile-from", "3"], [0, 1, 2]),
}


@pytest.mark.parametrize("fault", sorted(HOOK_FAULTS))
def test_exception_in_a_hook(tmp_path: Path, direct_runs: Any, fault: str) -> None:
    # GIVEN a rank hook that raises at the fault site
    job_args, steps = HOOK_FAULTS[fault]
    cmd = [*JOB, *job_args]
    out = tmp_path / "run"
    r = _gpudiag(out, cmd, fault)
    # THEN the job cannot tell
    _same_as_direct(r, _direct(direct_runs, cmd))
    # AND each rank said once that it stopped, and the manifest says why
    assert r.stderr.count("instrumentation disabled after an error") == 2, r.stderr[-3000:]
    m = _manifest(out)
    site = fault.split("@")[0]
    for rank in (0, 1):
        assert any(
            x.startswith(f"rank {rank}: InjectedFault: {site}") for x in m.diagnosis_incomplete
        )
    df = load_steps(out)
    for rank in (0, 1):
        assert sorted(df.loc[df["rank"] == rank, "step"]) == steps
    assert not m.sources["kineto"].captured
    assert "gpudiag's instrumentation" in m.sources["kineto"].reason
    assert not list((out / "ranks").glob("*.pt.trace.json.gz"))


def test_trace_export_exit_hook_and_telemetry_writes_failing_in_one_run(
    tmp_path: Path, direct_runs: Any
) -> None:
    # GIVEN three independent losses in one run: the trace export fails, telemetry writes
    # fail half-way (ENOSPC) during steps 3-5, and the exit hook raises
    out = tmp_path / "run"
    r = _gpudiag(out, JOB, "hook:save,write:enospc@3-5,hook:exit")
    # THEN the job cannot tell
    _same_as_direct(r, _direct(direct_runs, JOB))
    m = _manifest(out)
    # the window is lost, the telemetry outside steps 3-5 is not; the files hold whole records
    df = load_steps(out)
    for rank in (0, 1):
        assert sorted(df.loc[df["rank"] == rank, "step"]) == [0, 1, 2, 6, 7]
    # the ranks ran 8 steps, the 3 lost ones included
    assert m.extra["steps_per_rank"] == {"0": STEPS, "1": STEPS}
    # the window's own record (not saved, at step 5) went with the lost telemetry: the
    # manifest says so rather than guess from the steps that remain ("not reached")
    assert not m.sources["kineto"].captured
    reason = m.sources["kineto"].reason
    assert reason.startswith("window 2:5: no trace, and the record of what became of it"), reason
    assert "lost with the telemetry of steps 3-5 (every rank: OSError" in reason, reason
    # the ranks said it on stderr as it happened (two ranks write there at once, so lines
    # may interleave); each loss once per rank
    assert "trace of steps 2-4 not saved" in r.stderr
    assert r.stderr.count("telemetry write failed") == 2
    assert sum("at exit: InjectedFault" in x for x in m.diagnosis_incomplete) == 2
    for rank in (0, 1):
        assert any(
            re.match(rf"rank {rank}: telemetry lost \d+ records \(steps 3-5\): OSError", x)
            for x in m.diagnosis_incomplete
        ), m.diagnosis_incomplete


def test_hook_installation_failing(tmp_path: Path, direct_runs: Any) -> None:
    out = tmp_path / "run"
    r = _gpudiag(out, JOB, "hook:install")
    _same_as_direct(r, _direct(direct_runs, JOB))
    assert r.stderr.count("gpudiag: rank hook not installed (InjectedFault") == 2
    m = _manifest(out)
    assert not m.sources["telemetry"].captured
    for rank in (0, 1):
        want = f"rank {rank}: rank hook not installed: InjectedFault: hook:install"
        assert any(x.startswith(want) for x in m.diagnosis_incomplete), m.diagnosis_incomplete


# -- the output directory ---------------------------------------------------------------


def test_unwritable_rank_directory(tmp_path: Path, direct_runs: Any) -> None:
    # GIVEN a run directory whose ranks/ cannot be created (a file is in the way)
    out = tmp_path / "run"
    out.mkdir()
    (out / "ranks").write_text("in the way")
    r = _gpudiag(out, JOB)
    _same_as_direct(r, _direct(direct_runs, JOB))
    assert r.stderr.count("telemetry write failed") == 2
    m = _manifest(out)
    assert m.exit_code == 0
    assert not m.sources["telemetry"].captured
    assert "is not a directory" in m.sources["telemetry"].reason
    assert m.sources["conditions"].captured  # what does not need ranks/ still works


# -- NVML failing mid-run (the sampler's injected backend) ------------------------------


class NVMLError_GPUIsLost(Exception):  # named as pynvml names it
    pass


class FaultyNvml:
    """Two GPUs: GPU 0 is lost after ``lost_after`` utilisation reads; GPU 1's utilisation
    read ``block_at`` blocks for ``block_s`` seconds, and read ``hang_at`` until ``release``."""

    NVML_CLOCK_SM = 1

    def __init__(self, lost_after: int, block_at: int, block_s: float, hang_at: int) -> None:
        self.lost_after, self.block_at, self.block_s = lost_after, block_at, block_s
        self.hang_at = hang_at
        self.reads = {0: 0, 1: 0}
        self.release = threading.Event()
        self.lost = False

    def nvmlInit(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _check(self, h: int) -> None:
        if h == 0 and self.lost:
            raise NVMLError_GPUIsLost("GPU is lost")

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self._check(h)
        self.reads[h] += 1
        if h == 0 and self.reads[0] >= self.lost_after:
            self.lost = True
        if h == 1 and self.reads[1] == self.block_at:
            time.sleep(self.block_s)
        if h == 1 and self.reads[1] == self.hang_at:
            self.release.wait()
        return SimpleNamespace(gpu=90, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self._check(h)
        return SimpleNamespace(used=1, total=2)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._check(h)
        return 100_000

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        self._check(h)
        return 1500

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        self._check(h)
        return 50


def _launch_in_process(
    tmp_path: Path, nvml: Any, capfd: pytest.CaptureFixture[str]
) -> tuple[Any, Any, float]:
    """``launcher.run`` in this process with a fake NVML; the job's streams are captured."""
    from gpudiag.collect.launch import launcher
    from gpudiag.collect.launch.run_setup import RunOptions

    env = job_env()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        opts = RunOptions(
            list(JOB),
            out=tmp_path / "run",
            profile_steps=WINDOW,
            nvml_backend=nvml,
            nvml_interval_s=0.05,
        )
        t0 = time.monotonic()
        res = launcher.run(opts)
        took = time.monotonic() - t0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return res, capfd.readouterr(), took


def test_nvml_gpu_lost_then_slow_then_blocked_mid_run(
    tmp_path: Path, direct_runs: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # GIVEN NVML that loses GPU 0 after 10 reads, blocks 1.5 s on GPU 1's 15th read, and
    # never returns from GPU 1's 25th (until the test releases it, after the run)
    nv = FaultyNvml(lost_after=10, block_at=15, block_s=1.5, hang_at=25)
    try:
        res, streams, took = _launch_in_process(tmp_path, nv, capfd)
    finally:
        nv.release.set()
    direct = _direct(direct_runs, JOB)
    # THEN the job cannot tell
    assert res.exit_code == direct.returncode, streams.err[-3000:]
    assert streams.out == direct.stdout
    # AND the manifest says what was lost, once each; the samples after it are null
    inc = res.manifest.diagnosis_incomplete
    assert sum("GPU 0 (GPU-0) stopped answering" in x and "GPU is lost" in x for x in inc) == 1
    assert sum(x.startswith("NVML sampling slow: one round of NVML calls took") for x in inc) == 1
    path = rundir.nvml_path(res.run_dir, res.manifest.hosts[0])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    gpu0 = [x for x in lines if x.get("gpu_uuid") == "GPU-0"]
    assert gpu0[0]["util_ratio"] == 0.9
    assert gpu0[-1]["util_ratio"] is None and gpu0[-1]["temp_c"] is None
    assert res.manifest.sources["telemetry"].captured
    # AND gpudiag did not hang on the blocked call: it waited 5 s for the sampler, said so,
    # and finished
    assert sum("NVML sampler still blocked" in x for x in inc) == 1
    assert took < 90
    assert res.manifest.ended_ns is not None


# -- gpudiag killed -----------------------------------------------------------------------

KILL_DRIVER = textwrap.dedent(
    """
    import ctypes, json, os, signal, subprocess, sys, time
    from pathlib import Path

    # Become the subreaper, so the job orphaned by the kill is ours to wait for.
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    out, job_stdout, cmd = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    with open(job_stdout, "w") as f:
        g = subprocess.Popen([sys.executable, "-m", "gpudiag", "run", "--out", str(out),
                              "--no-analyze", "-q", "--", *cmd], stdout=f)
    steps = out / "ranks" / "rank-0.steps.jsonl"
    while not steps.exists() or steps.read_text().count('"type":"step"') < 3:
        assert g.poll() is None, "gpudiag ended early"
        time.sleep(0.05)
    child = json.loads((out / "manifest.json").read_text())["extra"]["child_pid"]
    os.kill(g.pid, signal.SIGKILL)
    g.wait()
    _, status = os.waitpid(child, 0)
    print(json.dumps({"job_exit": os.waitstatus_to_exitcode(status), "gpudiag": g.returncode}))
    """
)


def test_gpudiag_killed_the_job_runs_on(tmp_path: Path, direct_runs: Any) -> None:
    # killed after rank 0's third step: the job has ~2 s (5 steps of SLEEP_S) left to run on
    cmd = [*JOB, "--sleep-rank", "0", "--sleep-s", str(SLEEP_S)]
    direct = _direct(direct_runs, cmd)
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    out, job_out = tmp_path / "run", tmp_path / "job.out"
    r = subprocess.run(
        [sys.executable, str(driver), str(out), str(job_out), *cmd],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=180,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    # THEN gpudiag died by SIGKILL, the job ran to the end as it does alone
    assert res["gpudiag"] == -9
    assert res["job_exit"] == direct.returncode
    assert job_out.read_text() == direct.stdout
    # AND what gpudiag wrote stays valid: the launch manifest, whole telemetry lines
    m = _manifest(out)
    assert m.exit_code is None and m.ended_ns is None
    df = load_steps(out)
    for rank in (0, 1):
        assert sorted(df.loc[df["rank"] == rank, "step"]) == list(range(STEPS))
    for rank in (0, 1):
        last = rundir.steps_path(out, rank).read_text().splitlines()[-1]
        assert json.loads(last)["type"] == "exit"
    for line in (out / "conditions").glob("*.jsonl"):
        for x in line.read_text().splitlines():
            json.loads(x)


# -- jobs that start other processes -----------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    # one spawned worker and one spawned pool child: each imports torch, which costs the job
    # (run twice, directly and under gpudiag) more than any other step of it
    [["--workers", "2"], ["--workers", "1", "--worker-start", "spawn", "--mp-spawn", "1"]],
    ids=["fork-workers", "spawn-workers-and-pool"],
)
def test_job_with_worker_processes(tmp_path: Path, direct_runs: Any, extra: list[str]) -> None:
    cmd = [*JOB, *extra]
    out = tmp_path / "run"
    r = _gpudiag(out, cmd)
    _same_as_direct(r, _direct(direct_runs, cmd))
    m = _manifest(out)
    assert [x.rank for x in m.ranks] == [0, 1]  # workers and pool children are not ranks
    assert sorted(p.name for p in (out / "ranks").glob("*.steps.jsonl")) == [
        "rank-0.steps.jsonl",
        "rank-1.steps.jsonl",
    ]
    assert m.diagnosis_incomplete == []
    assert "rank_errors" not in m.extra
    df = load_steps(out)
    for rank in (0, 1):
        assert sorted(df.loc[df["rank"] == rank, "step"]) == list(range(STEPS))
    assert m.sources["kineto"].captured
    assert m.sources["conditions"].captured
    assert m.conditions is not None and m.conditions.samples >= 1


EXEC_JOB = """
import os, sys, torch
torch.manual_seed(0)
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(4):
    m(torch.ones(1, 2)).sum().backward(); o.step()
print("before exec", round(m.weight.detach().sum().item(), 6), flush=True)
then = '''
import sys, torch
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(4):
    m(torch.ones(1, 2)).sum().backward(); o.step()
print("after exec", flush=True)
sys.exit(5)
'''
os.execv(sys.executable, [sys.executable, "-c", then])
"""


@pytest.fixture(scope="module")
def exec_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Any]:
    """The exec job's command and its run without gpudiag (once for both cases)."""
    script = tmp_path_factory.mktemp("exec_job") / "job.py"
    script.write_text(EXEC_JOB)
    cmd = [sys.executable, str(script)]
    direct = run_direct(cmd)
    assert direct.returncode == 5, direct.stderr[-3000:]
    return cmd, direct


@pytest.mark.parametrize("fault", ["", "hook:exec"])
def test_job_that_execs_another_program(tmp_path: Path, exec_job: Any, fault: str) -> None:
    # GIVEN a job that trains 4 steps, then execs a program that trains 4 more and exits 5
    cmd, direct = exec_job
    out = tmp_path / "run"
    r = _gpudiag(out, cmd, fault, window="6:8")
    _same_as_direct(r, direct)
    recs = [json.loads(x) for x in rundir.steps_path(out, 0).read_text().splitlines()]
    steps = [x["step"] for x in recs if x["type"] == "step"]
    if fault:
        # THEN a failing exec hook leaves the new image alone; the first image's steps stay
        assert steps == [0, 1, 2, 3]
        assert "hook:exec" in " ".join(_manifest(out).diagnosis_incomplete)
        return
    # THEN the exec'd image continues the rank: one segment, steps 0-7, its window saved
    assert steps == list(range(8))
    assert sum(x["type"] == "header" for x in recs) == 1
    assert [x["step"] for x in recs if x["type"] == "exec"] == [4]
    assert recs[-1] == {**recs[-1], "type": "exit", "steps": 8}
    m = _manifest(out)
    assert m.exit_code == 5
    assert m.sources["kineto"].captured
    assert m.diagnosis_incomplete == []
