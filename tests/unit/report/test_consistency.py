"""One story (issue 24 §1): the consistency properties of tests/consistency.py on every input.

Every shared trace set (Kineto and Nsight), every trace fixture of tests/data, the saved
diagnoses there, and every hand-built accuracy case (tests/accuracy/make_nsys_cases.py,
tests/accuracy/make_merged.py) is analysed as a user would, rendered to the console, and
checked: the verdict quotes its finding, the what-ifs and the remedies' gains agree, the
shares sum to 1. A failure lists each disagreement.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from testpaths import TESTS, nonempty

import gpudiag
from gpudiag.report.console import render

sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "accuracy"))

from consistency import problems

SHARED_KINETO = [
    "a100x2_r0_pgcfg",
    "a100x8_r3",
    "b200x8_r0_infer",
    "edge_amd_mi250",
    "edge_cpu_only",
    "edge_distinfo_no_rank",
    "edge_h100_infer_1step",
    "edge_mi210_gpu_only",
    "edge_mi300x_infer_1step",
    "edge_mi300x_triton_tiny",
    "edge_no_distinfo",
    "mi300x_ddp8_r0_rccl",
    "rtx2080ti_dataloader_nostep",
    "sampled_2rank_a2a",
    "v100x2_r1",
]
SHARED_NSYS = [
    "ai-profiler/baseline.sqlite",
    "ai-profiler/baseline_nvtx.sqlite",
    "jacobi-mpi",
    "nsys-ai/mfu_2gpu_before.sqlite",
    "nsys-ai/mfu_2gpu_after.sqlite",
    "nsys-ai/h100_2gpu_1s.sqlite",
    "nsys-ai/healthy_1pct.sqlite",
    "nsys-ai/mock.sqlite",
]
# trace fixtures (saved diagnoses are read back as they were written, by older versions)
LOCAL = ["legacy_2021", "nccl219_data", "straggler_comms_id", "pipeline_4stage"]


def _check(path: Path) -> None:
    d = gpudiag.analyze(path, jobs=1)
    buf = io.StringIO()
    render(d, buf, width=110, color=False)
    found = problems(d.to_json(), buf.getvalue())
    assert not found, f"{path.name}:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("name", SHARED_KINETO)
def test_shared_kineto_set_tells_one_story(name, kineto_sets):
    _check(kineto_sets / name)


@pytest.mark.parametrize("rel", SHARED_NSYS)
def test_shared_nsys_export_tells_one_story(rel, shared_traces):
    _check(shared_traces / "nsys" / rel)


@pytest.mark.parametrize("rel", LOCAL)
def test_local_fixture_tells_one_story(rel):
    _check(TESTS / "data" / rel)


def test_every_accuracy_nsys_case_tells_one_story(nsys_cases_dir):
    for f in nonempty(nsys_cases_dir.glob("*.sqlite"), "accuracy Nsight cases"):
        _check(f)


@pytest.fixture(scope="module")
def nsys_cases_dir(tmp_path_factory, shared_traces):
    import make_nsys_cases

    out = tmp_path_factory.mktemp("nsys_cases")
    for case in make_nsys_cases.CASES.values():
        make_nsys_cases.build(case, out)
    return out
