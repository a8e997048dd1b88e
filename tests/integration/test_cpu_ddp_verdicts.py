"""Real 2-rank CPU DDP runs (gloo + torch.profiler) in two variants whose verdicts are known.

Each job is the shipped demo (gpudiag/demo/train.py) under torchrun, recording its own
profiler traces; gpudiag then analyses them like any user's traces. The balanced job's
verdict (compute-bound, no flag) is checked on its run under ``gpudiag run``, in
tests/integration/test_injected_stragglers.py.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import job_env, run_cli
from noisy_host import TEARDOWN_CRASH

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

VARIANTS = {
    # 2 ms a sample, 128 a batch: 256 ms of input wait a step against a few ms of compute, so
    # the data-wait share stays far above 0.5 on a loaded host (0.05 ms a sample for a batch
    # of 1024 gave 0.319 once: compute grows with the load, a sleep does not shrink)
    "slow_data": ["--slow-data", "0.002", "--batch", "128"],
    "comm_heavy": ["--batch", "16", "--hidden", "2048", "--layers", "4"],
}


def run_variant(tmp_path_factory, name: str) -> Path:
    env = job_env()
    d = tmp_path_factory.mktemp(name)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "gpudiag.demo.train",
        "--steps",
        "9",
        "--pin",
        "--profile-dir",
        str(d),
        *VARIANTS[name],
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, check=False)
    if r.returncode != 0 and TEARDOWN_CRASH in r.stderr:  # see tests/noisy_host.py
        shutil.rmtree(d)
        d.mkdir()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    return {name: run_variant(tmp_path_factory, name) for name in VARIANTS}


def diagnosis_of(path: Path) -> dict:
    r = run_cli("analyze", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def kinds(doc: dict) -> set[str]:
    return {f["kind"] for f in doc["findings"]}


def test_slow_dataset_is_data_bound_and_flagged(traces):
    doc = diagnosis_of(traces["slow_data"])
    shares = doc["run"]["shares"]
    assert shares["data_wait"] > 0.5
    assert shares["data_wait"] == max(shares.values())
    data = next(f for f in doc["findings"] if f["kind"] == "data_bound")
    assert data["ranks"] == [0, 1] and "DataLoader.__next__" in data["message"]
    assert "idle_ratio" in kinds(doc)


def test_many_parameters_little_compute_is_comm_bound_and_flagged(traces):
    doc = diagnosis_of(traces["comm_heavy"])
    shares = doc["run"]["shares"]
    # twice the comm-bound threshold (0.1): the verdict, not a borderline share
    assert shares["comm_wait"] > 0.2
    assert shares["comm_wait"] > max(shares["data_wait"], shares["other"])
    comm = next(f for f in doc["findings"] if f["kind"] == "comm_bound")
    assert comm["ranks"] == [0, 1] and "gloo:all_reduce" in comm["message"]
    # non-compute idle here is comm-wait plus the rest, near the 30% line on a 2-core host
    # (two full-suite runs measured comm-wait 22-23% and no idle flag; alone it was flagged):
    # the flag must follow the measured idle when it is clearly above or below the line
    idle = doc["run"]["idle_ratio"]
    if idle > 0.35:
        assert "idle_ratio" in kinds(doc), idle
    elif idle < 0.25:
        assert "idle_ratio" not in kinds(doc), idle
    assert "data_bound" not in kinds(doc)
