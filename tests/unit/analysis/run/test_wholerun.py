"""Whole-run statistics from telemetry, and NVML samples joined to ranks by GPU UUID."""

import pandas as pd
import pytest
from testpaths import SCHEMA

from gpudiag.analysis.run.wholerun import whole_run
from gpudiag.api.saved import diagnosis_from_json
from gpudiag.rundir.layout import RankInfo, RunManifest, SourceStatus

MS = 1_000_000


def telemetry(
    rank: int, durations_ms: list[float], data_ms: float = 1.0, profiled: tuple[int, ...] = ()
) -> pd.DataFrame:
    rows, t = [], 1_000 * MS
    for i, d in enumerate(durations_ms):
        rows.append(
            {
                "rank": rank,
                "step": i,
                "start_ns": t,
                "end_ns": t + int(d * MS),
                "duration_ns": int(d * MS),
                "data_wait_ns": int(data_ms * MS),
                "comm_wait_ns": None,
                "backward_ns": None,
                "profiled": i in profiled,
                "host": "n0",
            }
        )
        t += int(d * MS)
    df = pd.DataFrame(rows)
    for c in ("data_wait_ns", "comm_wait_ns", "backward_ns"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    return df


def samples(
    uuid: str, n: int, util: float, throttle: int | None, t0: int = 1_000 * MS
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "time_ns": [t0 + i * 100 * MS for i in range(n)],
            "host": "n0",
            "gpu_uuid": uuid,
            "index": 0,
            "util_ratio": util,
            "mem_util_ratio": 0.5,
            "mem_bytes": 1e9,
            "power_w": [300.0 + i for i in range(n)],
            "sm_clock_mhz": 1800.0,
            "temp_c": 70.0,
            "throttle_reasons": pd.array([throttle] * n, dtype="Int64"),
        }
    )


def manifest(**kw) -> RunManifest:
    return RunManifest(
        ranks=[RankInfo(rank=0, gpu_uuid="GPU-a"), RankInfo(rank=1, gpu_uuid="GPU-b")],
        sources={"nvml": SourceStatus(True), "telemetry": SourceStatus(True)},
        **kw,
    )


def test_first_step_is_warm_up_and_left_out_of_statistics():
    tele = telemetry(0, [900, 100, 110, 100, 120])
    w, _ = whole_run(tele, None, None)
    r = w.ranks[0]
    assert r.steps == 4
    assert r.step_time_ns_median == 105 * MS
    assert r.step_time_ns_max == 120 * MS
    assert r.data_wait_ratio == pytest.approx(4 / 430)
    assert r.comm_wait_ratio is None  # not measured stays unknown, never 0
    assert len(w.steps) == 5


def test_profiled_steps_and_the_trace_writing_step_are_left_out():
    tele = telemetry(0, [900, 100, 100, 300, 400, 500, 100, 100], profiled=(3, 4))
    w, _ = whole_run(tele, None, None)
    r = w.ranks[0]
    assert r.steps == 4  # steps 1, 2, 6, 7: 0 is warm-up, 3-4 profiled, 5 wrote the trace
    assert r.step_time_ns_max == 100 * MS
    assert [s.profiled for s in w.steps] == [False] * 3 + [True] * 2 + [False] * 3


def test_nvml_joined_by_uuid_with_slowdown_evidence():
    tele = pd.concat([telemetry(0, [100] * 6), telemetry(1, [100] * 6)])
    smp = pd.concat(
        [
            samples("GPU-a", 6, 0.9, 0x1),  # GpuIdle only: not a slowdown
            samples("GPU-b", 6, 0.4, 0x40 | 0x4),  # HwThermalSlowdown + SwPowerCap
            samples("GPU-c", 3, 0.0, None),  # a GPU no rank used
        ]
    )
    w, findings = whole_run(tele, smp, manifest())
    by = {g.gpu_uuid: g for g in w.gpus}
    assert by["GPU-a"].rank == 0 and by["GPU-a"].util_ratio == pytest.approx(0.9)
    assert by["GPU-a"].slowdown_ratio == 0.0
    assert by["GPU-b"].rank == 1 and by["GPU-b"].slowdown_ratio == 1.0
    assert by["GPU-b"].slowdown_reasons == ["HwThermalSlowdown", "SwPowerCap"]
    assert by["GPU-b"].power_w == pytest.approx(302.5)
    assert by["GPU-c"].rank is None and by["GPU-c"].slowdown_ratio is None
    assert findings == []


def test_missing_nvml_is_a_finding_with_the_reason_not_zeros():
    m = manifest(exit_code=143)
    m.sources["nvml"] = SourceStatus(False, "libnvidia-ml.so.1 not found")
    w, findings = whole_run(telemetry(0, [100] * 4), None, m)
    assert w.gpus == []
    msgs = {f.kind: f.message for f in findings}
    assert "libnvidia-ml.so.1 not found" in msgs["source_missing"]
    assert "143" in msgs["job_failed"]


def test_no_telemetry_gives_no_whole_run():
    w, findings = whole_run(None, None, None)
    assert w is None and findings == []


def test_diagnosis_with_whole_run_round_trips_and_matches_the_schema():
    import json

    jsonschema = pytest.importorskip("jsonschema")
    from builders import gpu_run

    from gpudiag.analysis.diagnose import build_diagnosis
    from gpudiag.analysis.rank.analyse import rank_result
    from gpudiag.config import Thresholds

    th = Thresholds()
    tele = pd.concat([telemetry(0, [100] * 6), telemetry(1, [100] * 6)])
    w, extra = whole_run(tele, samples("GPU-a", 6, 0.9, 0x8), manifest())
    d = build_diagnosis(
        [rank_result(t, th) for t in gpu_run().ranks], th, whole_run=w, extra_findings=extra
    )
    doc = json.loads(json.dumps(d.to_json()))
    schema = SCHEMA
    jsonschema.validate(doc, json.loads(schema.read_text()))
    assert diagnosis_from_json(doc) == d
