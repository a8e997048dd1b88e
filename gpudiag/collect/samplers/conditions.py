"""Samples what else the host was doing during a run: other CPU use, steal, load, memory, GPUs.

The sampler runs on a thread of the ``gpudiag run`` process (never in a rank), about once a
second for the whole run, and appends one JSON line per sample to
``conditions/<host>.jsonl`` (format in docs/run-directory.md). Each sample reads:

- ``/proc/stat``: busy, idle, iowait and steal jiffies of all CPUs;
- ``/proc/<pid>/stat`` of every process: the job's process tree (the launched command and
  its descendants) and gpudiag's own process are told apart from everything else;
- ``/proc/loadavg``, ``/proc/meminfo`` (MemAvailable) and, when the kernel has PSI,
  ``/proc/pressure/memory`` and ``/proc/pressure/cpu``;
- per GPU through NVML, when it is available: SM clock, clocks-event (throttle) reasons,
  temperature, and the processes on the GPU that are not the job's.

**CPU attribution.** Over one interval, ``other = busy - job - gpudiag`` jiffies of all
CPUs, as a share of all CPUs' time (``other_cpu_ratio``: 0.5 on a 2-CPU host is one full
core). The job's time is the sum over its live processes of the change in their own
(utime + stime) and reaped-children (cutime + cstime) times, minus, for processes that
disappeared since the last sample, what had been counted of them (their parent's
cutime now holds it). A process started and ended between two samples still counts,
through its parent's cutime. Steal (``steal_ratio``) is time the hypervisor gave to
other guests; it is not part of busy.

Every read is wrapped on its own: a file that cannot be read gives ``null`` fields. A
sample that fails as a whole is counted and logged once; a sample file that cannot be
written stops the sampler, logged once. The job never waits for the sampler.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path
from typing import Any

from gpudiag._support.records import dataclass
from gpudiag.collect.samplers.nvml import GpuIdentity, gpu_pids, list_gpus
from gpudiag.collect.samplers.sampler import (
    Clock,
    PeriodicSampler,
    Wait,
    clock_reasons_fn,
    nvml_call,
)
from gpudiag.rundir import conditions as runconditions

FORMAT = "gpudiag.conditions"
FORMAT_VERSION = 1
DEFAULT_INTERVAL_S = 1.0
TOP_OTHER = 3
TOP_OTHER_MIN_RATIO = 0.01

# nvmlClocksEventReasons bits by their manifest names (the table is gpudiag.rundir.conditions')
THROTTLE_REASONS = {bit: names[0] for bit, names in runconditions.THROTTLE_REASONS.items()}


# -- /proc parsing (pure functions over file contents) -------------------------------


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies of all CPUs from the ``cpu`` line of ``/proc/stat``."""

    busy: int
    idle: int
    iowait: int
    steal: int
    cpus: int

    @property
    def total(self) -> int:
        """Every jiffy of every CPU: busy, idle, iowait and steal."""
        return self.busy + self.idle + self.iowait + self.steal


def parse_stat(text: str) -> CpuTimes | None:
    """``/proc/stat`` → :class:`CpuTimes`; None when there is no ``cpu`` line.

    busy = user + nice + system + irq + softirq (guest time is already inside user/nice).
    """
    fields: list[int] | None = None
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:]]
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    if fields is None or len(fields) < 4:
        return None
    f = fields + [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = f[:8]
    return CpuTimes(user + nice + system + irq + softirq, idle, iowait, steal, max(cpus, 1))


@dataclass(frozen=True)
class ProcStat:
    """One process from ``/proc/<pid>/stat``: parent, name and CPU jiffies."""

    pid: int
    ppid: int
    name: str
    own: int  # utime + stime
    children: int  # cutime + cstime: reaped children


def parse_pid_stat(text: str) -> ProcStat | None:
    """``/proc/<pid>/stat`` → :class:`ProcStat`; the name may hold spaces and parentheses."""
    try:
        head, _, rest = text.rpartition(")")
        pid_s, _, name = head.partition(" (")
        f = rest.split()
        # fields after the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
        return ProcStat(
            int(pid_s), int(f[1]), name, int(f[11]) + int(f[12]), int(f[13]) + int(f[14])
        )
    except (ValueError, IndexError):
        return None


def parse_loadavg(text: str) -> tuple[float, float, float, int | None]:
    """``/proc/loadavg`` → (1, 5, 15-minute load, runnable entities)."""
    f = text.split()
    running = int(f[3].split("/")[0]) if len(f) > 3 and "/" in f[3] else None
    return float(f[0]), float(f[1]), float(f[2]), running


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """``/proc/pressure/*`` → {"some": {"avg10": …, "avg60", "avg300", "total"}, "full": …}."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        vals: dict[str, float] = {}
        for p in pairs:
            k, _, v = p.partition("=")
            try:
                vals[k] = float(v)
            except ValueError:
                continue
        out[kind] = vals
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → {field: bytes} for the fields given in kB."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        f = rest.split()
        if f and f[0].isdigit():
            out[name] = int(f[0]) * (1024 if len(f) > 1 and f[1] == "kB" else 1)
    return out


def job_tree(procs: dict[int, ProcStat], root: int) -> set[int]:
    """``root`` and every live descendant of it."""
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    tree = {root} if root in procs else set()
    todo = [root]
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in tree:
                tree.add(c)
                todo.append(c)
    return tree


def cpu_deltas(before: dict[int, ProcStat], now: dict[int, ProcStat]) -> dict[int, int]:
    """CPU jiffies each live process used since ``before``, its reaped children included.

    A process new since ``before`` counts its whole life. A process gone since ``before``
    was reaped by its parent, whose cutime now holds its whole life: what was already
    counted of it (its total at ``before``) comes off the parent, so the parent carries
    only the gone process's last moments. Children started and reaped in between count
    through their parent's cutime.
    """
    d = {
        pid: (p.own + p.children) - ((b.own + b.children) if (b := before.get(pid)) else 0)
        for pid, p in now.items()
    }
    for pid, b in before.items():
        if pid not in now and b.ppid in d:
            d[b.ppid] -= b.own + b.children
    return d


class ProcFS:
    """Reads files below a ``/proc`` root (a directory of recorded files in tests)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = str(root)

    def read(self, rel: str) -> str | None:
        """The file's text, or None when it cannot be read."""
        try:
            fd = os.open(f"{self.root}/{rel}", os.O_RDONLY)
        except OSError:
            return None
        try:
            chunks = []
            while True:
                b = os.read(fd, 65536)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks).decode(errors="replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        """Every numeric entry of the root."""
        try:
            return [int(n) for n in os.listdir(self.root) if n.isdigit()]
        except OSError:
            return []

    def processes(self) -> dict[int, ProcStat]:
        """``/proc/<pid>/stat`` of every process that could be read (one ``read`` each)."""
        out: dict[int, ProcStat] = {}
        for pid in self.pids():
            try:
                fd = os.open(f"{self.root}/{pid}/stat", os.O_RDONLY)
            except OSError:
                continue  # gone, or not ours to read
            try:
                raw = os.read(fd, 2048)  # one line of < 400 bytes: the name is at most 64
            except OSError:
                continue
            finally:
                os.close(fd)
            st = parse_pid_stat(raw.decode(errors="replace"))
            if st is not None:
                out[pid] = st
        return out


# -- the sampler ----------------------------------------------------------------------


@dataclass
class _Prev:
    t_ns: int
    cpu: CpuTimes
    procs: dict[int, ProcStat]


@dataclass
class _GpuSeen:
    n: int = 0
    slowdown: int = 0
    sm_clock: list[int] = field(default_factory=list)
    temp: list[int] = field(default_factory=list)
    throttle: dict[str, int] = field(default_factory=dict)
    other_counts: list[int] = field(default_factory=list)
    other_pids: dict[int, str | None] = field(default_factory=dict)


class ConditionsSampler(PeriodicSampler):
    """Samples host and GPU conditions every ``interval_s`` on a background thread.

    ``job_pid`` is the launched command (set before :meth:`start` or later with
    :attr:`job_pid`); ``proc`` reads ``/proc``; ``nvml`` is an initialised NVML module or
    None; ``clock`` and ``wait`` are injected like the NVML sampler's.
    """

    thread_name = "gpudiag-conditions"
    blocked_message = "run-conditions sampler still blocked 5 s after the job ended; left"
    tick_at_stop = True

    def __init__(
        self,
        path: Path,
        host: str,
        job_pid: int | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        proc: ProcFS | None = None,
        nvml: Any = None,
        clock: Clock = time.time_ns,
        wait: Wait | None = None,
        self_pid: int | None = None,
        faults: str | None = None,
    ) -> None:
        super().__init__(path, interval_s, clock, wait)
        self.host = host
        self.job_pid = job_pid
        self.proc = proc or ProcFS()
        self.nvml = nvml
        self.self_pid = os.getpid() if self_pid is None else self_pid
        self.gpus: list[tuple[GpuIdentity, Any, int | None]] = []
        if nvml is not None:
            for g, h in list_gpus(nvml):
                mx = nvml_call(
                    nvml, "nvmlDeviceGetMaxClockInfo", h, getattr(nvml, "NVML_CLOCK_SM", 1)
                )
                self.gpus.append((g, h, int(mx) if mx is not None else None))
        self._reason_fn = clock_reasons_fn(nvml) if nvml is not None else None
        self.fail_at = _fault_samples(faults)
        self.samples: list[dict[str, Any]] = []
        self.samples_written = 0
        self.failed_samples = 0
        self.cost_ns: list[int] = []
        self._prev: _Prev | None = None
        self._gpu_seen: dict[str, _GpuSeen] = {}
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._logged_sample_error = False

    # -- one sample ----------------------------------------------------------------

    def read(self, t_ns: int) -> dict[str, Any]:
        """One sample; ratios are None on the first (they need a previous sample)."""
        stat_text = self.proc.read("stat")
        cpu = parse_stat(stat_text) if stat_text else None
        procs = self.proc.processes()
        rec: dict[str, Any] = {"type": "sample", "time_ns": t_ns}
        rec.update(self._cpu(t_ns, cpu, procs))
        la = self.proc.read("loadavg")
        try:
            l1, l5, l15, running = parse_loadavg(la) if la else (None, None, None, None)
        except (ValueError, IndexError):
            l1 = l5 = l15 = running = None
        rec["loadavg"] = [l1, l5, l15] if l1 is not None else None
        rec["procs_running"] = running
        mem = parse_meminfo(self.proc.read("meminfo") or "")
        rec["mem_available_bytes"] = mem.get("MemAvailable")
        for res in ("memory", "cpu"):
            psi_text = self.proc.read(f"pressure/{res}")
            psi = parse_psi(psi_text) if psi_text else {}
            rec[f"{res[:3]}_pressure_some_avg10"] = psi.get("some", {}).get("avg10")
            if res == "memory":
                rec["mem_pressure_full_avg10"] = psi.get("full", {}).get("avg10")
        if self.gpus:
            tree = job_tree(procs, self.job_pid) if self.job_pid is not None else set()
            rec["gpus"] = [self._gpu(g, h, tree, procs) for g, h, _ in self.gpus]
        return rec

    def _cpu(self, t_ns: int, cpu: CpuTimes | None, procs: dict[int, ProcStat]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "interval_ns": None,
            "cpu_busy_ratio": None,
            "job_cpu_ratio": None,
            "gpudiag_cpu_ratio": None,
            "other_cpu_ratio": None,
            "steal_ratio": None,
            "iowait_ratio": None,
            "job_processes": None,
            "top_other": None,
        }
        if cpu is None:
            return out
        tree = job_tree(procs, self.job_pid) if self.job_pid is not None else set()
        out["job_processes"] = len(tree)
        for pid, p in procs.items():
            self._names[pid] = p.name
        prev, self._prev = self._prev, _Prev(t_ns, cpu, procs)
        if prev is None:
            return out
        total = cpu.total - prev.cpu.total
        if total <= 0:
            return out
        d = cpu_deltas(prev.procs, procs)
        me, me_before = procs.get(self.self_pid), prev.procs.get(self.self_pid)
        mine = me.own - me_before.own if me is not None and me_before is not None else 0
        job = sum(d[pid] for pid in tree)
        # gpudiag reaps the job's root: the root's CPU since the last sample is in our cutime
        if me is not None and me_before is not None:
            job += max(d[self.self_pid] - mine, 0)
        job, mine = max(job, 0), max(mine, 0)
        busy = cpu.busy - prev.cpu.busy
        other = max(busy - job - mine, 0)
        out.update(
            interval_ns=t_ns - prev.t_ns,
            cpu_busy_ratio=busy / total,
            job_cpu_ratio=min(job, busy) / total,
            gpudiag_cpu_ratio=mine / total,
            other_cpu_ratio=other / total,
            steal_ratio=(cpu.steal - prev.cpu.steal) / total,
            iowait_ratio=(cpu.iowait - prev.cpu.iowait) / total,
        )
        top = sorted(
            ((v, pid) for pid, v in d.items() if pid not in tree and pid != self.self_pid),
            reverse=True,
        )[:TOP_OTHER]
        out["top_other"] = [
            {"pid": pid, "name": self._names.get(pid), "cpu_ratio": v / total}
            for v, pid in top
            if v / total >= TOP_OTHER_MIN_RATIO
        ]
        return out

    def _gpu(
        self, g: GpuIdentity, h: Any, tree: set[int], procs: dict[int, ProcStat]
    ) -> dict[str, Any]:
        nv = self.nvml
        sm = nvml_call(nv, "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
        temp = nvml_call(nv, "nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        reasons = nvml_call(nv, self._reason_fn, h) if self._reason_fn else None
        on_gpu = gpu_pids(nv, h)
        other = None
        if on_gpu is not None:
            other = sorted(p for p in on_gpu if p not in tree and p != self.self_pid)
        return {
            "gpu_uuid": g.uuid,
            "index": g.index,
            "sm_clock_mhz": sm,
            "temp_c": temp,
            "throttle_reasons": int(reasons) if reasons is not None else None,
            "other_pids": other,
            "other_names": [procs[p].name if p in procs else None for p in other or ()],
        }

    def sample_once(self) -> dict[str, Any]:
        """Take one sample, write it, fold it into the summary."""
        t0 = time.thread_time_ns()  # CPU the sampler spends, not time it waits
        rec = self.read(self.clock())
        if self.fail_at and len(self.samples) + self.failed_samples in self.fail_at:
            raise RuntimeError("injected conditions sampler failure (GPUDIAG_FAULT)")
        rec["sample_cost_ns"] = time.thread_time_ns() - t0
        self._write(rec)
        with self._lock:
            self.samples.append(rec)
            self.cost_ns.append(rec["sample_cost_ns"])
            for gpu in rec.get("gpus") or ():
                self._fold_gpu(gpu)
        return rec

    def _fold_gpu(self, gpu: dict[str, Any]) -> None:
        seen = self._gpu_seen.setdefault(gpu["gpu_uuid"], _GpuSeen())
        seen.n += 1
        if gpu["sm_clock_mhz"] is not None:
            seen.sm_clock.append(int(gpu["sm_clock_mhz"]))
        if gpu["temp_c"] is not None:
            seen.temp.append(int(gpu["temp_c"]))
        if gpu["throttle_reasons"] is not None:
            seen.slowdown += bool(gpu["throttle_reasons"] & runconditions.CLOCKS_LIMITED_MASK)
            for bit, name in THROTTLE_REASONS.items():
                if gpu["throttle_reasons"] & bit:
                    seen.throttle[name] = seen.throttle.get(name, 0) + 1
        if gpu["other_pids"] is not None:
            seen.other_counts.append(len(gpu["other_pids"]))
            for pid, name in zip(gpu["other_pids"], gpu["other_names"], strict=True):
                seen.other_pids.setdefault(pid, name)

    # -- file ----------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The file's first record: what a sample means on this host."""
        stat = self.proc.read("stat")
        cpu = parse_stat(stat) if stat else None
        mem = parse_meminfo(self.proc.read("meminfo") or "")
        return {
            "type": "header",
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "host": self.host,
            "pid": self.self_pid,
            "job_pid": self.job_pid,
            "clock": "time.time_ns",
            "interval_s": self.interval_s,
            "cpus": cpu.cpus if cpu else None,
            "mem_total_bytes": mem.get("MemTotal"),
            "psi": self.proc.read("pressure/memory") is not None,
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "max_sm_clock_mhz": mx} for g, _, mx in self.gpus
            ],
        }

    def _write(self, rec: dict[str, Any]) -> None:
        self._write_line(rec)
        self.samples_written += 1

    # -- loop ----------------------------------------------------------------------

    def _tick(self) -> bool:
        """One sample; False when the sampler must stop (its file cannot be written)."""
        try:
            self.sample_once()
        except OSError as e:
            self._fail(f"run-conditions sampler stopped: cannot write {self.path}: {e}")
            return False
        except Exception as e:
            self.failed_samples += 1
            if not self._logged_sample_error:
                self._logged_sample_error = True
                self._fail(f"run-conditions sample failed ({type(e).__name__}: {e}); continuing")
        return True

    # -- summary -------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The manifest's ``conditions``: means, high percentiles and maxima over the run."""
        with self._lock:
            samples = list(self.samples)
        s: dict[str, Any] = {
            "samples": len(samples),
            "interval_s": self.interval_s,
            "cpus": (self.written_header or {}).get("cpus"),
            "failed_samples": self.failed_samples,
        }
        # Means weigh each sample by its interval; percentiles and maxima leave out the
        # short last interval (a few jiffies make coarse ratios).
        full = [r for r in samples if (r.get("interval_ns") or 0) >= 0.5 * self.interval_s * 1e9]
        for key in ("other_cpu_ratio", "job_cpu_ratio", "steal_ratio", "cpu_busy_ratio"):
            s[f"{key}_mean"] = _weighted_mean(samples, key)
            vals = [r[key] for r in (full or samples) if r.get(key) is not None]
            s[f"{key}_p90"] = _p90(vals)
            s[f"{key}_max"] = max(vals) if vals else None
        s["iowait_ratio_mean"] = _weighted_mean(samples, "iowait_ratio")
        s["gpudiag_cpu_ratio_mean"] = _weighted_mean(samples, "gpudiag_cpu_ratio")
        s["loadavg_max"] = _max(r["loadavg"][0] for r in samples if r.get("loadavg"))
        s["mem_available_bytes_min"] = _min(r.get("mem_available_bytes") for r in samples)
        s["mem_pressure_some_avg10_max"] = _max(r.get("mem_pressure_some_avg10") for r in samples)
        s["mem_pressure_full_avg10_max"] = _max(r.get("mem_pressure_full_avg10") for r in samples)
        s["cpu_pressure_some_avg10_max"] = _max(r.get("cpu_pressure_some_avg10") for r in samples)
        s["top_other"] = self._top_other(samples)
        s["gpus"] = {uuid: self._gpu_summary(uuid, g) for uuid, g in self._gpu_seen.items()}
        s["sample_cost_us_mean"] = statistics.fmean(self.cost_ns) / 1000 if self.cost_ns else None
        return s

    def _top_other(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The processes outside the job that used the most CPU, interval-weighted means."""
        w = sum(r.get("interval_ns") or 0 for r in samples if r.get("top_other") is not None)
        acc: dict[int, list[Any]] = {}
        for r in samples:
            for t in r.get("top_other") or ():
                a = acc.setdefault(t["pid"], [t["name"], 0.0])
                a[1] += t["cpu_ratio"] * (r.get("interval_ns") or 0)
        top = sorted(acc.items(), key=lambda kv: -kv[1][1])[:TOP_OTHER]
        return [
            {"pid": pid, "name": name, "cpu_ratio_mean": total / w}
            for pid, (name, total) in top
            if w and total / w >= TOP_OTHER_MIN_RATIO
        ]

    def _gpu_summary(self, uuid: str, g: _GpuSeen) -> dict[str, Any]:
        mx = next((m for gi, _, m in self.gpus if gi.uuid == uuid), None)
        return {
            "samples": g.n,
            "sm_clock_mhz_min": min(g.sm_clock) if g.sm_clock else None,
            "sm_clock_mhz_median": statistics.median(g.sm_clock) if g.sm_clock else None,
            "sm_clock_max_mhz": mx,
            "temp_c_max": max(g.temp) if g.temp else None,
            "throttle_samples": dict(sorted(g.throttle.items())),
            "slowdown_samples": g.slowdown,
            "other_processes_max": max(g.other_counts) if g.other_counts else None,
            "other_process_samples": sum(1 for c in g.other_counts if c),
            "other_processes": [
                {"pid": pid, "name": name} for pid, name in sorted(g.other_pids.items())[:10]
            ],
        }


def _fault_samples(text: str | None) -> set[int]:
    """``conditions:sample@N`` entries of ``GPUDIAG_FAULT``: the samples that fail."""
    out: set[int] = set()
    for raw in (text or "").split(","):
        site, _, n = raw.strip().partition("@")
        if site == "conditions:sample":
            out.add(int(n or 0))
    return out


def _weighted_mean(samples: list[dict[str, Any]], key: str) -> float | None:
    pairs = [(r[key], r["interval_ns"]) for r in samples if r.get(key) is not None]
    w = sum(i for _, i in pairs if i)
    return sum(v * i for v, i in pairs if i) / w if w else None


def _p90(vals: list[float]) -> float | None:
    if not vals:
        return None
    v = sorted(vals)
    return v[max(0, math.ceil(0.9 * len(v)) - 1)]  # nearest rank


def _mean(vals: Iterable[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return statistics.fmean(v) if v else None


def _max(vals: Iterable[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return max(v) if v else None


def _min(vals: Iterable[int | None]) -> int | None:
    v = [x for x in vals if x is not None]
    return min(v) if v else None
