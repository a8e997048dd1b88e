"""Run conditions (issue 15, part 1): /proc parsing on recorded contents, CPU attribution on
two recorded /proc snapshots, GPU conditions from a fake NVML, and faults that never stop it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpudiag.collect.samplers.conditions import (
    ConditionsSampler,
    CpuTimes,
    ProcFS,
    ProcStat,
    cpu_deltas,
    job_tree,
    parse_loadavg,
    parse_meminfo,
    parse_pid_stat,
    parse_psi,
    parse_stat,
)

# Recorded on the 2-CPU test VM (a kernel with PSI), 2026-11-30.
STAT = """cpu  55155 39 10559 118120 436 0 137 56 0 0
cpu0 22014 25 4253 65827 85 0 46 24 0 0
cpu1 33141 13 6305 52293 351 0 90 31 0 0
intr 534064 0 0 0 0
ctxt 1234567
"""
PID_STAT = (
    "13499 (cat) R 13496 13496 3252 0 -1 4194304 100 0 0 0 7 3 11 5 20 0 1 0 92602 3133440 "
    "411 18446744073709551615 93875253583872 93875253603753 140724933073472 0 0 0 0 0 0 0 0 0 "
    "17 0 0 0 0 0 0 93875253619760 93875253621376 93875907665920 140724933077533 0\n"
)
LOADAVG = "2.17 1.14 0.63 2/89 13500\n"
MEMINFO = "MemTotal:       24684092 kB\nMemFree:        22295760 kB\nMemAvailable:   23971212 kB\n"
PSI = (
    "some avg10=1.50 avg60=0.25 avg300=0.05 total=123456\n"
    "full avg10=0.40 avg60=0.00 avg300=0.00 total=789\n"
)


def test_parse_stat_recorded() -> None:
    cpu = parse_stat(STAT)
    assert cpu == CpuTimes(
        busy=55155 + 39 + 10559 + 0 + 137, idle=118120, iowait=436, steal=56, cpus=2
    )
    assert cpu.total == cpu.busy + 118120 + 436 + 56
    assert parse_stat("intr 1 2 3\n") is None


def test_parse_pid_stat_recorded_and_odd_names() -> None:
    st = parse_pid_stat(PID_STAT)
    assert st == ProcStat(pid=13499, ppid=13496, name="cat", own=7 + 3, children=11 + 5)
    # a name with spaces and parentheses: the last ")" ends it
    odd = PID_STAT.replace("(cat)", "(my (odd) name)")
    st2 = parse_pid_stat(odd)
    assert st2 is not None
    assert (st2.name, st2.ppid, st2.own) == ("my (odd) name", 13496, 10)
    assert parse_pid_stat("garbage") is None


def test_parse_loadavg_psi_meminfo_recorded() -> None:
    assert parse_loadavg(LOADAVG) == (2.17, 1.14, 0.63, 2)
    psi = parse_psi(PSI)
    assert psi["some"]["avg10"] == 1.5
    assert psi["full"]["total"] == 789
    mem = parse_meminfo(MEMINFO)
    assert mem["MemAvailable"] == 23971212 * 1024
    assert mem["MemTotal"] == 24684092 * 1024


def _p(pid: int, ppid: int, own: int, children: int = 0, name: str = "p") -> ProcStat:
    return ProcStat(pid, ppid, name, own, children)


def test_job_tree_and_cpu_deltas_with_reaped_children() -> None:
    # GIVEN a job 10 -> 11 -> 12, gpudiag 1 (its parent), and an unrelated process 50
    before = {
        1: _p(1, 0, 5),
        10: _p(10, 1, 100),
        11: _p(11, 10, 200),
        12: _p(12, 11, 300),
        50: _p(50, 0, 1000),
    }
    # WHEN 12 exits and 11 reaps it (12 had used 40 more jiffies since `before`), 11 uses
    # 20 more, and a short-lived child of 10 lived and died in between (7 jiffies)
    now = {
        1: _p(1, 0, 6),
        10: _p(10, 1, 100, children=7),
        11: _p(11, 10, 220, children=340),
        50: _p(50, 0, 1100),
    }
    assert job_tree(before, 10) == {10, 11, 12}
    assert job_tree(now, 10) == {10, 11}
    d = cpu_deltas(before, now)
    # THEN the reaper carries only what was not counted yet: 20 own + 40 of the child's
    assert d[11] == 20 + 40
    assert d[10] == 7
    assert d[50] == 100
    assert d[1] == 1


def _write_proc(root: Path, stat: str, procs: dict[int, ProcStat]) -> None:
    if root.exists():
        for p in sorted(root.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
    (root / "pressure").mkdir(parents=True)
    (root / "stat").write_text(stat)
    (root / "loadavg").write_text(LOADAVG)
    (root / "meminfo").write_text(MEMINFO)
    (root / "pressure" / "memory").write_text(PSI)
    for p in procs.values():
        (root / str(p.pid)).mkdir()
        (root / str(p.pid) / "stat").write_text(
            f"{p.pid} ({p.name}) S {p.ppid} 1 1 0 -1 0 0 0 0 0 {p.own} 0 {p.children} 0 20 0 1\n"
        )


def _cpu_line(busy: int, idle: int, steal: int) -> str:
    return f"cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 0\ncpu1 0\n"


def test_sampler_attributes_cpu_on_recorded_snapshots(tmp_path: Path) -> None:
    # GIVEN two /proc snapshots 1 s apart on a 2-CPU host (200 jiffies of capacity):
    # the job tree (10, 11) used 90, gpudiag (1) 2, a hog (50) 100, steal 4
    root = tmp_path / "proc"
    before = {1: _p(1, 0, 10), 10: _p(10, 1, 0), 11: _p(11, 10, 500), 50: _p(50, 0, 900, 0, "hog")}
    now = {1: _p(1, 0, 12), 10: _p(10, 1, 0), 11: _p(11, 10, 590), 50: _p(50, 0, 1000, 0, "hog")}
    times = iter([1_000_000_000, 2_000_000_000])
    s = ConditionsSampler(
        tmp_path / "c.jsonl",
        "h",
        job_pid=10,
        proc=ProcFS(root),
        self_pid=1,
        clock=lambda: next(times),
    )
    _write_proc(root, _cpu_line(busy=5000, idle=9000, steal=100), before)
    first = s.sample_once()
    _write_proc(root, _cpu_line(busy=5000 + 192, idle=9000 + 4, steal=104), now)
    rec = s.sample_once()
    # THEN the first sample has no ratios, the second splits the 200 jiffies exactly
    assert first["other_cpu_ratio"] is None
    assert rec["interval_ns"] == 1_000_000_000
    assert rec["job_processes"] == 2
    assert rec["job_cpu_ratio"] == pytest.approx(90 / 200)
    assert rec["gpudiag_cpu_ratio"] == pytest.approx(2 / 200)
    assert rec["other_cpu_ratio"] == pytest.approx(100 / 200)
    assert rec["steal_ratio"] == pytest.approx(4 / 200)
    assert rec["cpu_busy_ratio"] == pytest.approx(192 / 200)
    assert rec["top_other"] == [{"pid": 50, "name": "hog", "cpu_ratio": pytest.approx(0.5)}]
    assert rec["loadavg"] == [2.17, 1.14, 0.63]
    assert rec["mem_pressure_some_avg10"] == 1.5
    assert rec["mem_available_bytes"] == 23971212 * 1024
    summary = s.summary()
    assert summary["samples"] == 2
    assert summary["cpus"] == 2
    assert summary["other_cpu_ratio_mean"] == pytest.approx(0.5)
    assert summary["top_other"] == [{"pid": 50, "name": "hog", "cpu_ratio_mean": 0.5}]
    lines = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [x["type"] for x in lines] == ["header", "sample", "sample"]
    assert lines[0]["psi"] is True
    assert lines[0]["job_pid"] == 10


def test_missing_proc_files_give_null_not_zero(tmp_path: Path) -> None:
    s = ConditionsSampler(tmp_path / "c.jsonl", "h", job_pid=10, proc=ProcFS(tmp_path / "none"))
    rec = s.sample_once()
    assert rec["other_cpu_ratio"] is None
    assert rec["loadavg"] is None
    assert rec["mem_available_bytes"] is None
    assert rec["mem_pressure_some_avg10"] is None
    assert s.summary()["mem_pressure_some_avg10_max"] is None


class FakeGpus:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.tick = 0

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return "GPU-0000"

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        self.tick += 1
        return 1980 if self.tick == 1 else 1410

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 60 + self.tick

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x1 if self.tick == 1 else 0x20 | 0x4  # idle, then thermal + power cap

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=11), SimpleNamespace(pid=77)]

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        raise RuntimeError("Not Supported")


def test_gpu_conditions_from_fake_nvml(tmp_path: Path) -> None:
    # GIVEN a GPU that the job (11) shares with another process (77), and that throttles
    root = tmp_path / "proc"
    procs = {10: _p(10, 1, 0), 11: _p(11, 10, 5), 77: _p(77, 1, 5, 0, "intruder")}
    _write_proc(root, _cpu_line(100, 100, 0), procs)
    s = ConditionsSampler(
        tmp_path / "c.jsonl", "h", job_pid=10, proc=ProcFS(root), nvml=FakeGpus(), self_pid=1
    )
    s.sample_once()
    rec = s.sample_once()
    gpu = rec["gpus"][0]
    assert gpu["other_pids"] == [77]
    assert gpu["other_names"] == ["intruder"]
    assert gpu["throttle_reasons"] == 0x24
    g = s.summary()["gpus"]["GPU-0000"]
    assert g["samples"] == 2
    assert g["sm_clock_max_mhz"] == 1980
    assert g["sm_clock_mhz_min"] == 1410
    assert g["temp_c_max"] == 62
    assert g["throttle_samples"] == {"gpu_idle": 1, "sw_power_cap": 1, "sw_thermal_slowdown": 1}
    assert g["slowdown_samples"] == 1
    assert g["other_processes_max"] == 1
    assert g["other_processes"] == [{"pid": 77, "name": "intruder"}]


def test_failing_sample_is_counted_and_logged_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a sampler whose samples 1 and 2 fail (GPUDIAG_FAULT=conditions:sample@N)
    waits = iter([False, False, False, True])
    s = ConditionsSampler(
        tmp_path / "c.jsonl",
        "h",
        job_pid=1,
        interval_s=0.01,
        wait=lambda _s: next(waits),
        faults="hook:data,conditions:sample@1,conditions:sample@2",
    )
    s.run()
    # THEN it kept sampling, counted the failures and said so once
    assert s.failed_samples == 2
    assert s.samples_written == 3  # 5 ticks (4 waits + the last sample), 2 failed
    assert len(s.errors) == 1
    assert capsys.readouterr().err.count("run-conditions sample failed") == 1
    assert s.summary()["failed_samples"] == 2


def test_unwritable_file_stops_sampler_once(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    s = ConditionsSampler(blocker / "c.jsonl", "h", job_pid=1, interval_s=0.01)
    s.start()
    s.stop()
    assert len(s.errors) == 1
    assert "cannot write" in s.errors[0]
    assert s.summary()["samples"] == 0


def test_manifest_keeps_conditions_and_reads_old_manifests(tmp_path: Path) -> None:
    from gpudiag.rundir import layout as rundir
    from gpudiag.rundir.conditions import RunConditions

    m = rundir.RunManifest(conditions=RunConditions({"samples": 3, "other_cpu_ratio_mean": 0.5}))
    rundir.write_manifest(tmp_path, m)
    assert rundir.read_manifest(tmp_path / "manifest.json").conditions == m.conditions
    old = {k: v for k, v in m.to_json().items() if k != "conditions"}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    assert rundir.read_manifest(tmp_path / "manifest.json").conditions is None
