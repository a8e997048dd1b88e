"""Cost of one run-conditions sample (gpudiag/collect/samplers/conditions.py) on this host.

    python benchmarks/bench_conditions.py [--samples 200] [--gpus 8] [--real-nvml]

Times ``ConditionsSampler.read`` against the real /proc (every process's stat, the job
tree rooted at this process, loadavg, meminfo, PSI), without and with a fake NVML backend
of N GPUs (clock, temperature, throttle reasons, running processes), or with this host's
NVML (``--real-nvml``, pynvml and a driver needed). The sampler runs in
the ``gpudiag run`` process at 1 Hz, so µs per sample / 1e6 is its share of one core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpudiag.collect.samplers.conditions import ConditionsSampler  # noqa: E402


class FakeNvml:
    """Enough NVML for the conditions sampler; each call costs what a Python call costs."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=os.getpid())]

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        return []


def per_sample_us(s: ConditionsSampler, n: int) -> tuple[list[float], list[float]]:
    """(wall µs, CPU µs of this thread) of each of ``n`` samples."""
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        s.read(time.time_ns())
        wall.append((time.perf_counter_ns() - t0) / 1000)
        cpu.append((time.thread_time_ns() - c0) / 1000)
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--real-nvml", action="store_true", help="this host's GPUs through pynvml")
    a = p.parse_args()
    backends: list[tuple[str, object]] = [("no NVML", None)]
    if a.real_nvml:
        import pynvml

        pynvml.nvmlInit()
        backends.append((f"{pynvml.nvmlDeviceGetCount()} real GPU(s)", pynvml))
    else:
        backends.append((f"{a.gpus} fake GPUs", FakeNvml(a.gpus)))
    nproc = sum(1 for n in os.listdir("/proc") if n.isdigit())
    with tempfile.TemporaryDirectory() as d:
        for label, nv in backends:
            s = ConditionsSampler(Path(d) / "c.jsonl", "h", job_pid=os.getpid(), nvml=nv)
            wall, cpu = per_sample_us(s, a.samples)
            med = statistics.median(cpu)
            print(
                f"conditions sample, {nproc} processes on the host, {label}: CPU median "
                f"{med:.0f} µs (p90 {sorted(cpu)[int(0.9 * len(cpu))]:.0f}), wall median "
                f"{statistics.median(wall):.0f} µs per sample; at 1 Hz {med / 1e4:.3f}% of a core"
            )


if __name__ == "__main__":
    main()
