"""Overhead of `gpudiag run` on the demo DDP job, and NVML sampler CPU cost (fake backend).

    python benchmarks/bench_run_overhead.py [--pairs 3] [--steps 120] [--batch 4096]

Step times come from the demo itself (rank 0, perf_counter around each iteration,
first 10 steps skipped). Runs alternate plain / under gpudiag so drift hits both. The
profiler window is placed after the last step, so this measures the always-on part:
step telemetry, DataLoader/collective/backward wrappers. The sampler figure is process
CPU time / wall time of an NvmlSampler at 10 Hz over 8 fake GPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "gpudiag" / "demo" / "train.py"


def _median_step(cmd: list[str], time_file: Path, env: dict[str, str]) -> float:
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ts = [float(x) for x in time_file.read_text().split()]
    return statistics.median(ts[10:])


def bench_hook(n: int = 20000) -> None:
    """In-process cost of the always-on per-step work (no torch step, no profiler)."""
    from gpudiag.collect.rank.hook import RankHook

    with tempfile.TemporaryDirectory() as d:
        h = RankHook(Path(d), rank=0, local_rank=0, world_size=1, window=None)
        h.end_step()  # opens the file, writes the header
        t0 = time.perf_counter()
        for _ in range(n):
            h.add_data_wait(1000)
            h.end_step()
        dt = (time.perf_counter() - t0) / n
    print(f"rank hook, per step (record + flushed write + control poll): {dt * 1e6:.1f} µs")


def bench_run(pairs: int, steps: int, hidden: int, batch: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = Path(tempfile.mkdtemp())
    job = [
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(DEMO),
        "--steps",
        str(steps),
        "--hidden",
        str(hidden),
        "--layers",
        "3",
        "--batch",
        str(batch),
        "--time-file",
        str(tmp / "t"),
    ]
    plain, wrapped = [], []
    for i in range(pairs):
        plain.append(_median_step(job, tmp / "t", env))
        g = [
            sys.executable,
            "-m",
            "gpudiag",
            "run",
            "--quiet",
            "--no-analyze",
            "--out",
            str(tmp / f"run{i}"),
            "--profile-steps",
            f"{steps + 1}:{steps + 2}",
            "--",
            *job,
        ]
        wrapped.append(_median_step(g, tmp / "t", env))
    p, w = statistics.median(plain), statistics.median(wrapped)
    print(
        f"demo DDP (2 ranks, gloo, CPU), median step: plain {p * 1e3:.2f} ms, "
        f"gpudiag run {w * 1e3:.2f} ms, overhead {(w / p - 1) * 100:+.2f}%"
    )
    print(
        "  per pair (plain/wrapped ms): "
        + ", ".join(f"{a * 1e3:.2f}/{b * 1e3:.2f}" for a, b in zip(plain, wrapped, strict=True))
    )


class _FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 8

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=90, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=1 << 34, total=1 << 36)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 400_000

    def nvmlDeviceGetClockInfo(self, h: int, k: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, h: int, k: int) -> int:
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0

    def nvmlDeviceGetPcieThroughput(self, h: int, k: int) -> int:
        return 1000


def bench_sampler(seconds: float) -> None:
    from gpudiag.collect.samplers.nvml import NvmlSampler

    with tempfile.TemporaryDirectory() as d:
        s = NvmlSampler(_FakeNvml(), Path(d) / "s.jsonl", "h", interval_s=0.1)
        c0, t0 = time.process_time(), time.monotonic()
        s.start()
        time.sleep(seconds)
        s.stop()
        cpu, wall = time.process_time() - c0, time.monotonic() - t0
    print(
        f"NVML sampler, 10 Hz x 8 fake GPUs: {s.samples_written} samples, "
        f"CPU {cpu / wall * 100:.2f}% of one core ({cpu / max(1, s.samples_written) * 1e6:.0f} "
        f"µs per GPU sample)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4096, help="the demo's compute-bound default")
    ap.add_argument("--sampler-seconds", type=float, default=5.0)
    a = ap.parse_args()
    bench_hook()  # the step phases' hooks: benchmarks/bench_phases.py (CPU time)
    bench_sampler(a.sampler_seconds)
    bench_run(a.pairs, a.steps, a.hidden, a.batch)


if __name__ == "__main__":
    main()
