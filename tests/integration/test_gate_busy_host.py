"""The CI gate on a busy host: real 2-rank CPU DDP runs, each beside a CPU hog.

A CPU hog (one spinning process) runs beside every run, baselines and candidates, so every
run's conditions are contended: what decides is the job's own work, the training threads'
CPU time per step (``cpu_time_regression``), and the wall clock where the baseline runs
were as contended as the candidate (``comparable_contention_margin``). The slowed
candidate adds 400% to each step's own CPU work (the demo's ``--extra-work``, real
compute); the unchanged ones are the baseline's code. A rank that raises fails the gate
and is refused as a baseline.

Seven runs, shared by every test of the module: four unchanged (each of two is a candidate
against the other three: leave one out), the slowed one, one whose rank 0 waits 0.5 s a step
and a short one whose rank raises; no profiled window. The table of runs (exit, p, the
deciding signal) is printed (``pytest -s``) and written to ``gate-runs.txt`` in the module's
temporary directory. The same runs serve the gate's plumbing against a saved baseline: an
unchanged rerun against three baseline runs, the wall clock alone with the contention limits
off (the waiting run: beside the hog the unchanged runs' wall clock varies by up to ±40%, so
only a wait-dominated slowdown clears it). +30% and +60% of own work sit inside the unpaired
rule's noise floor on a shared runner (docs/gate.md, "Error rates on a busy host"); the
paired rule fails them on recorded pairs beside a hog
(tests/unit/analysis/compare/test_gate_paired.py, benchmarks/bench_gate_signals.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import DEMO, run_gpudiag

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2", str(DEMO), "--pin"]
JOB = ["--batch", "1024", "--hidden", "256", "--layers", "3", "--dim", "128"]
JOBS = {
    "same1": ["--steps", "24"],
    "same2": ["--steps", "24"],
    "same3": ["--steps", "24"],
    "same4": ["--steps", "24"],
    "slow400": ["--steps", "24", "--extra-work", "4"],
    # rank 0 waits 0.5 s a step (a stand-in for I/O, which the hog barely stretches): a step
    # ~8x as long, far above what the hog does to the wall clock of the unchanged runs
    # (their median step time varies by up to ±40% beside it)
    "slept": ["--steps", "16", "--sleep-rank", "0", "--sleep-s", "0.5"],
    "raised": ["--steps", "10", "--raise-at", "6"],
}
# each candidate's baseline: the unchanged runs other than itself (three)
BASELINES = {"same1": ("same2", "same3", "same4"), "same2": ("same1", "same3", "same4")}
CANDIDATES = {"same1": "same1", "same2": "same2", "slow400": "same1", "raised": "same1"}
CANDIDATES["slept"] = "same1"
TABLE = (("same1", False), ("same2", False), ("slow400", False), ("slow400", True))
TABLE += (("raised", False), ("raised", True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate_busy")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    out = {}
    try:
        for name, args in JOBS.items():
            d = root / name
            cmd = ["run", "--out", str(d), "-q", "--no-analyze", "--profile-steps", "off"]
            r = run_gpudiag([*cmd, "--", *TORCHRUN, *JOB, *args], timeout=300)
            assert (r.returncode != 0) == (name == "raised"), r.stderr[-3000:]
            out[name] = d
    finally:
        hog.kill()
        hog.wait()
    for name, members in BASELINES.items():
        base = root / f"baseline-{name}.json"
        r = run_gpudiag(
            ["gate", "--save-baseline", str(base), *(str(out[b]) for b in members)], timeout=600
        )
        assert r.returncode == 0, r.stdout + r.stderr
        out[f"baseline-{name}"] = base
    return out


def gate(runs: dict[str, Path], name: str, *extra: str) -> tuple[int, dict]:
    base = runs[f"baseline-{CANDIDATES[name]}"]
    r = run_gpudiag(
        ["gate", str(runs[name]), "--baseline", str(base), "--format", "json", *extra],
        timeout=600,
    )
    assert r.returncode in (0, 1, 5), r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


def cell(c: dict, key: str, form: str) -> str:
    v = c.get(key)
    return "-" if v is None else format(v, form)


@pytest.fixture(scope="module")
def results(runs: dict[str, Path]) -> dict[tuple[str, bool], tuple[int, dict]]:
    out = {}
    lines = [
        "run     --inconclusive-ok  exit  cpu effect  cpu p    wall effect  wall p   decided by"
    ]
    for name, ok in TABLE:
        code, res = gate(runs, name, *(["--inconclusive-ok"] if ok else []))
        out[(name, ok)] = (code, res)
        rows = {c["name"]: c for c in res["checks"]}
        cpu, wall = rows.get("cpu_time_regression", {}), rows.get("step_time_regression", {})
        fails = [c["name"] for c in res["checks"] if c["status"] == "fail"]
        lines.append(
            f"{name:7s} {ok!s:18s} {code:4d}  {cell(cpu, 'effect_ratio', '+.1%'):10s}"
            f"  {cell(cpu, 'p_value', '.2g'):7s}  {cell(wall, 'effect_ratio', '+.1%'):11s}"
            f"  {cell(wall, 'p_value', '.2g'):7s}  {', '.join(fails) or '-'}"
        )
    text = "\n".join(lines)
    (runs["same1"].parent / "gate-runs.txt").write_text(text + "\n")
    print("\n" + text)
    return out


def test_every_run_was_contended(results: dict) -> None:
    for _code, res in results.values():
        rows = {c["name"]: c for c in res["checks"]}
        assert rows["run_conditions"]["status"] == "warn"  # the hog: other processes > 25%


def test_unchanged_candidates_do_not_fail(results: dict) -> None:
    for name in ("same1", "same2"):
        code, res = results[(name, False)]
        assert code != 1, [c["message"] for c in res["checks"] if c["status"] == "fail"]


@pytest.mark.parametrize("ok", [False, True])
def test_much_more_own_work_fails(results: dict, ok: bool) -> None:
    # +30% and +60% sit inside this host's noise floor (the training thread's CPU time of
    # the same work varies by ±11% between runs: docs/gate.md), so only +400% is asserted:
    # beside the hog and a loaded suite the three baseline runs' CPU time varied by ±18.5%
    # once, a smallest detectable effect of +149% that +150% (p 0.015) did not clear
    code, res = results[("slow400", ok)]
    rows = {c["name"]: c for c in res["checks"]}
    assert code == 1, [c["message"] for c in res["checks"]]
    cpu, wall = rows["cpu_time_regression"], rows["step_time_regression"]
    # the job's own work decides, or (seen once under load 11, the CPU check inconclusive)
    # the wall clock against as-contended baseline runs: either way a timing check fails
    if cpu["status"] != "fail":
        assert cpu["status"] == "inconclusive", cpu["message"]
        assert wall["status"] == "fail", wall["message"]


def test_a_run_whose_rank_raised_fails_and_is_no_baseline(
    runs: dict, results: dict, tmp_path: Path
) -> None:
    for ok in (False, True):
        code, res = results[("raised", ok)]
        rows = {c["name"]: c for c in res["checks"]}
        assert code == 1 and rows["run_outcome"]["status"] == "fail"
        assert "raised" in rows["run_outcome"]["message"]
    out = tmp_path / "bad.json"
    r = run_gpudiag(
        ["gate", "--save-baseline", str(out), str(runs["same1"]), str(runs["raised"])], timeout=600
    )
    assert r.returncode == 4 and not out.exists(), r.stderr
    assert "refused as a baseline" in r.stderr and "Traceback" not in r.stderr


# The gate's contention limits switched off: the wall clock alone decides (a contended run
# cannot fail on the wall clock otherwise, by design).
NO_CONTENTION = """[tool.gpudiag.gate]
max_other_cpu_ratio = 1.0
max_steal_ratio = 1.0
max_gpu_slowdown_ratio = 1.0
max_gpu_other_process_ratio = 1.0
"""


def wall_check(runs: dict, name: str, cwd: Path) -> tuple[int, dict]:
    base = runs[f"baseline-{CANDIDATES[name]}"]
    r = run_gpudiag(
        ["gate", str(runs[name]), "--baseline", str(base), "--format", "json"], cwd=cwd, timeout=600
    )
    res = json.loads(r.stdout)
    check = next(c for c in res["checks"] if c["name"] == "step_time_regression")
    return r.returncode, check


def test_unchanged_rerun_against_three_baseline_runs_counts_them(results: dict) -> None:
    _, res = results[("same1", False)]
    check = next(c for c in res["checks"] if c["name"] == "step_time_regression")
    assert check["status"] in ("pass", "inconclusive"), check
    assert check["details"]["baseline_runs"] == 3
    assert check["samples"][0] >= 8 and check["samples"][1] >= 8


def test_wall_clock_alone_fails_the_job_that_waits(runs: dict, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(NO_CONTENTION)
    code, check = wall_check(runs, "slept", tmp_path)
    assert code == 1 and check["status"] == "fail", check
    assert check["effect_ratio"] > 1.0 and check["effect_ratio"] > check["mde_ratio"]
    assert re.search(r"median step time [\d.]+ ms vs [\d.]+ ms baseline", check["message"])
