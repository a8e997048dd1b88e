"""The paired gate (issue 32): baseline and candidate runs alternated on one busy host.

Truth by construction: each pair's host factor is drawn from a wide spread (the busy
runner: ×0.7 to ×1.6 between runs, as measured in docs/gate.md), the candidate's own work
is the baseline's × (1 + effect), and each run adds its own small noise. The unpaired rule
cannot see +30% through such a spread; the pairs' ratios cancel the host's factor.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from cli_runner import run_cli
from test_gate import make, noisy, save

from gpudiag.analysis.compare.baseline import RunStat, run_stat
from gpudiag.analysis.compare.gate import evaluate
from gpudiag.analysis.compare.paired import paired_check, paired_checks
from gpudiag.analysis.compare.timing import CPU, WALL, regression_check
from gpudiag.config import GateConfig

MS = 1_000_000
FP = {"world_size": 2, "devices": [], "mode": "cpu"}


def _run(name: str, median_ms: float, rng: np.random.Generator, cpu_ms: float) -> RunStat:
    steps = [int(median_ms * MS * np.exp(rng.normal(0, 0.05))) for _ in range(30)]
    cpu = [int(cpu_ms * MS * np.exp(rng.normal(0, 0.05))) for _ in range(30)]
    return RunStat(
        name,
        float(np.median(steps)),
        steps,
        {},
        0.0,
        dict(FP),
        cpu_ns=cpu,  # type: ignore[arg-type]
    )


def _pairs(effect: float, n: int, seed: int, pair_noise: float = 0.03):
    """n (baseline, candidate) runs: a host factor per pair, shared by its two runs."""
    rng = np.random.default_rng(seed)
    base, cands = [], []
    for i in range(n):
        host = float(rng.uniform(0.7, 1.6))
        b = 100.0 * host * np.exp(rng.normal(0, pair_noise))
        c = 100.0 * (1 + effect) * host * np.exp(rng.normal(0, pair_noise))
        base.append(_run(f"B{i + 1}", b, rng, b / 4))
        cands.append(_run(f"C{i + 1}", c, rng, c / 4))
    return base, cands


@pytest.mark.parametrize("effect", [0.30, 0.60])
def test_a_slowdown_inside_the_hosts_spread_fails_paired_and_not_unpaired(effect):
    base, cands = _pairs(effect, 5, seed=3)
    wall, cpu = paired_checks(cands, base, GateConfig(), "cpu", False)
    assert (wall.name, cpu.name) == (WALL, CPU)
    assert wall.status == "fail" and cpu.status == "fail", (wall.message, cpu.message)
    assert wall.effect_ratio == pytest.approx(effect, abs=0.06)
    assert wall.details["paired"] is True and len(wall.details["pair_ratios"]) == 5
    assert "5 alternated pairs" in wall.message
    # the same runs, unpaired: the baseline runs' spread hides it
    unpaired = regression_check(cands[0], base, GateConfig(), [])
    assert unpaired.status != "fail"


def test_unchanged_code_fails_at_most_alpha_of_the_time():
    cfg = GateConfig()
    fails = 0
    trials = 1000
    for seed in range(trials):
        base, cands = _pairs(0.0, 3, seed=seed, pair_noise=0.04)
        fails += paired_check(WALL, cands, base, cfg).status == "fail"
    # a paired t-test at run_alpha = 0.01 on normal log ratios (binomial 99.9% bound: 2.2%)
    assert fails / trials <= 0.022, fails


def test_mde_and_interval_follow_the_formula():
    base, cands = _pairs(0.2, 4, seed=9)
    c = paired_check(WALL, cands, base, GateConfig())
    logs = np.log(np.asarray(c.details["candidate_medians_ns"]) / c.details["baseline_medians_ns"])
    se = logs.std(ddof=1) / np.sqrt(4)
    tq = c.details["t_quantile"]
    assert tq == pytest.approx(4.541, abs=1e-3)  # t_{0.99, 3}
    assert c.mde_ratio == pytest.approx(np.expm1(tq * se))
    assert c.ci == pytest.approx([np.expm1(logs.mean() - tq * se), np.expm1(logs.mean() + tq * se)])
    assert c.effect_ratio == pytest.approx(np.expm1(logs.mean()))


def test_unequal_counts_or_one_pair_are_inconclusive_and_say_how():
    base, cands = _pairs(0.5, 3, seed=1)
    for b, c in ((base[:2], cands), (base[:1], cands[:1])):
        checks = paired_checks(c, b, GateConfig(), "cpu", False)
        assert {x.status for x in checks} == {"inconclusive"}
        assert "alternately" in checks[0].message


def test_a_pair_on_a_busier_host_than_its_partner_cannot_fail_on_the_wall_clock():
    base, cands = _pairs(0.5, 4, seed=5)
    quiet = {"other_cpu_ratio_mean": 0.05, "steal_ratio_mean": 0.0}
    busy = {"other_cpu_ratio_mean": 0.9, "steal_ratio_mean": 0.0}
    base = [dataclasses.replace(b, conditions=quiet) for b in base]
    cands = [dataclasses.replace(c, conditions=busy) for c in cands]
    c = paired_check(WALL, cands, base, GateConfig())
    assert c.status == "inconclusive" and "more contended than its partner" in c.message
    # alike contended on both sides: the pairs are comparable
    base = [dataclasses.replace(b, conditions=busy) for b in base]
    assert paired_check(WALL, cands, base, GateConfig()).status == "fail"


def _diag_runs(tmp_path, medians_ms):
    out = []
    for i, m in enumerate(medians_ms):
        out.append(save(tmp_path, f"r{i}_{m}.json", make(noisy(20, m, 10 + i))))
    return out


def test_evaluate_paired_fails_a_candidate_run_that_did_not_end_well():
    base, cands = _pairs(0.0, 3, seed=2)
    d = make(noisy(30, 100, 1))
    more = [dataclasses.replace(cands[1], outcome="rank 1 exited with code 1"), cands[2]]
    res = evaluate(d, GateConfig(), base, "C1", None, paired=more)
    assert res.status == "failed"
    (row,) = [c for c in res.checks if c.name == "run_outcome"]
    assert row.status == "fail" and "C2: rank 1 exited with code 1" in row.message


def test_evaluate_paired_drops_the_pair_of_a_failed_baseline_run():
    d = make(noisy(30, 100, 1))
    lead = run_stat(d, "C1")
    base = [
        dataclasses.replace(lead, name=f"B{i}", fingerprint=lead.fingerprint) for i in (1, 2, 3)
    ]
    base[1] = dataclasses.replace(base[1], outcome="hung")
    more = [dataclasses.replace(lead, name="C2"), dataclasses.replace(lead, name="C3")]
    res = evaluate(d, GateConfig(), base, "C1", None, paired=more)
    (wall,) = [c for c in res.checks if c.name == WALL]
    assert wall.details["baseline_runs"] == 2  # pairs 1 and 3
    assert any(c.name == "baseline_outcome" for c in res.checks)


def test_cli_paired(tmp_path):
    # host factors 1.0, 1.5, 0.8 between the pairs; the candidate +40% in each
    base = _diag_runs(tmp_path, [100, 150, 80])
    slow = _diag_runs(tmp_path, [140, 210, 112])
    same = _diag_runs(tmp_path, [101, 149, 81])
    args = ["gate", "--paired", "--format", "json"]

    def gate(cands):
        alternated = [str(x) for pair in zip(base, cands, strict=True) for x in pair]
        return run_cli(*args, *alternated, cwd=tmp_path)

    r = gate(slow)
    assert r.returncode == 1, r.stderr
    wall = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == WALL)
    assert wall["status"] == "fail" and wall["details"]["paired"] is True
    assert wall["details"]["baseline_runs"] == 3
    assert gate(same).returncode in (0, 5)
    for bad in ([str(slow[0]), str(slow[1])], [*map(str, slow), *map(str, base[:2])]):
        r = run_cli(*args, *bad, cwd=tmp_path)
        assert r.returncode == 2 and "--paired B1 C1 B2 C2" in r.stderr


def test_recorded_pairs_beside_a_hog_fail_30_and_60_percent_and_pass_unchanged():
    """Real runs (benchmarks/data/gate_paired_runs_3.json): the demo under `gpudiag run`
    beside a CPU hog, in 5 blocks base_k, same_k, slow30_k, slow60_k (--extra-work 0.3 and
    0.6 of the job's own CPU work). Every choice of 4 blocks: the unchanged runs pass, the
    slowed ones fail, the CPU-time check among the failing."""
    import itertools
    from pathlib import Path

    from gpudiag.analysis.compare.baseline import baseline_from_json

    data = Path(__file__).resolve().parents[4] / "benchmarks" / "data" / "gate_paired_runs_3.json"
    runs = {r.name: r for r in baseline_from_json(json.loads(data.read_text()))}
    assert all(r.conditions is not None for r in runs.values())  # every run's host recorded
    cfg = GateConfig()
    for chosen in itertools.combinations(range(1, 6), 4):
        base = [runs[f"base_{k}"] for k in chosen]
        for kind, slower in (("same", False), ("slow30", True), ("slow60", True)):
            checks = paired_checks([runs[f"{kind}_{k}"] for k in chosen], base, cfg, "cpu", False)
            fails = {c.name for c in checks if c.status == "fail"}
            assert bool(fails) == slower, (chosen, kind, [(c.name, c.message) for c in checks])
            assert not slower or CPU in fails
