"""Issues 5 and 15: the CI gate's plumbing on real 2-rank CPU DDP runs under ``gpudiag run``.

These tests check exit codes, files, JUnit XML and Markdown, never a borderline number: the
gate's statistics are tested on synthetic runs with known answers
(tests/unit/analysis/compare/test_gate_noise.py). Every injected effect here is many times larger
than what other processes on a shared 2-core host do to the job (they stretch a CPU step by
up to ±30%, measured while writing issue 15):

* the starved job fetches ~0.3 s of data per step against ~1 ms of compute (data-wait
  ≈ 99%), gated against a 20% data-wait limit;
* the regression jobs are dominated by a fixed wait on rank 0 (a stand-in for I/O or GPU
  work, which the host's load barely stretches): 0.1 s in the baseline runs, 0.3 s in the
  slowed run, a step about 3× as long.

The slowed run's wall clock fails only when its run conditions are not contended or its
baseline runs were as contended (a contended run cannot fail on the wall clock otherwise,
by design); the test that needs exit 1 therefore raises the contention limits in
``[tool.gpudiag.gate]``, and the default limits are checked to give exit 1 or, with the
contention named, exit 5.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from run_helpers import DEMO, run_gpudiag

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2", str(DEMO), "--pin"]
WAITING = ["--steps", "20", "--batch", "16", "--hidden", "64", "--layers", "2", "--sleep-rank", "0"]
# Rank 0's deliberate wait makes it idle and a straggler; these runs test the regression check.
REGRESSION_ONLY = ["--max-idle-ratio", "1", "--stragglers", "off"]
JOBS = {
    "balanced": (["--steps", "8"], "2:8"),
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
    "base1": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "base2": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "base3": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "same": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "slow": ([*WAITING, "--sleep-s", "0.3"], "2:20"),
}
# The gate's contention limits switched off: for the test that needs the 3× slowdown to fail.
NO_CONTENTION = """[tool.gpudiag.gate]
max_other_cpu_ratio = 1.0
max_steal_ratio = 1.0
max_gpu_slowdown_ratio = 1.0
max_gpu_other_process_ratio = 1.0
"""


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


def save_baseline(runs: dict[str, Path], tmp_path: Path) -> Path:
    base = tmp_path / "baseline.json"
    code, _, err = gate(
        "--save-baseline",
        str(base),
        *(str(runs[f"base{i}"]) for i in (1, 2, 3)),
        *REGRESSION_ONLY,
        cwd=tmp_path,
    )
    assert code == 0, err
    assert "baseline of 3 runs" in err
    return base


def regression(runs: dict[str, Path], name: str, tmp_path: Path) -> tuple[int, dict]:
    base = save_baseline(runs, tmp_path)
    code, out, _ = gate(
        str(runs[name]), "--baseline", str(base), *REGRESSION_ONLY, "--format", "json", cwd=tmp_path
    )
    res = json.loads(out)
    check = next(c for c in res["checks"] if c["name"] == "step_time_regression")
    print(f"{name}: exit {code}, {check['message']}; conditions {res['conditions']}")
    return code, check


def test_unchanged_rerun_never_fails_against_three_baseline_runs(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    code, check = regression(runs, "same", tmp_path)
    assert code in (0, 5), check
    assert check["status"] in ("pass", "inconclusive")
    assert check["details"]["baseline_runs"] == 3
    assert check["samples"][0] >= 8 and check["samples"][1] >= 8


def test_slowed_job_fails_against_its_baseline(runs: dict[str, Path], tmp_path: Path) -> None:
    # Default contention limits: fail, or inconclusive naming the contention.
    code, check = regression(runs, "slow", tmp_path)
    assert code in (1, 5), check
    if code == 5:
        assert "contended" in check["message"], check
    (tmp_path / "pyproject.toml").write_text(NO_CONTENTION)
    code, check = regression(runs, "slow", tmp_path)
    assert code == 1, check
    assert check["status"] == "fail"
    assert check["effect_ratio"] > 1.0 and check["effect_ratio"] > check["mde_ratio"]
    assert re.search(r"median step time [\d.]+ ms vs [\d.]+ ms baseline", check["message"])


def test_diff_and_report_of_real_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    r = run_gpudiag(["diff", str(runs["base1"]), str(runs["slow"]), "-f", "markdown"])
    assert r.returncode == 0, r.stderr
    assert "| run | step time (median) |" in r.stdout and "🔺" in r.stdout
    html = tmp_path / "r.html"
    r = run_gpudiag(["report", str(runs["starved"]), "-o", str(html)])
    assert r.returncode == 0, r.stderr
    assert html.read_text().count("<svg") >= 3
