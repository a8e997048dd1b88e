"""Golden outputs for every shared Kineto set and the hand-built fixtures.

Refresh after an intended change with ``pytest tests/unit/report/test_golden.py --update-golden``
and review the diff: these files are what users see.
"""

import io
import json
from pathlib import Path

import pytest
from testpaths import TESTS

import gpudiag
from gpudiag.report.console import render

GOLDEN = TESTS / "golden"
SHARED_SETS = [
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
LOCAL_SETS = ["legacy_2021", "nccl219_data", "straggler_comms_id", "pipeline_4stage"]


def _normalise(doc: dict, root: Path) -> dict:
    text = json.dumps(doc).replace(str(root), "<root>")
    doc = json.loads(text)
    doc["gpudiag_version"] = "<version>"
    return doc


def _check(path: Path, root: Path, name: str, update: bool) -> None:
    d = gpudiag.analyze(path, jobs=1)
    got_json = json.dumps(_normalise(d.to_json(), root), indent=2, sort_keys=True) + "\n"
    buf = io.StringIO()
    render(d, buf, show_steps=True, width=110, color=False)
    got_txt = buf.getvalue()
    out = GOLDEN / name
    if update:
        out.mkdir(parents=True, exist_ok=True)
        (out / "diagnosis.json").write_text(got_json)
        (out / "console.txt").write_text(got_txt)
        return
    if not (out / "diagnosis.json").exists():
        pytest.fail(f"no golden output for {name}: run pytest --update-golden")
    assert got_json == (out / "diagnosis.json").read_text()
    assert got_txt == (out / "console.txt").read_text()


@pytest.mark.parametrize("name", SHARED_SETS)
def test_shared_set_matches_golden(name, kineto_sets, update_golden):
    _check(kineto_sets / name, kineto_sets, name, update_golden)


@pytest.mark.parametrize("name", LOCAL_SETS)
def test_local_fixture_matches_golden(name, update_golden):
    _check(TESTS / "data" / name, TESTS / "data", name, update_golden)
