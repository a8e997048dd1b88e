"""Background sampler with injected clock and NVML backend, writing per-GPU samples.

The sampler runs in the ``gpudiag`` parent process (never in a rank), one thread per
node. Each tick it reads every selected GPU and appends one JSON line per GPU to
``nvml/<host>.jsonl``, flushed per line. Every NVML call is wrapped on its own: a call
that is unsupported or fails gives ``null`` for that field, never 0. The format is
documented in docs/run-directory.md.

Failures mid-run never reach the job (it runs in other processes) and are reported once
each in :attr:`NvmlSampler.errors` (the manifest's ``diagnosis_incomplete``) and on
stderr: a GPU that stops answering every call (``NVML_ERROR_GPU_IS_LOST``), a round of
calls that blocks for more than ``max(1 s, 10 intervals)``, a sampler thread still
blocked in NVML 5 s after the job ended (left behind; its samples end there), and a
sample file that cannot be written (the sampler stops).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path
from typing import Any

from gpudiag._support.records import dataclass
from gpudiag.collect.samplers.sampler import (
    Clock,
    PeriodicSampler,
    Wait,
    clock_reasons_fn,
    nvml_call,
)

FORMAT = "gpudiag.nvml"
FORMAT_VERSION = 1


@dataclass
class GpuIdentity:
    """One GPU as NVML sees it on this node."""

    index: int
    uuid: str
    name: str | None = None
    memory_total_bytes: int | None = None
    pci_bus_id: str | None = None


@dataclass
class NvmlOpen:
    """Result of trying to initialise NVML: the module, or the reason it is unusable."""

    nvml: Any | None
    reason: str = ""
    driver_version: str | None = None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


NVIDIA_DRIVER_DIR = Path("/proc/driver/nvidia")  # there while the NVIDIA kernel driver is loaded


def nvidia_driver_loaded(proc_dir: Path = NVIDIA_DRIVER_DIR) -> bool:
    """Whether this host runs the NVIDIA kernel driver (without it there is no GPU to sample)."""
    return proc_dir.is_dir()


def load_nvml(nvml: Any | None = None) -> NvmlOpen:
    """Import and initialise ``pynvml`` (or use ``nvml``), returning why not on failure."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return NvmlOpen(None, "nvidia-ml-py is not installed: pip install 'gpudiag[collect]'")
        nvml = pynvml
    if not hasattr(nvml, "nvmlInit"):
        return NvmlOpen(
            None, "pynvml module is shadowed or broken (no nvmlInit); reinstall nvidia-ml-py"
        )
    try:
        nvml.nvmlInit()
    except Exception as e:
        return NvmlOpen(None, _nvml_reason(e))
    driver = nvml_call(nvml, "nvmlSystemGetDriverVersion")
    return NvmlOpen(nvml, "", _text(driver) if driver is not None else None)


def _nvml_reason(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    if "LibraryNotFound" in type(e).__name__ or "not found" in msg.lower():
        return f"libnvidia-ml.so.1 not found ({msg})"
    return f"NVML init failed ({msg})"


def list_gpus(nvml: Any) -> list[tuple[GpuIdentity, Any]]:
    """Every GPU NVML reports, with its handle; GPUs without a UUID are skipped."""
    count = nvml_call(nvml, "nvmlDeviceGetCount") or 0
    out: list[tuple[GpuIdentity, Any]] = []
    for i in range(int(count)):
        h = nvml_call(nvml, "nvmlDeviceGetHandleByIndex", i)
        if h is None:
            continue
        uuid = nvml_call(nvml, "nvmlDeviceGetUUID", h)
        if uuid is None:
            continue
        name = nvml_call(nvml, "nvmlDeviceGetName", h)
        mem = nvml_call(nvml, "nvmlDeviceGetMemoryInfo", h)
        pci = nvml_call(nvml, "nvmlDeviceGetPciInfo", h)
        bus = getattr(pci, "busId", None) if pci is not None else None
        out.append(
            (
                GpuIdentity(
                    index=i,
                    uuid=_text(uuid),
                    name=_text(name) if name is not None else None,
                    memory_total_bytes=int(mem.total) if mem is not None else None,
                    pci_bus_id=_text(bus) if bus is not None else None,
                ),
                h,
            )
        )
    return out


def gpu_pids(nvml: Any, handle: Any) -> set[int] | None:
    """Host PIDs running compute/graphics work on a GPU, or None when NVML cannot tell."""
    pids: set[int] = set()
    ok = False
    for kind in ("Compute", "Graphics"):
        for suffix in ("_v3", "_v2", ""):
            procs = nvml_call(nvml, f"nvmlDeviceGet{kind}RunningProcesses{suffix}", handle)
            if procs is not None:
                ok = True
                pids.update(int(p.pid) for p in procs)
                break
    return pids if ok else None


@dataclass
class _Rate:
    """Turns a cumulative counter into a per-second rate between consecutive samples."""

    last: dict[str, tuple[int, float]] = field(default_factory=dict)

    def update(self, key: str, t_ns: int, value: float | None) -> float | None:
        if value is None:
            self.last.pop(key, None)
            return None
        prev = self.last.get(key)
        self.last[key] = (t_ns, value)
        if prev is None or t_ns <= prev[0] or value < prev[1]:
            return None
        return (value - prev[1]) / ((t_ns - prev[0]) / 1e9)


class NvmlSampler(PeriodicSampler):
    """Samples the selected GPUs every ``interval_s`` on a background thread.

    ``clock`` returns epoch nanoseconds (``time.time_ns``, the clock Kineto's
    ``baseTimeNanoseconds`` uses); ``wait(seconds)`` sleeps and returns True when the
    sampler should stop. Both are injected so tests run with a fake NVML and fake time.
    """

    thread_name = "gpudiag-nvml"
    blocked_message = (
        "NVML sampler still blocked in an NVML call 5 s after the job ended; "
        "left behind, its samples end there"
    )
    watch_slow_rounds = True

    def __init__(
        self,
        nvml: Any,
        path: Path,
        host: str,
        interval_s: float = 0.1,
        clock: Clock = time.time_ns,
        wait: Wait | None = None,
        gpus: Iterable[str] | None = None,
        driver_version: str | None = None,
    ) -> None:
        super().__init__(path, interval_s, clock, wait)
        self.nvml = nvml
        self.host = host
        self.driver_version = driver_version
        wanted = set(gpus) if gpus is not None else None
        self.gpus = [(g, h) for g, h in list_gpus(nvml) if wanted is None or g.uuid in wanted]
        self.latest: dict[str, dict[str, Any]] = {}
        self.samples_written = 0
        self._rates = _Rate()
        self._last_error: str | None = None
        self._answered: set[str] = set()
        self._lost: set[str] = set()
        self._slow_reported = False
        self._reason_fn = clock_reasons_fn(nvml)

    # -- writing -------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The file's first record: the host, the cadence and the GPUs sampled."""
        return {
            "type": "header",
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "host": self.host,
            "pid": os.getpid(),
            "clock": "time.time_ns",
            "interval_s": self.interval_s,
            "driver_version": self.driver_version,
            "gpus": [g.__dict__ for g, _ in self.gpus],
        }

    # -- sampling ------------------------------------------------------------------

    def read_gpu(self, gpu: GpuIdentity, h: Any, t_ns: int) -> dict[str, Any]:
        """One sample of one GPU; each field is None when its NVML call fails."""
        nv, get = self.nvml, self._get
        self._last_error = None
        util = get("nvmlDeviceGetUtilizationRates", h)
        mem = get("nvmlDeviceGetMemoryInfo", h)
        power_mw = get("nvmlDeviceGetPowerUsage", h)
        sm = get("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
        memclk = get("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2))
        temp = get("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        reasons = get(self._reason_fn, h) if self._reason_fn else None
        rx = get("nvmlDeviceGetPcieThroughput", h, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
        tx = get("nvmlDeviceGetPcieThroughput", h, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
        energy = get("nvmlDeviceGetTotalEnergyConsumption", h)
        nvl_rx, nvl_tx = self._nvlink_totals(h)
        key = gpu.uuid
        self._check_lost(gpu, t_ns, (util, mem, power_mw, sm, temp))
        return {
            "type": "sample",
            "time_ns": t_ns,
            "gpu_uuid": gpu.uuid,
            "index": gpu.index,
            "util_ratio": util.gpu / 100.0 if util is not None else None,
            "mem_util_ratio": util.memory / 100.0 if util is not None else None,
            "mem_used_bytes": int(mem.used) if mem is not None else None,
            "mem_total_bytes": int(mem.total) if mem is not None else None,
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "energy_j": energy / 1000.0 if energy is not None else None,
            "sm_clock_mhz": sm,
            "mem_clock_mhz": memclk,
            "temp_c": temp,
            "throttle_reasons": int(reasons) if reasons is not None else None,
            # NVML reports PCIe throughput in KB/s over a 20 ms window.
            "pcie_rx_bytes_s": rx * 1024 if rx is not None else None,
            "pcie_tx_bytes_s": tx * 1024 if tx is not None else None,
            "nvlink_rx_bytes_s": self._rates.update(key + ":nvrx", t_ns, nvl_rx),
            "nvlink_tx_bytes_s": self._rates.update(key + ":nvtx", t_ns, nvl_tx),
        }

    def _get(self, name: str, *args: Any) -> Any:
        """One NVML call; None when unsupported or failing (the error is kept for a report)."""
        fn = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as e:
            self._last_error = f"{type(e).__name__}: {e}"
            return None

    def _check_lost(self, gpu: GpuIdentity, t_ns: int, core: tuple[Any, ...]) -> None:
        """Report once a GPU that answered before and now fails every basic call."""
        if any(v is not None for v in core):
            self._answered.add(gpu.uuid)
            return
        if gpu.uuid in self._answered and gpu.uuid not in self._lost:
            self._lost.add(gpu.uuid)
            when = time.strftime("%H:%M:%S", time.localtime(t_ns / 1e9))
            self._fail(
                f"NVML: GPU {gpu.index} ({gpu.uuid}) stopped answering at {when} "
                f"({self._last_error or 'every call failed'}); its later samples are null"
            )

    def _nvlink_totals(self, h: Any) -> tuple[float | None, float | None]:
        """Cumulative NVLink data KiB (rx, tx) from field values, when the GPU has NVLink."""
        nv = self.nvml
        f_tx = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        f_rx = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)
        if f_tx is None or f_rx is None:
            return None, None
        vals = nvml_call(nv, "nvmlDeviceGetFieldValues", h, [f_rx, f_tx])
        if not vals or len(vals) != 2:
            return None, None
        out: list[float | None] = []
        for v in vals:
            if getattr(v, "nvmlReturn", 1) != 0:
                out.append(None)
                continue
            value = getattr(v, "value", None)
            raw = getattr(value, "ullVal", None) if value is not None else None
            out.append(float(raw) * 1024 if raw is not None else None)
        return out[0], out[1]

    def sample_once(self) -> None:
        """Read every GPU once and append the samples."""
        self._open()
        t = self.clock()
        for gpu, h in self.gpus:
            rec = self.read_gpu(gpu, h, t)
            self.latest[gpu.uuid] = rec
            self._write_line(rec)
            self.samples_written += 1

    def _tick(self) -> bool:
        try:
            self.sample_once()
        except Exception as e:  # disk full, closed file, a broken backend
            self._fail(f"NVML sampler stopped: {type(e).__name__}: {e}")
            return False
        return True

    def _slow_round(self, took_ns: int) -> None:
        if not self._slow_reported:
            self._slow_reported = True
            self._fail(
                f"NVML sampling slow: one round of NVML calls took {took_ns / 1e9:.1f} s "
                "(a call blocked); samples are further apart from then on"
            )
