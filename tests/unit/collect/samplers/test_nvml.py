"""NVML sampler against a fake NVML backend and a fake clock."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpudiag.collect.samplers.nvml import NvmlSampler, load_nvml


class NVMLError(Exception):
    pass


class FakeNvml:
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self, n: int = 2, fail_util_after: int | None = None) -> None:
        self.n = n
        self.util_calls = 0
        self.fail_util_after = fail_util_after
        self.inited = False

    def nvmlInit(self) -> None:
        self.inited = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54"

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}-aaaa"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"Fake H100"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self.util_calls += 1
        if self.fail_util_after is not None and self.util_calls > self.fail_util_after:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=50 + h, memory=20)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=1 << 30, total=80 << 30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 250_000

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980 if kind == 1 else 2619

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 61

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x4

    def nvmlDeviceGetPcieThroughput(self, h: int, kind: int) -> int:
        raise NVMLError("Not Supported")


class FakeTime:
    def __init__(self, start_ns: int = 1_700_000_000_000_000_000, stop_after: int = 5) -> None:
        self.now = start_ns
        self.waits: list[float] = []
        self.stop_after = stop_after

    def clock(self) -> int:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += int(seconds * 1e9)
        return len(self.waits) >= self.stop_after


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_interval_and_uuid_mapping(tmp_path: Path) -> None:
    # GIVEN a fake NVML with two GPUs and a fake clock
    ft = FakeTime(stop_after=4)
    out = tmp_path / "nvml" / "h.jsonl"
    s = NvmlSampler(FakeNvml(), out, "h", interval_s=0.25, clock=ft.clock, wait=ft.wait)
    # WHEN the loop runs
    s.run()
    s.stop()
    recs = _read(out)
    # THEN a header, then one sample per GPU per tick, 0.25 s apart, identified by UUID
    assert recs[0]["type"] == "header"
    assert [g["uuid"] for g in recs[0]["gpus"]] == ["GPU-00000000-aaaa", "GPU-00000001-aaaa"]
    samples = recs[1:]
    assert len(samples) == 8
    times = sorted({r["time_ns"] for r in samples})
    assert [b - a for a, b in itertools.pairwise(times)] == [250_000_000] * 3
    assert ft.waits == [0.25] * 4
    by_uuid = {r["gpu_uuid"]: r for r in samples}
    assert by_uuid["GPU-00000001-aaaa"]["util_ratio"] == pytest.approx(0.51)
    assert by_uuid["GPU-00000000-aaaa"]["power_w"] == 250.0
    assert by_uuid["GPU-00000000-aaaa"]["throttle_reasons"] == 4  # old function name probed


def test_unsupported_fields_are_null_not_zero(tmp_path: Path) -> None:
    ft = FakeTime(stop_after=1)
    out = tmp_path / "s.jsonl"
    s = NvmlSampler(FakeNvml(n=1), out, "h", clock=ft.clock, wait=ft.wait)
    s.run()
    rec = _read(out)[1]
    assert rec["pcie_rx_bytes_s"] is None
    assert rec["pcie_tx_bytes_s"] is None
    assert rec["nvlink_rx_bytes_s"] is None
    assert rec["energy_j"] is None  # the fake lacks the function entirely
    assert rec["mem_used_bytes"] == 1 << 30


def test_nvml_error_mid_run_keeps_sampling(tmp_path: Path) -> None:
    # GIVEN utilisation calls that start failing after the 3rd call
    ft = FakeTime(stop_after=5)
    out = tmp_path / "s.jsonl"
    s = NvmlSampler(FakeNvml(n=1, fail_util_after=3), out, "h", clock=ft.clock, wait=ft.wait)
    s.run()
    samples = _read(out)[1:]
    # THEN the sampler did not stop, and only the failing field went null
    assert len(samples) == 5
    assert [r["util_ratio"] is None for r in samples] == [False] * 3 + [True] * 2
    assert all(r["temp_c"] == 61 for r in samples)
    assert s.errors == []


def test_gpu_filter_and_latest(tmp_path: Path) -> None:
    ft = FakeTime(stop_after=1)
    s = NvmlSampler(
        FakeNvml(),
        tmp_path / "s.jsonl",
        "h",
        clock=ft.clock,
        wait=ft.wait,
        gpus=["GPU-00000001-aaaa"],
    )
    s.run()
    assert list(s.latest) == ["GPU-00000001-aaaa"]


def test_writer_failure_stops_sampler_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ft = FakeTime(stop_after=3)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    s = NvmlSampler(FakeNvml(n=1), blocker / "s.jsonl", "h", clock=ft.clock, wait=ft.wait)
    s.run()
    assert len(s.errors) == 1
    assert "NVML sampler stopped" in capsys.readouterr().err


def test_load_nvml_reports_reason() -> None:
    class Broken:
        def nvmlInit(self) -> None:
            raise NVMLError("NVML Shared Library Not Found")

    r = load_nvml(Broken())
    assert r.nvml is None
    assert "libnvidia-ml.so.1 not found" in r.reason
    assert "nvmlInit" in load_nvml(object()).reason


def test_real_thread_stops(tmp_path: Path) -> None:
    s = NvmlSampler(FakeNvml(n=1), tmp_path / "s.jsonl", "h", interval_s=0.01)
    s.start()
    import time

    time.sleep(0.1)
    s.stop()
    n = s.samples_written
    assert n >= 3
    time.sleep(0.05)
    assert s.samples_written == n


class LostNvml(FakeNvml):
    """GPU 1 answers 2 rounds, then every call on it fails (as NVML_ERROR_GPU_IS_LOST
    does); the calls of round ``block_round`` block for 3 s (the fake clock moves on)."""

    def __init__(self, ft: FakeTime, block_round: int | None = None) -> None:
        super().__init__(n=2)
        self.ft, self.block_round, self.rounds = ft, block_round, 0

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        if h == 0:
            self.rounds += 1
            if self.rounds == self.block_round:
                self.ft.now += 3_000_000_000
        return super().nvmlDeviceGetUtilizationRates(h)

    def __getattribute__(self, name: str) -> object:
        attr = object.__getattribute__(self, name)
        if not name.startswith("nvmlDeviceGet") or name == "nvmlDeviceGetCount":
            return attr

        def call(h: int, *a: object) -> object:
            if h == 1 and object.__getattribute__(self, "rounds") > 2:
                raise NVMLError("GPU is lost")
            return attr(h, *a)

        return call


def test_lost_gpu_and_blocked_round_are_reported_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN GPU 1 lost after round 2 and a round (the 4th) whose calls block for 3 s
    ft = FakeTime(stop_after=6)
    s = NvmlSampler(
        LostNvml(ft, block_round=4),
        tmp_path / "s.jsonl",
        "h",
        clock=ft.clock,
        wait=ft.wait,
        interval_s=0.1,
    )
    s.run()
    # THEN sampling went on, GPU 1's later samples are null, each problem is said once
    samples = [r for r in _read(tmp_path / "s.jsonl")[1:] if r["index"] == 1]
    assert len(samples) == 6
    assert [r["temp_c"] is None for r in samples] == [False] * 2 + [True] * 4
    assert len(s.errors) == 2
    assert s.errors[0].startswith("NVML: GPU 1 (GPU-00000001-aaaa) stopped answering at ")
    assert "NVMLError: GPU is lost" in s.errors[0]
    assert s.errors[1].startswith("NVML sampling slow: one round of NVML calls took 3.0 s")
    assert capsys.readouterr().err.count("gpudiag: NVML") == 2
