"""A CPU-only run gets one note that GPU telemetry does not apply: no stderr warning, no finding.

A GPU host whose NVML cannot load still gets the warning and the finding (the reason
matters there).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_wholerun import telemetry

from gpudiag.analysis.run.wholerun import gpu_telemetry_note, whole_run
from gpudiag.collect.launch import captures
from gpudiag.collect.launch.run_setup import RunOptions
from gpudiag.collect.samplers import nvml
from gpudiag.rundir.layout import NO_NVIDIA_DRIVER, RankInfo, RunManifest, SourceStatus


def _manifest(reason: str, devices: list[str | None], uuid: str | None = None) -> RunManifest:
    return RunManifest(
        ranks=[RankInfo(rank=i, device=d, gpu_uuid=uuid) for i, d in enumerate(devices)],
        sources={"nvml": SourceStatus(False, reason), "telemetry": SourceStatus(True)},
    )


@pytest.mark.parametrize(
    ("reason", "devices", "why"),
    [
        (NO_NVIDIA_DRIVER, [None], "no NVIDIA driver on this host"),
        (
            "nvidia-ml-py is not installed: pip install 'gpudiag[collect]'",
            ["cpu", "cpu"],
            "every rank ran on the CPU",
        ),
    ],
)
def test_a_cpu_only_run_gets_a_note_not_a_finding(reason, devices, why):
    m = _manifest(reason, devices)
    note = gpu_telemetry_note(m)
    assert (
        note is not None and note.startswith("GPU telemetry (NVML) does not apply") and why in note
    )
    _, findings = whole_run(telemetry(0, [100] * 4), None, m)
    assert not [f for f in findings if f.kind == "source_missing"]


@pytest.mark.parametrize("devices", [["cuda:0", "cuda:1"], ["cpu", "cuda:0"], [None]])
def test_a_gpu_run_without_nvml_keeps_the_finding(devices):
    m = _manifest("libnvidia-ml.so.1 not found", devices)
    assert gpu_telemetry_note(m) is None
    _, findings = whole_run(telemetry(0, [100] * 4), None, m)
    assert [f.message for f in findings if f.kind == "source_missing"] == [
        "GPU samples (NVML) not captured: libnvidia-ml.so.1 not found"
    ]


def test_the_rank_with_a_gpu_uuid_is_not_a_cpu_rank():
    assert gpu_telemetry_note(_manifest("x", ["cpu"], uuid="GPU-a")) is None


class _NoNvml:
    """An NVML whose init fails as it does without the NVIDIA library."""

    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


@pytest.mark.parametrize("driver", [False, True])
def test_the_launcher_warns_only_where_there_is_a_gpu_driver(monkeypatch, tmp_path, driver):
    logged: list[str] = []
    monkeypatch.setattr(captures, "log", logged.append)
    monkeypatch.setattr(captures, "nvidia_driver_loaded", lambda: driver)
    m = RunManifest()
    opts = RunOptions(["true"], nvml_backend=_NoNvml())
    sampler, mod = captures.start_nvml(opts, tmp_path, "h", m)
    assert sampler is None and mod is None
    assert m.sources["nvml"].captured is False
    if driver:
        assert len(logged) == 1 and "NVML not available" in logged[0]
    else:
        assert logged == [] and m.sources["nvml"].reason == NO_NVIDIA_DRIVER


def test_the_driver_is_seen_from_its_proc_directory(tmp_path: Path):
    assert nvml.nvidia_driver_loaded(tmp_path) is True
    assert nvml.nvidia_driver_loaded(tmp_path / "absent") is False
