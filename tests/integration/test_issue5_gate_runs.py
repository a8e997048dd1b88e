"""Issue 5: the CI gate on real 2-rank CPU DDP runs captured with ``gpudiag run``.

Noise on a shared 2-core machine: the CPU-bound demo's median step time drifts by up to
±15% between identical runs while other processes compete for the cores (measured while
writing this test: 62.8, 71.7 and 69.7 ms for three identical runs at --batch 512). The
regression runs therefore use a job whose step is dominated by a fixed 100 ms wait on rank 0
(a stand-in for I/O or GPU work, which the host's load does not stretch): identical runs then
differ by a few percent (106–114 ms measured), the slowed run adds 25 ms (~+20%), and the
gate's default rule (p < 0.01 and more than +10%) separates them with margin on both sides.
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
WAITING = ["--steps", "20", "--batch", "16", "--hidden", "64", "--layers", "2",
           "--sleep-rank", "0"]  # fmt: skip
# Rank 0's deliberate wait makes it idle and a straggler; these runs test the regression check.
REGRESSION_ONLY = ["--max-idle-ratio", "1", "--stragglers", "off"]
JOBS = {
    "balanced": (["--steps", "8"], "2:8"),
    # ~0.5 s of fetching per step against tens of ms of compute: data-wait ~90%, far from
    # the 50% limit below even when other processes triple the compute time
    "starved": (["--steps", "6", "--slow-data", "0.0005", "--batch", "1024"], "2:6"),
    "base": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "same1": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "same2": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "same3": ([*WAITING, "--sleep-s", "0.1"], "2:20"),
    "slow": ([*WAITING, "--sleep-s", "0.125"], "2:20"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate_runs")
    out = {}
    for name, (args, window) in JOBS.items():
        d = root / name
        r = run_gpudiag(["run", "--out", str(d), "-q", "--no-analyze", "--profile-steps", window,
                         "--", *TORCHRUN, *args], timeout=180)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = d
    return out


def gate(*args: str, cwd: Path) -> tuple[int, str, str]:
    r = run_gpudiag(["gate", *args], cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def test_balanced_run_passes(runs: dict[str, Path], tmp_path: Path) -> None:
    # Other processes on a shared 2-core box can stall one rank for a step or two, which the
    # straggler analysis rightly reports; this test is about the idle-ratio limit.
    code, out, err = gate(str(runs["balanced"]), "--max-idle-ratio", "0.30",
                          "--stragglers", "warn", cwd=tmp_path)  # fmt: skip
    assert code == 0, out + err
    assert "gate passed (exit 0)" in out and "idle_ratio" in out


def test_data_starved_run_fails_on_idle_ratio_with_junit(runs: dict[str, Path],
                                                         tmp_path: Path) -> None:  # fmt: skip
    junit = tmp_path / "gate.xml"
    code, out, err = gate(str(runs["starved"]), "--junit", str(junit), "--max-data-wait", "0.5",
                          cwd=tmp_path)  # fmt: skip
    assert code == 1, out + err
    assert "gate failed" in err
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failed = {c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None}
    assert {"idle_ratio[rank 0]", "idle_ratio[rank 1]"} <= failed
    assert {"data_wait_share[rank 0]", "data_wait_share[rank 1]"} <= failed


def regression(runs: dict[str, Path], name: str, tmp_path: Path) -> tuple[int, dict]:
    base = tmp_path / "baseline.json"
    if not base.exists():
        code, _, err = gate(str(runs["base"]), "--save-baseline", str(base), *REGRESSION_ONLY,
                            cwd=tmp_path)  # fmt: skip
        assert code == 0, err
    code, out, err = gate(str(runs[name]), "--baseline", str(base), *REGRESSION_ONLY,
                          "--format", "json", cwd=tmp_path)  # fmt: skip
    res = json.loads(out)
    check = next(c for c in res["checks"] if c["name"] == "step_time_regression")
    print(f"{name}: exit {code}, effect {check['effect_ratio']:+.1%}, p {check['p_value']:.3g}, "
          f"samples {check['samples']}")  # fmt: skip
    return code, check


@pytest.mark.parametrize("rerun", ["same1", "same2", "same3"])
def test_unchanged_rerun_passes_against_its_baseline(runs: dict[str, Path], rerun: str,
                                                     tmp_path: Path) -> None:  # fmt: skip
    code, check = regression(runs, rerun, tmp_path)
    assert code == 0, check
    assert check["status"] in ("pass", "warn")
    assert check["samples"][0] >= 8 and check["samples"][1] >= 8


def test_slowed_job_fails_against_its_baseline(runs: dict[str, Path], tmp_path: Path) -> None:
    code, check = regression(runs, "slow", tmp_path)
    assert code == 1, check
    assert check["status"] == "fail"
    assert check["p_value"] < 0.01 and check["effect_ratio"] > 0.10
    assert re.search(r"median step time [\d.]+ ms vs [\d.]+ ms baseline", check["message"])


def test_diff_and_report_of_real_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    r = run_gpudiag(["diff", str(runs["base"]), str(runs["slow"]), "-f", "markdown"])
    assert r.returncode == 0, r.stderr
    assert "| run | step time (median) |" in r.stdout and "🔺" in r.stdout
    html = tmp_path / "r.html"
    r = run_gpudiag(["report", str(runs["starved"]), "-o", str(html)])
    assert r.returncode == 0, r.stderr
    assert html.read_text().count("<svg") >= 3
