"""Issue 5: the CI gate's rules, the Mann-Whitney U test, JUnit, Markdown and the run diff."""

from __future__ import annotations

import dataclasses
import io
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from builders import gpu_run
from cli_runner import run_cli

from gpudiag.analysis.compare.baseline import step_samples
from gpudiag.analysis.compare.diff import diff
from gpudiag.analysis.compare.gate import evaluate
from gpudiag.analysis.compare.stats import mann_whitney_u
from gpudiag.analysis.model.diagnosis import Diagnosis, Finding
from gpudiag.api.load import diagnose
from gpudiag.api.saved import diagnosis_from_json
from gpudiag.config import GateConfig, gate_config
from gpudiag.errors import UsageError
from gpudiag.report import ci, junit, markdown

# ---- Mann-Whitney U ----


def test_mwu_exact_known_values():
    # x entirely above y: U = 9, and only 1 of the C(6,3) = 20 orderings is that extreme.
    u, p = mann_whitney_u([4, 5, 6], [1, 2, 3], "greater")
    assert u == 9 and p == pytest.approx(1 / 20)
    u, p = mann_whitney_u([4, 5, 6], [1, 2, 3], "two-sided")
    assert p == pytest.approx(2 / 20)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "greater")[1] == pytest.approx(1.0)
    # Interleaved: U = 5 of 9 for x; P(U >= 5) = 10/20 by symmetry of U around 4.5.
    assert mann_whitney_u([2, 4, 6], [1, 3, 5], "greater") == (6.0, pytest.approx(7 / 20))


def test_mwu_asymptotic_with_ties_known_value():
    # Hand-computed: ranks with ties averaged, tie-corrected variance, continuity 0.5.
    x, y = [1, 2, 2, 3, 4], [2, 3, 3, 5, 6, 7]
    u, p = mann_whitney_u(x, y, "less", method="asymptotic")
    assert u == 6.0  # x ranks 1, 3, 3, 6, 8 → 21 − 15
    n1, n2, n = 5, 6, 11
    ties = (3**3 - 3) + (3**3 - 3)
    sigma = np.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    z = ((n1 * n2 - u) - n1 * n2 / 2 - 0.5) / sigma
    from math import erfc, sqrt

    assert p == pytest.approx(0.5 * erfc(z / sqrt(2)))


@pytest.mark.parametrize("alt", ["greater", "less", "two-sided"])
@pytest.mark.parametrize(
    ("n1", "n2", "shift", "rounding"),
    [(6, 7, 0.8, None), (20, 18, 0.3, None), (40, 60, 0.2, 1), (9, 9, 0, 0)],
)
def test_mwu_matches_scipy(alt, n1, n2, shift, rounding):
    stats = pytest.importorskip("scipy.stats", reason="scipy is only a reference here")
    rng = np.random.default_rng(n1 * 100 + n2)
    x, y = rng.normal(size=n1) + shift, rng.normal(size=n2)
    if rounding is not None:
        x, y = np.round(x, rounding), np.round(y, rounding)
    for method in ("exact", "asymptotic", "auto"):
        if method == "exact" and rounding is not None:
            continue  # scipy's exact ignores ties; ours refuses them in auto mode
        u, p = mann_whitney_u(x, y, alt, method=method)
        ref = stats.mannwhitneyu(
            x,
            y,
            alternative=alt,
            method=method if method != "auto" else ("exact" if rounding is None else "asymptotic"),
        )
        assert u == pytest.approx(ref.statistic)
        assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)


# ---- synthetic diagnoses ----


def make(durations_ms: list[float] | None = None, ranks: int = 2, **rank_changes) -> Diagnosis:
    """A diagnosed 2-rank GPU run (idle 10%); per-step durations replaced if given."""
    rank_changes.setdefault("idle_ratio", 0.1)
    n = len(durations_ms) if durations_ms else 12
    d = diagnose(gpu_run(ranks=ranks, steps=n))
    if durations_ms:
        steps = [
            dataclasses.replace(s, duration_ns=round(durations_ms[s.step] * 1e6)) for s in d.steps
        ]
        d = dataclasses.replace(d, steps=steps)
    return dataclasses.replace(d, ranks=[dataclasses.replace(r, **rank_changes) for r in d.ranks])
    return d


def noisy(n: int, median_ms: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(median_ms * np.exp(rng.normal(0, 0.08, size=n)))  # ~8% step-to-step noise


def by_name(res, name):
    return [c for c in res.checks if c.name == name]


def test_balanced_run_passes_without_baseline():
    res = evaluate(make(), GateConfig())
    assert res.status == "passed" and res.exit_code == 0
    assert [c.rank for c in by_name(res, "idle_ratio")] == [0, 1]


def test_idle_ratio_above_limit_fails_per_rank():
    res = evaluate(make(idle_ratio=0.25), GateConfig(max_idle_ratio=0.2))
    assert res.status == "failed" and res.exit_code == 1
    idle = by_name(res, "idle_ratio")
    assert {c.status for c in idle} == {"fail"} and idle[0].limit == 0.2
    assert "25.0% > 20%" in idle[0].message


def test_share_limits_only_when_configured():
    # not configured: one row that says so (issue 32: every check is shown)
    off = by_name(evaluate(make(), GateConfig()), "comm_wait_share")
    assert [(c.status, c.message) for c in off] == [("off", "not applied (set --max-comm-wait)")]
    res = evaluate(make(), GateConfig(max_comm_wait_ratio=0.01, max_data_wait_ratio=0.5))
    assert {c.status for c in by_name(res, "comm_wait_share")} == {"fail"}
    assert {c.status for c in by_name(res, "data_wait_share")} == {"pass"}


def test_stragglers_fail_warn_or_off_by_kind():
    d = make()
    f = Finding("straggler", "warning", "rank 1 is 30% slower than the median rank", ranks=[1])
    d = dataclasses.replace(d, findings=[*d.findings, f])
    assert evaluate(d, GateConfig()).status == "failed"
    s = by_name(evaluate(d, GateConfig()), "straggler")
    assert [(c.rank, c.status) for c in s] == [(1, "fail")]
    warn = evaluate(d, GateConfig(stragglers="warn"))
    assert warn.status == "passed" and by_name(warn, "straggler")[0].status == "warn"
    assert [c.status for c in by_name(evaluate(d, GateConfig(stragglers="off")), "straggler")] == [
        "off"
    ]
    again = evaluate(d, GateConfig(), baseline=d)
    assert "also in the baseline" in by_name(again, "straggler")[0].message


def test_unchanged_noisy_run_passes_and_real_slowdown_fails():
    # GIVEN three baseline runs whose medians differ by a few percent (issue 15: runs, not
    # steps, are the samples)
    base = [make(noisy(30, m, seed)) for m, seed in ((98, 1), (100, 21), (102, 31))]
    for seed in range(2, 12):  # ten noisy but unchanged re-runs
        res = evaluate(make(noisy(30, 100, seed)), GateConfig(), baseline=base)
        assert res.status == "passed", res.checks
    slow = evaluate(make(noisy(30, 130, 99)), GateConfig(), baseline=base)
    reg = by_name(slow, "step_time_regression")[0]
    assert slow.status == "failed" and reg.status == "fail"
    assert reg.p_value is not None and reg.p_value < 0.025
    assert reg.effect_ratio == pytest.approx(0.30, abs=0.05)
    assert reg.samples == [30, 30]  # a profiled window keeps its first step


def test_single_baseline_run_is_inconclusive_on_a_moderate_slowdown():
    # One baseline run has no between-run spread: +30% cannot fail, +100% can.
    base = make(noisy(20, 100, 1))
    res = evaluate(make(noisy(20, 130, 2)), GateConfig(), baseline=base)
    reg = by_name(res, "step_time_regression")[0]
    assert reg.status == "inconclusive" and res.exit_code == 5
    assert "one baseline run" in reg.message and "3 or more baseline runs" in reg.message
    huge = evaluate(make(noisy(20, 200, 2)), GateConfig(), baseline=base)
    assert huge.status == "failed"


def test_faster_run_passes():
    res = evaluate(make(noisy(20, 80, 3)), GateConfig(), baseline=make(noisy(20, 100, 4)))
    assert by_name(res, "step_time_regression")[0].status == "pass"


def test_too_few_steps_is_inconclusive_unless_ok():
    base, cand = make(noisy(6, 100, 1)), make(noisy(6, 100, 2))
    res = evaluate(cand, GateConfig(), baseline=base)
    assert res.status == "inconclusive" and res.exit_code == 5
    assert "too few steady steps" in by_name(res, "step_time_regression")[0].message
    ok = evaluate(cand, GateConfig(inconclusive_ok=True), baseline=base)
    assert ok.status == "passed" and ok.exit_code == 0


def test_fingerprint_mismatch_stops_even_with_inconclusive_ok():
    base = make(noisy(20, 100, 1), ranks=2)
    cand = make(noisy(20, 200, 2), ranks=3)
    res = evaluate(cand, GateConfig(inconclusive_ok=True), baseline=base)
    assert res.status == "inconclusive" and res.exit_code == 5
    fp = by_name(res, "fingerprint")[0]
    assert fp.status == "inconclusive" and "world size 3 vs 2" in fp.message
    assert not by_name(res, "step_time_regression")


def test_samples_are_the_slowest_rank_per_step_after_warmup():
    d = make([50.0, 60.0, 10.0, 20.0, 30.0])
    steps = [
        dataclasses.replace(s, duration_ns=s.duration_ns * 2) if s.rank == 1 else s for s in d.steps
    ]
    assert step_samples(dataclasses.replace(d, steps=steps), 2) == [20e6, 40e6, 60e6]


def test_gate_config_from_pyproject_table_and_overrides():
    cfg = gate_config({"max_regression_pct": 7, "stragglers": "warn"}, alpha=0.05)
    assert cfg.min_effect_ratio == 0.07 and cfg.stragglers == "warn" and cfg.alpha == 0.05
    assert gate_config({"min_effect_pct": 3}).min_effect_ratio == 0.03
    with pytest.raises(UsageError, match="unknown setting") as e:
        gate_config({"max_idle": 0.3})
    assert "max_idle_ratio" in e.value.hint
    with pytest.raises(UsageError):
        gate_config(max_idle_ratio=30)


# ---- outputs ----


def failing_result():
    d = make(noisy(20, 160, 2), idle_ratio=0.25)
    base = [make(noisy(20, m, seed)) for m, seed in ((100, 1), (98, 5), (102, 6))]
    return evaluate(
        d,
        GateConfig(max_idle_ratio=0.2),
        baseline=base,
        subject="runs/<ci>",
        baseline_name="base & co.json",
    )


def test_junit_is_valid_xml_with_one_case_per_check_and_failures():
    res = failing_result()
    buf = io.StringIO()
    junit.render(res, buf)
    root = ET.fromstring(buf.getvalue())
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(res.checks) == int(suite.get("tests"))
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert "idle_ratio[rank 0]" in failed and "step_time_regression" in failed
    assert int(suite.get("failures")) == len(failed)


def test_markdown_gate_and_step_summary(tmp_path):
    res = failing_result()
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    ci.write_outputs(
        res, tmp_path / "g.xml", tmp_path / "g.md", env={"GITHUB_STEP_SUMMARY": str(summary)}
    )
    md = (tmp_path / "g.md").read_text()
    assert md.startswith("## gpudiag gate: ❌ failed")
    assert "base &amp; co.json" not in md and "runs/&lt;ci&gt;" in md  # escaped in tables only
    assert summary.read_text() == "earlier step\n" + md  # appended, not replaced
    assert len(md.encode()) < ci.SUMMARY_MAX_BYTES
    ET.parse(tmp_path / "g.xml")


def test_markdown_analyze_renderer_and_pipes_escaped():
    d = make()
    f = Finding("comm_bound", "warning", "waits in a|b <kernel>", ranks=[0])
    d = dataclasses.replace(d, findings=[f])
    buf = io.StringIO()
    markdown.render(d, buf)
    text = buf.getvalue()
    assert "| rank | steps |" in text and "a\\|b &lt;kernel&gt;" in text


def test_diff_rows_and_directions():
    a = make(noisy(20, 100, 1))
    b = make(noisy(20, 100, 1), idle_ratio=0.9)
    d = diff(a, b, "a.json", "b.json")
    idle = next(r for r in d.rows if r.metric == "idle_ratio" and r.rank == 0)
    assert idle.direction == "worse" and idle.change > 0.3
    same = next(r for r in d.rows if r.metric == "step_time_median" and r.scope == "run")
    assert same.direction == "same" and same.change == 0
    buf = io.StringIO()
    markdown.render_diff(d, buf)
    assert "| rank 0 | non-compute idle |" in buf.getvalue()


# ---- CLI ----


def save(tmp_path, name, d):
    p = tmp_path / name
    p.write_text(json.dumps(d.to_json()))
    return p


def test_cli_gate_exit_codes_junit_and_summary(tmp_path):
    base = save(tmp_path, "base.json", make(noisy(20, 100, 1)))
    base2 = save(tmp_path, "base2.json", make(noisy(20, 98, 5)))
    base3 = save(tmp_path, "base3.json", make(noisy(20, 102, 6)))
    slow = save(tmp_path, "slow.json", make(noisy(20, 160, 2)))
    same = save(tmp_path, "same.json", make(noisy(20, 100, 3)))
    env = {"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    r = run_cli("gate", str(same), "--baseline", str(base), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "step_time_regression" in r.stdout and "gate passed (exit 0)" in r.stdout
    r = run_cli(
        "gate",
        str(slow),
        "--baseline",
        str(base),
        str(base2),
        str(base3),
        "--junit",
        str(tmp_path / "j.xml"),
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 1 and "gate failed" in r.stderr
    assert ET.parse(tmp_path / "j.xml").getroot().find("testsuite").get("failures") == "1"
    assert (tmp_path / "summary.md").read_text().count("## gpudiag gate") == 2
    few = save(tmp_path, "few.json", make(noisy(5, 100, 4)))
    assert run_cli("gate", str(few), "--baseline", str(base), cwd=tmp_path).returncode == 5
    r = run_cli("gate", str(few), "--baseline", str(base), "--inconclusive-ok", cwd=tmp_path)
    assert r.returncode == 0
    assert run_cli("gate", str(same), "--stragglers", "maybe", cwd=tmp_path).returncode == 2
    assert run_cli("gate", str(tmp_path / "nope.json"), cwd=tmp_path).returncode == 4


def test_cli_gate_reads_pyproject_gate_table(tmp_path):
    same = save(tmp_path, "same.json", make())
    (tmp_path / "pyproject.toml").write_text("[tool.gpudiag.gate]\nmax_idle_ratio = 0.01\n")
    r = run_cli("gate", str(same), "-f", "json", cwd=tmp_path)
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "failed"
    r = run_cli("gate", str(same), "--max-idle-ratio", "0.9", cwd=tmp_path)
    assert r.returncode == 0
    (tmp_path / "pyproject.toml").write_text("[tool.gpudiag.gate]\nmax_iddle = 0.01\n")
    r = run_cli("gate", str(same), cwd=tmp_path)
    assert r.returncode == 2 and "max_iddle" in r.stderr and "hint: known settings" in r.stderr


def test_cli_save_baseline_round_trips(tmp_path, kineto_sets):
    src = kineto_sets / "sampled_2rank_a2a"
    r = run_cli(
        "gate",
        str(src),
        "--save-baseline",
        str(tmp_path / "b.json"),
        "--max-idle-ratio",
        "1",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    saved = diagnosis_from_json(json.loads((tmp_path / "b.json").read_text()))
    assert saved.run.ranks == 2
    r = run_cli("diff", str(src), str(tmp_path / "b.json"), "-f", "json", cwd=tmp_path)
    assert r.returncode == 0
    rows = json.loads(r.stdout)["rows"]
    assert {row["direction"] for row in rows} == {"same"}


def test_cli_analyze_markdown(kineto_sets, tmp_path):
    r = run_cli("analyze", str(kineto_sets / "sampled_2rank_a2a"), "-o", str(tmp_path / "d.md"))
    assert r.returncode == 0 and (tmp_path / "d.md").read_text().startswith("## gpudiag: 2 ranks")
    r = run_cli("analyze", str(kineto_sets / "sampled_2rank_a2a"), "-f", "markdown")
    assert "| rank |" in r.stdout
