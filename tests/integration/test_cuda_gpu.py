"""Issues 12 and 15 on a CUDA GPU: the profiler handover with CUPTI, run conditions from NVML.

One rank on one GPU (``torchrun --nproc-per-node 1``), each job run directly and under
`gpudiag run`: the same exit code and output; the job's own CUDA traces hold kernels;
gpudiag's cut window keeps its kernels; the run conditions read the real GPU, and the
job's own process on it is not counted as another process. Skipped without CUDA/NVML.
Run it where a GPU is: ``python -m pytest -q -m gpu tests/integration/test_cuda_gpu.py``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from run_helpers import DEMO, run_direct, run_gpudiag

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

JOB = [
    "torchrun",
    "--standalone",
    "--nproc-per-node",
    "1",
    str(DEMO),
    "--steps",
    "12",
    "--print-loss",
    "--batch",
    "4096",
    "--hidden",
    "1024",
]


@pytest.fixture(scope="module", autouse=True)
def _gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception as e:
        pytest.skip(f"NVML unusable: {e}")


def _trace(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def _kernels(path: Path) -> int:
    return sum(1 for e in _trace(path) if e.get("cat") == "kernel")


def _both(tmp_path: Path, args: list[str]) -> tuple[Path, Path, dict[str, Any]]:
    dirs = {}
    outs = {}
    for kind in ("direct", "gpudiag"):
        d = tmp_path / kind
        d.mkdir()
        cmd = [*JOB, *(a.replace("DIR", str(d)) for a in args)]
        if kind == "direct":
            outs[kind] = run_direct(cmd, timeout=300)
        else:
            outs[kind] = run_gpudiag(
                ["run", "--out", str(d / "run"), "--no-analyze", "--", *cmd], timeout=300
            )
        dirs[kind] = d
    assert outs["direct"].returncode == 0, outs["direct"].stderr[-3000:]
    assert outs["gpudiag"].returncode == 0, outs["gpudiag"].stderr[-3000:]
    assert outs["gpudiag"].stdout == outs["direct"].stdout
    m = json.loads((dirs["gpudiag"] / "run" / "manifest.json").read_text())
    return dirs["direct"], dirs["gpudiag"], m


def test_gpudiag_window_and_conditions_on_a_gpu(tmp_path: Path) -> None:
    _, under, m = _both(tmp_path, [])
    assert m["sources"]["kineto"]["captured"]
    assert _kernels(under / "run" / "ranks" / "rank-0.pt.trace.json.gz") > 0
    assert m["sources"]["nvml"]["captured"]
    c = m["conditions"]
    assert c["samples"] >= 2
    (gpu,) = [g for g in c["gpus"].values() if g["samples"]]
    assert gpu["sm_clock_mhz_min"] is not None and gpu["sm_clock_max_mhz"] is not None
    assert gpu["temp_c_max"] is not None
    # the rank is on the GPU, but it is the job's: not another process
    assert gpu["other_processes_max"] == 0, gpu["other_processes"]


def test_job_cuda_profiler_inside_the_window(tmp_path: Path) -> None:
    direct, under, m = _both(
        tmp_path, ["--profile-from", "7", "--profile-export", "DIR/job-{rank}.json.gz"]
    )
    k = m["sources"]["kineto"]
    assert k["captured"], k
    assert k["reason"].startswith("window 5:10 cut at step 7: the job started its own profiler")
    assert _kernels(under / "run" / "ranks" / "rank-0.pt.trace.json.gz") > 0
    assert _kernels(under / "job-0.json.gz") > 0
    assert _kernels(under / "job-0.json.gz") == _kernels(direct / "job-0.json.gz")


def test_job_cuda_profiler_from_step_0(tmp_path: Path) -> None:
    direct, under, m = _both(
        tmp_path, ["--profile-from", "0", "--profile-export", "DIR/job-{rank}.json"]
    )
    assert not m["sources"]["kineto"]["captured"]
    assert m["sources"]["kineto"]["reason"].startswith(
        "the job runs its own torch.profiler.profile from step 0; no gpudiag window"
    )
    assert _kernels(under / "job-0.json") == _kernels(direct / "job-0.json") > 0
