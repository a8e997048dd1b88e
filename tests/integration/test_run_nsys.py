"""`gpudiag run --nsys`: fails before launch without nsys; with nsys, wraps the job and records
what it got; `gpudiag analyze RUN_DIR` reads an Nsight export kept in the run directory."""

import json
import shutil
import sys

import pytest
from cli_runner import run_cli

from gpudiag._support import nsysbin
from gpudiag.rundir import layout as rundir


def test_nsys_missing_fails_before_the_job_starts(tmp_path):
    marker = tmp_path / "ran"
    out = tmp_path / "run"
    r = run_cli(
        "run",
        "--nsys",
        "--out",
        str(out),
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
        env={"GPUDIAG_NSYS": str(tmp_path / "no-nsys")},
    )
    assert r.returncode == 3
    assert "--nsys" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists() and not out.exists()


def test_bad_nsys_range_is_a_usage_error(tmp_path):
    r = run_cli("run", "--nsys", "--nsys-range", "sometimes", "--", sys.executable, "-c", "0")
    assert r.returncode == 2


def test_run_under_real_nsys_records_the_outcome(tmp_path):
    path, why = nsysbin.locate()
    if path is None:
        pytest.skip(f"no nsys here: {why}")
    out = tmp_path / "run"
    r = run_cli(
        "run",
        "--nsys",
        "--nsys-range",
        "all",
        "--no-analyze",
        "--quiet",
        "--out",
        str(out),
        "--",
        sys.executable,
        "-c",
        "print('job output')",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "job output" in r.stdout
    m = json.loads((out / "manifest.json").read_text())
    src = m["sources"]["nsys"]
    assert m["extra"]["nsys"]["range"] == "all"
    # either a report exported to SQLite, or (an nsys without importer) the raw stream and why
    if src["captured"]:
        assert any(f.endswith(".sqlite") for f in src["files"])
    else:
        assert src["reason"] and src["files"], src


def _run_dir(tmp_path, shared_traces, with_kineto: bool):
    d = tmp_path / "run"
    rundir.write_manifest(d, rundir.RunManifest(gpudiag_version="test", world_size=1))
    (d / "nsys").mkdir()
    shutil.copy(shared_traces / "nsys/nsys-ai/healthy_1pct.sqlite", d / "nsys" / "node-0.sqlite")
    if with_kineto:
        (d / "ranks").mkdir()
        shutil.copy(
            shared_traces / "kineto/edge_h100_infer_1step/h100.json.gz",
            d / "ranks" / "rank-0.pt.trace.json.gz",
        )
    return d


def test_analyze_run_dir_reads_its_nsys_export(tmp_path, shared_traces):
    r = run_cli("analyze", str(_run_dir(tmp_path, shared_traces, False)), "-f", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["inputs"][0].endswith("nsys/node-0.sqlite")
    assert doc["run"]["shares"]["compute"] > 0.95  # healthy_1pct: ~1% idle


def test_analyze_run_dir_prefers_kineto_and_names_the_export(tmp_path, shared_traces):
    r = run_cli("analyze", str(_run_dir(tmp_path, shared_traces, True)), "-f", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p.rsplit("/", 1)[-1] for p in doc["inputs"]] == ["rank-0.pt.trace.json.gz"]
    assert any("node-0.sqlite" in n for n in doc["notes"])
