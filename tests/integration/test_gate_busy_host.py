"""The CI gate on a busy host: real 2-rank CPU DDP runs, each beside a CPU hog.

A CPU hog (one spinning process) runs beside every run, baselines and candidates, so every
run's conditions are contended and the wall clock cannot fail any of them: what decides is
the job's own work, the training threads' CPU time per step (``cpu_time_regression``).
The slowed candidates add 60% and 150% to each step's own CPU work (the demo's
``--extra-work``, real compute); the unchanged ones are the baseline's code. A rank that
raises fails the gate and is refused as a baseline.

Eight runs (~40-70 s each on the loaded 2-core host), shared by every test of the module.
The table of runs (exit, p, the deciding signal) is printed (``pytest -s``) and written to
``gate-runs.txt`` in the module's temporary directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import DEMO, run_gpudiag

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

TORCHRUN = [
    "torchrun",
    "--standalone",
    "--nproc-per-node",
    "2",
    str(DEMO),
    "--pin",
    "--steps",
    "40",
    "--batch",
    "1024",
    "--hidden",
    "256",
    "--layers",
    "3",
    "--dim",
    "128",
]
JOBS = {
    "base1": [],
    "base2": [],
    "base3": [],
    "same1": [],
    "same2": [],
    "slow60": ["--extra-work", "0.6"],
    "slow150": ["--extra-work", "1.5"],
    "raised": ["--raise-at", "25"],
}
BASELINE = ("base1", "base2", "base3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate_busy")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    out = {}
    try:
        for name, args in JOBS.items():
            d = root / name
            r = run_gpudiag(
                [
                    "run",
                    "--out",
                    str(d),
                    "-q",
                    "--no-analyze",
                    "--profile-steps",
                    "5:10",
                    "--",
                    *TORCHRUN,
                    *args,
                ],
                timeout=300,
            )
            assert (r.returncode != 0) == (name == "raised"), r.stderr[-3000:]
            out[name] = d
    finally:
        hog.kill()
        hog.wait()
    base = root / "baseline.json"
    r = run_gpudiag(
        ["gate", "--save-baseline", str(base), *(str(out[b]) for b in BASELINE)], timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out["baseline.json"] = base
    return out


def gate(runs: dict[str, Path], name: str, *extra: str) -> tuple[int, dict]:
    r = run_gpudiag(
        [
            "gate",
            str(runs[name]),
            "--baseline",
            str(runs["baseline.json"]),
            "--format",
            "json",
            *extra,
        ],
        timeout=600,
    )
    assert r.returncode in (0, 1, 5), r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def results(runs: dict[str, Path]) -> dict[tuple[str, bool], tuple[int, dict]]:
    out = {}
    lines = [
        "run     --inconclusive-ok  exit  cpu effect  cpu p    wall effect  wall p   decided by"
    ]
    for name in ("same1", "same2", "slow60", "slow150", "raised"):
        for ok in (False, True):
            code, res = gate(runs, name, *(["--inconclusive-ok"] if ok else []))
            out[(name, ok)] = (code, res)
            rows = {c["name"]: c for c in res["checks"]}
            cpu, wall = rows.get("cpu_time_regression", {}), rows.get("step_time_regression", {})
            fails = [c["name"] for c in res["checks"] if c["status"] == "fail"]

            def cell(c: dict, key: str, form: str) -> str:
                v = c.get(key)
                return "-" if v is None else format(v, form)

            lines.append(
                f"{name:7s} {ok!s:18s} {code:4d}  {cell(cpu, 'effect_ratio', '+.1%'):10s}"
                f"  {cell(cpu, 'p_value', '.2g'):7s}  {cell(wall, 'effect_ratio', '+.1%'):11s}"
                f"  {cell(wall, 'p_value', '.2g'):7s}  {', '.join(fails) or '-'}"
            )
    text = "\n".join(lines)
    (runs["baseline.json"].parent / "gate-runs.txt").write_text(text + "\n")
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
    # +30% and +60% sit near this host's noise floor (measured in one run of this module:
    # +30% gave +13.6% CPU time, p 0.043, exit 5; +60% gave +36.5%, p 0.0067, exit 1): the
    # host's load could flip them, so only +150% is asserted; +60% is in the table.
    code, res = results[("slow150", ok)]
    rows = {c["name"]: c for c in res["checks"]}
    assert code == 1, [c["message"] for c in res["checks"]]
    assert rows["cpu_time_regression"]["status"] == "fail"


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
        ["gate", "--save-baseline", str(out), str(runs["base1"]), str(runs["raised"])], timeout=600
    )
    assert r.returncode == 4 and not out.exists(), r.stderr
    assert "refused as a baseline" in r.stderr and "Traceback" not in r.stderr
