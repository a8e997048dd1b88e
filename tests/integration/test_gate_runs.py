"""Issues 5 and 15: the CI gate's plumbing on real 2-rank CPU DDP runs under ``gpudiag run``.

These tests check exit codes, files, JUnit XML and Markdown, never a borderline number: the
gate's statistics are tested on synthetic runs with known answers
(tests/unit/analysis/compare/test_gate_noise.py). Every injected effect here is many times larger
than what other processes on a shared 2-core host do to the job (they stretch a CPU step by
up to ±30%, measured while writing issue 15):

* the starved job fetches ~0.3 s of data per step against ~1 ms of compute (data-wait
  ≈ 99%), gated against a 20% data-wait limit;
* the balanced job passes against an idle limit far above any it shows.

The regression checks against baselines of real runs (unchanged and slowed candidates, the
wall clock with the contention limits off) share the runs of
tests/integration/test_gate_busy_host.py: one set of real runs for the gate's regression
rules, each beside a CPU hog.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from run_helpers import DEMO, run_gpudiag

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2", str(DEMO), "--pin"]
JOBS = {
    # the demo's default model takes ~1 s a step here (16 CPU-s a run): a smaller one does
    "balanced": (["--steps", "8", "--batch", "1024", "--hidden", "256", "--dim", "128"], "2:8"),
    "starved": (
        [
            "--steps",
            "6",
            "--slow-data",
            "0.005",
            "--batch",
            "64",
            "--hidden",
            "64",
            "--layers",
            "2",
        ],
        "2:6",
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate_runs")
    out = {}
    for name, (args, window) in JOBS.items():
        d = root / name
        r = run_gpudiag(
            [
                "run",
                "--out",
                str(d),
                "-q",
                "--no-analyze",
                "--profile-steps",
                window,
                "--",
                *TORCHRUN,
                *args,
            ],
            timeout=180,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = d
    return out


def gate(*args: str, cwd: Path) -> tuple[int, str, str]:
    r = run_gpudiag(["gate", *args], cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def test_balanced_run_passes(runs: dict[str, Path], tmp_path: Path) -> None:
    # A limit far above any idle ratio a balanced job shows, even on a busy host.
    code, out, err = gate(
        str(runs["balanced"]), "--max-idle-ratio", "0.95", "--stragglers", "warn", cwd=tmp_path
    )
    assert code == 0, out + err
    assert "gate passed (exit 0)" in out and "idle_ratio" in out


def test_data_starved_run_fails_on_idle_ratio_with_junit(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    # a CPU-only run has no idle limit unless one is set (issue 24): set the analysis's 0.3
    code, out, err = gate(
        str(runs["starved"]),
        "--junit",
        str(junit),
        "--max-data-wait",
        "0.2",
        "--max-idle-ratio",
        "0.3",
        "--markdown",
        str(md),
        "-f",
        "json",
        cwd=tmp_path,
    )
    unset = gate(str(runs["starved"]), "-f", "json", "--stragglers", "off", cwd=tmp_path)[1]
    # shown, not applied: an "off" row that says how to apply it (issue 32)
    idle = [c for c in json.loads(unset)["checks"] if c["name"] == "idle_ratio"]
    assert idle and all(c["status"] == "off" for c in idle), idle
    assert "--max-idle-ratio" in idle[0]["message"]
    assert code == 1, out + err
    assert "gate failed" in err
    shares = [c["value"] for c in json.loads(out)["checks"] if c["name"] == "data_wait_share"]
    print(f"data-wait shares {shares} (limit 0.2)")
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failed = {c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None}
    assert {"idle_ratio[rank 0]", "idle_ratio[rank 1]"} <= failed
    assert {"data_wait_share[rank 0]", "data_wait_share[rank 1]"} <= failed
    assert md.read_text().startswith("## gpudiag gate")


def test_diff_and_report_of_real_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    # the data-starved run (~0.3 s a step) against the balanced one (~30 ms a step): worse
    r = run_gpudiag(["diff", str(runs["balanced"]), str(runs["starved"]), "-f", "markdown"])
    assert r.returncode == 0, r.stderr
    assert "| run | step time (median) |" in r.stdout and "🔺" in r.stdout, r.stdout
    html = tmp_path / "r.html"
    r = run_gpudiag(["report", str(runs["starved"]), "-o", str(html)])
    assert r.returncode == 0, r.stderr
    assert html.read_text().count("<svg") >= 3
