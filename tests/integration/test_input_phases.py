"""A job's own batch function that slows down reads as input-bound (issue 30, point 7).

A real 2-rank gloo job under ``gpudiag run`` whose batches come from its own generator (no
DataLoader, so no ``DataLoader.__next__`` wait is measured) takes 0.3 s more per batch
from step ``ONSET`` on (the injected truth; its steps grow ×4). The step telemetry's
pre-forward phase carries it: the first live alert is input-bound (``data_bound``) on both
ranks within two steps of the onset, and the diagnosis of the same run directory, which
has no trace (``--profile-steps off``: telemetry only), says data-bound. One run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_live_alerts import ONSET, check_first_alert, offline, run_job

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SLOW_S = 0.3


@pytest.fixture(scope="module")
def res(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("own_batches") / "run"
    r = run_job(out, "--own-batches", "--slow-batch-s", str(SLOW_S), profile="off", timeout=300)
    r["out"] = out
    return r


def test_the_slower_batch_function_is_an_input_bound_alert_within_two_steps(res) -> None:
    fig = check_first_alert(res, "data_bound", [0, 1])
    print(f"own batches: {fig}")


def test_the_phases_are_in_the_telemetry_and_carry_the_injected_time(res) -> None:
    pre: dict[int, list[int]] = {}
    for line in (res["out"] / "ranks" / "rank-0.steps.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "step":
            assert {"pre_forward_ns", "forward_ns", "optimizer_ns"} <= rec.keys()
            assert rec["data_fetches"] == 0  # no DataLoader
            pre.setdefault(rec["step"] >= ONSET, []).append(rec["pre_forward_ns"])
    before = sorted(pre[False])[len(pre[False]) // 2]
    after = sorted(pre[True])[len(pre[True]) // 2]
    print(f"pre-forward median: {before / 1e6:.1f} ms before the onset, {after / 1e6:.1f} after")
    assert after - before >= 0.8 * SLOW_S * 1e9


def test_the_telemetry_only_diagnosis_says_input_bound(res) -> None:
    doc = offline(res["out"])
    assert doc["run"]["mode"] == "telemetry", doc["run"]
    print("verdict:", doc["verdict"]["headline"])
    assert doc["verdict"]["bottleneck"] == "data", doc["verdict"]
    assert [f["ranks"] for f in doc["findings"] if f["kind"] == "data_bound"] == [[0, 1]]
