"""Loaders of the capture formats: step telemetry and NVML samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.errors import InputError
from gpudiag.traces.runfiles.samples import load_samples
from gpudiag.traces.runfiles.telemetry import load_steps

HEADER = {"type": "header", "format": "gpudiag.steps", "version": 1, "rank": 1, "host": "h"}


def _step(i: int, comm: int | None = None) -> dict:
    return {
        "type": "step",
        "step": i,
        "start_ns": 100 * i,
        "end_ns": 100 * i + 90,
        "data_wait_ns": 5,
        "comm_wait_ns": comm,
        "backward_ns": 7,
        "profiled": i == 1,
    }


def _write(run: Path, lines: list[str]) -> None:
    (run / "ranks").mkdir(parents=True)
    (run / "ranks" / "rank-1.steps.jsonl").write_text("\n".join(lines))


def test_steps_truncated_last_line_and_nullable(tmp_path: Path) -> None:
    lines = [json.dumps(HEADER), json.dumps(_step(0)), json.dumps(_step(1, 3)), '{"type":"st']
    _write(tmp_path, lines)
    df = load_steps(tmp_path)
    assert list(df["step"]) == [0, 1]
    assert list(df["duration_ns"]) == [90, 90]
    assert df["comm_wait_ns"].isna().tolist() == [True, False]
    assert str(df["comm_wait_ns"].dtype) == "Int64"
    assert df["profiled"].tolist() == [False, True]


def test_steps_restart_keeps_last_segment(tmp_path: Path) -> None:
    lines = [
        json.dumps(HEADER),
        json.dumps(_step(0)),
        json.dumps(_step(1)),
        json.dumps(HEADER),
        json.dumps(_step(0)),
        "",
    ]
    _write(tmp_path, lines)
    assert list(load_steps(tmp_path)["step"]) == [0]


@pytest.mark.parametrize(
    "first", ["garbage", json.dumps({**HEADER, "version": 99}), json.dumps(_step(0))]
)
def test_steps_garbage_is_input_error(tmp_path: Path, first: str) -> None:
    _write(tmp_path, [first, json.dumps(_step(0)), ""])
    with pytest.raises(InputError):
        load_steps(tmp_path)


def test_no_telemetry_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        load_steps(tmp_path)


def test_samples_nan_for_unsupported(tmp_path: Path) -> None:
    (tmp_path / "nvml").mkdir()
    hdr = {"type": "header", "format": "gpudiag.nvml", "version": 1, "host": "n1", "gpus": []}
    s = {
        "type": "sample",
        "time_ns": 5,
        "gpu_uuid": "GPU-1",
        "index": 0,
        "util_ratio": 0.5,
        "mem_used_bytes": 10,
        "power_w": None,
        "throttle_reasons": 4,
    }
    (tmp_path / "nvml" / "n1.jsonl").write_text(f'{json.dumps(hdr)}\n{json.dumps(s)}\n{{"ty')
    df = load_samples(tmp_path)
    assert len(df) == 1
    assert df.loc[0, "util_ratio"] == 0.5
    assert df.loc[0, "mem_bytes"] == 10
    assert df["power_w"].isna().all()
    assert df["pcie_rx_bytes_s"].isna().all()
    assert df.loc[0, "host"] == "n1"
    assert load_samples(tmp_path / "nothing").empty
