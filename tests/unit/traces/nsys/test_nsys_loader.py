"""Nsight Systems exports and reports: loader, schema drift, ranks, steps, bad input, nsys export."""

import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

import gpudiag
from gpudiag.config import Thresholds
from gpudiag.errors import EnvironmentProblem, InputError
from gpudiag.traces import nsys
from gpudiag.traces.load import load_run
from gpudiag.traces.nsys import load_nsys, resolve_tables
from gpudiag.traces.schema import Kind

DEBIAN_NSYS = "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys"


@pytest.fixture(scope="session")
def nsys_dir(shared_traces: Path) -> Path:
    d = shared_traces / "nsys"
    if not d.is_dir():
        pytest.skip(f"Nsight fixtures not found at {d}")
    return d


@pytest.fixture
def no_nsys(monkeypatch, tmp_path):
    """No nsys anywhere: not in GPUDIAG_NSYS, PATH or the usual places."""
    monkeypatch.delenv("GPUDIAG_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(nsys.export, "find_nsys", lambda explicit=None: None)


def _kinds(tl):
    return {
        Kind(k).name: int(n) for k, n in zip(*np.unique(tl.kind, return_counts=True), strict=True)
    }


# ---------------------------------------------------------------- a synthetic export


def make_export(
    path: Path,
    *,
    kernel_table: str = "CUPTI_ACTIVITY_KIND_KERNEL",
    steps: str = "gpudiag.step#{}",
    env: str = "RANK=5;WORLD_SIZE=8;HOME=/x",
    pids: tuple[int, ...] = (42,),
    schema: str = "3.7.2",
) -> Path:
    """A tiny export: per process, 4 steps of [data 2 ms][kernel 6 ms][nccl 2 ms] + a gap.

    Per step (10 ms period, host range [s, s+9ms]): data range [s, s+2ms] on the main
    thread, compute kernel [s+2ms, s+8ms] launched at s+2ms, NCCL kernel [s+8ms, s+9ms].
    """
    con = sqlite3.connect(path)
    ms = 1_000_000
    con.executescript(
        f"""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE TARGET_INFO_SYSTEM_ENV (name TEXT, value TEXT);
        CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);
        CREATE TABLE {kernel_table} (start INT, end INT, deviceId INT, streamId INT,
            correlationId INT, globalPid INT, shortName INT, demangledName INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT,
            correlationId INT, nameId INT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, textId INT,
            globalTid INT, domainId INT);
        INSERT INTO StringIds VALUES (1, 'gemm_nn'), (2, 'ncclDevKernel_AllReduce'),
            (3, 'cudaLaunchKernel_v7000'), (4, '{steps.format(0)}');
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '{schema}'),
            ('EXPORT_PRODUCT_VERSION', '2099.1.1.1');
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'Test GPU A'), (1, 'Test GPU B');
        """
    )
    # Text that is not UTF-8, as in some 2021-2022 exports.
    con.execute(
        "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES ('GpuInfo', CAST(? AS TEXT))",
        (b"caf\xe9 \xff",),
    )
    con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES ('DeviceEnvironment', ?)", (env,))
    corr = 0
    for dev, pid in enumerate(pids):
        gpid = (1 << 48) | (pid << 24)
        gtid = gpid | pid
        for i in range(4):
            s = 100 * ms + i * 10 * ms
            corr += 1
            con.execute(
                f"INSERT INTO {kernel_table} VALUES (?,?,?,?,?,?,1,1)",
                (s + 2 * ms, s + 8 * ms, dev, 7, corr, gpid),
            )
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,3)",
                (s + 2 * ms, s + 2 * ms + 5000, gtid, corr),
            )
            corr += 1
            con.execute(
                f"INSERT INTO {kernel_table} VALUES (?,?,?,?,?,?,2,2)",
                (s + 8 * ms, s + 9 * ms, dev, 7, corr, gpid),
            )
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,3)",
                (s + 3 * ms, s + 3 * ms + 5000, gtid, corr),
            )
            # step range: inline text except the first, which uses a registered string
            text, tid = (None, 4) if i == 0 else (steps.format(i), None)
            con.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,?,?,0)", (s, s + 9 * ms, text, tid, gtid)
            )
            con.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,NULL,?,0)",
                (s, s + 2 * ms, "enumerate(DataLoader)#_Iter.__next__", gtid),
            )
            con.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,NULL,?,0)",
                (s + 2 * ms, s + 3 * ms, f"aten::mm, seq = {i}, op_id = {i}", gtid),
            )
            con.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,NULL,?,0)",
                (s + 8 * ms, s + 9 * ms, f"nccl:all_reduce, op_id = {i}", gtid),
            )
    con.commit()
    con.close()
    return path


def test_synthetic_export_gives_exact_step_parts(tmp_path):
    # GIVEN 4 steps of 10 ms: 2 ms data, 6 ms compute, 1 ms NCCL, 1 ms idle
    p = make_export(tmp_path / "synthetic.sqlite")
    # WHEN it is analysed
    d = gpudiag.analyze(p, jobs=1)
    # THEN gpudiag's own NVTX step ranges number the steps, and the parts are exact
    assert [s.step for s in d.steps] == [0, 1, 2, 3]
    first = d.steps[0]
    ms = 1_000_000
    assert (first.compute_ns, first.comm_wait_ns, first.data_wait_ns) == (6 * ms, ms, 2 * ms)
    assert first.duration_ns == 10 * ms
    r = d.ranks[0]
    assert r.rank == 5 and r.step_source == "ProfilerStep"
    assert r.devices == ["Test GPU A"]
    assert d.run.world_size == 8


def test_synthetic_export_columns_and_links(tmp_path):
    (tl,) = load_nsys(make_export(tmp_path / "s.sqlite"))
    assert tl.meta.fmt == "nsys" and tl.meta.rank_from == "environment RANK"
    # per-operator ranges (aten::mm, seq = …) are skipped; c10d's nccl:* ranges are comm
    assert _kinds(tl) == {"COMPUTE": 4, "COMM": 8, "RUNTIME": 8, "DATALOADER": 4, "STEP": 4}
    assert tl.lanes == ["gpu:0:7", "cpu:42"]
    assert tl.lanes[tl.meta.main_lane] == "cpu:42"
    gpu = tl.gpu_lane_mask()[tl.lane]
    assert np.all(tl.launch_ns[gpu] >= 0)  # every kernel found its launching call
    assert np.all(tl.launch_ns[gpu] <= tl.start_ns[gpu])
    names = set(tl.names)
    assert "nccl:all_reduce" in names and "aten::mm" not in names  # suffix cut off in SQL
    assert "cudaLaunchKernel" in names and "cudaLaunchKernel_v7000" not in names
    assert {"gpudiag.step#0", "gpudiag.step#3"} <= names  # textId and inline text


def test_v2_table_suffix_is_resolved(tmp_path):
    p = make_export(tmp_path / "v2.sqlite", kernel_table="CUPTI_ACTIVITY_KIND_KERNEL_V2")
    (tl,) = load_nsys(p)
    assert _kinds(tl)["COMPUTE"] == 4
    assert resolve_tables(["A", "A_V2", "A_V3", "B_V2", "B_V10"]) == {"A": "A", "B": "B_V10"}


def test_one_report_with_two_processes_gives_two_ranks(tmp_path):
    p = make_export(tmp_path / "node.sqlite", pids=(100, 200), env="RANK=0")
    tls = load_nsys(p)
    assert [t.rank for t in tls] == [0, 1]
    assert {t.meta.rank_from for t in tls} == {"process order"}  # launcher env ignored
    assert [t.lanes[0] for t in tls] == ["gpu:0:7", "gpu:1:7"]
    assert [t.meta.devices for t in tls] == [["Test GPU A"], ["Test GPU B"]]
    d = gpudiag.analyze(p, jobs=1)
    assert [r.rank for r in d.ranks] == [0, 1]


def test_profilerstep_and_user_step_marker(tmp_path):
    p = make_export(tmp_path / "prof.sqlite", steps="ProfilerStep#{}")
    d = gpudiag.analyze(p, jobs=1)
    assert [s.step for s in d.steps] == [0, 1, 2, 3]
    p2 = make_export(tmp_path / "user.sqlite", steps="train iteration {}")
    d2 = gpudiag.analyze(p2, jobs=1, thresholds=Thresholds(step_re=r"^train iteration (\d+)$"))
    assert [s.step for s in d2.steps] == [0, 1, 2, 3]
    assert d2.ranks[0].step_source == "marker"


def test_unknown_schema_major_is_refused(tmp_path):
    p = make_export(tmp_path / "future.sqlite", schema="4.0.0")
    with pytest.raises(InputError, match=r"schema 4\.0\.0 not supported \(known: .*3\.25\.0"):
        load_nsys(p)


def test_unknown_minor_schema_is_read_with_a_note(tmp_path):
    (tl,) = load_nsys(make_export(tmp_path / "newer.sqlite", schema="3.99.0"))
    assert any("schema 3.99.0" in n for n in tl.meta.notes)


# ---------------------------------------------------------------- the shared exports


def test_mfu_export_two_ranks_nccl_on_the_compute_stream(nsys_dir):
    tls = load_nsys(nsys_dir / "nsys-ai" / "mfu_2gpu_before.sqlite")
    assert [t.rank for t in tls] == [0, 1]
    assert [[ln for ln in t.lanes if ln.startswith("gpu:")] for t in tls] == [
        ["gpu:0:7"],
        ["gpu:1:15"],
    ]
    comm = [int(np.count_nonzero((t.kind == Kind.COMM) & (t.lane == 0))) for t in tls]
    assert comm == [33, 33]  # ncclDevKernel_SendRecv per device (README)
    gpu_ops = sum(int(np.count_nonzero(t.gpu_lane_mask()[t.lane])) for t in tls)
    assert gpu_ops == 4010 + 1020 + 269
    # c10d's `nccl:all_to_all, op_id = N` ranges are host-side communication
    host_comm = sum(int(np.count_nonzero((t.kind == Kind.COMM) & (t.lane > 0))) for t in tls)
    assert host_comm >= 66


def test_data_bound_mnist_with_nvtx(nsys_dir):
    d = gpudiag.analyze(nsys_dir / "ai-profiler" / "baseline_nvtx.sqlite", jobs=1)
    r = d.ranks[0]
    assert r.step_source == "user_range" and r.steps == 59  # from the 'Batch N' ranges
    assert "steps from NVTX range 'Batch N' (59 ranges" in d.notes[0]
    assert r.shares.data_wait > 0.85 and r.idle_ratio > 0.9
    assert 140e6 < r.step_time_ns_median < 170e6  # README: median Batch period 153 ms
    assert any(f.kind == "idle_ratio" for f in d.findings)


def test_batch_step_marker_numbers_steps_from_the_name(nsys_dir):
    th = Thresholds(step_re=r"^Batch (\d+)$")
    d = gpudiag.analyze(nsys_dir / "ai-profiler" / "baseline_nvtx.sqlite", jobs=1, thresholds=th)
    assert [s.step for s in d.steps[:3]] == [0, 1, 2]
    assert len(d.steps) == 59


def test_no_nvtx_steps_come_from_the_kernel_sequence(nsys_dir):
    (tl,) = load_nsys(nsys_dir / "ai-profiler" / "baseline.sqlite")
    assert _kinds(tl)["COMPUTE"] == 9345
    assert any("no NVTX ranges" in n for n in tl.steps.notes)
    d = gpudiag.analyze(nsys_dir / "ai-profiler" / "baseline.sqlite", jobs=1)
    # no ranges, but its kernel sequence repeats: the loop's 58 iterations
    assert (d.ranks[0].step_source, d.ranks[0].steps) == ("kernels", 58)


def test_one_off_user_range_bounds_the_phase_instead_of_one_window(nsys_dir):
    # issue 20: the solver's two `Jacobi solve` ranges are the analysed windows (setup and
    # teardown outside them are left out); MPI's own ranges are never steps
    r = run_cli("analyze", str(nsys_dir / "jacobi-mpi" / "report1.sqlite"))
    assert r.returncode == 0, r.stderr
    assert "no step markers" not in r.stderr
    assert "analysed phase is NVTX range 'Jacobi solve' (2 ranges" in " ".join(r.stdout.split())


def test_minimal_synthetic_export_exact_idle(nsys_dir):
    d = gpudiag.analyze(nsys_dir / "nsys-ai" / "healthy_1pct.sqlite", jobs=1)
    # 400 kernels of 1 ms, 10 µs apart; the first launch call starts 3 µs before the first
    # kernel (at t = -3 µs: the clock is shifted so that times are not negative). The trace
    # is one window, cut to its GPU work: those 3 µs are its idle head (issue 29).
    (s,) = d.steps
    assert s.gpu_ops == 400 and s.compute_ns == 400_000_000
    assert s.duration_ns == 400_000_000 + 399 * 10_000
    assert d.reading is not None and d.reading.idle_head_ns == 3_000
    assert d.ranks[0].idle_ratio == pytest.approx(1 - 400e6 / s.duration_ns)


def test_mpi_reports_merge_with_ranks_from_the_capture(nsys_dir):
    run = load_run(nsys_dir / "jacobi-mpi")
    assert [t.rank for t in run.ranks] == [3, 7]  # not 1 and 2, as the file names suggest
    assert {t.meta.world_size for t in run.ranks} == {8}
    d = gpudiag.analyze(nsys_dir / "jacobi-mpi", jobs=1)
    assert [r.rank for r in d.ranks] == [3, 7]
    assert len(d.inputs) == 2  # the .qdrep beside each .sqlite is not read twice


def test_report_with_an_export_beside_it_uses_the_export(nsys_dir, no_nsys):
    d = gpudiag.analyze(nsys_dir / "jacobi-mpi" / "report2.qdrep", jobs=1)
    assert [r.rank for r in d.ranks] == [7]


# ---------------------------------------------------------------- bad input


def _bad(tmp_path: Path, nsys_dir: Path) -> dict[str, Path]:
    out = {}
    p = tmp_path / "notnsys.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    out["not an Nsight Systems export"] = p
    p = tmp_path / "nokernel.sqlite"
    shutil.copy(nsys_dir / "nsys-ai" / "healthy_1pct.sqlite", p)
    os.chmod(p, 0o644)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.close()
    out["no CUDA kernel table"] = p
    raw = (nsys_dir / "nsys-ai" / "mock.sqlite").read_bytes()
    p = tmp_path / "corrupt.sqlite"
    p.write_bytes(raw[: len(raw) // 3])
    out["corrupt SQLite database"] = p
    p = tmp_path / "text.sqlite"
    p.write_text("hello")
    out["not a SQLite database"] = p
    p = tmp_path / "fake.nsys-rep"
    p.write_text("hello")
    out["not an Nsight Systems report"] = p
    return out


def test_bad_inputs_fail_with_one_line_and_exit_4(tmp_path, nsys_dir):
    for problem, path in _bad(tmp_path, nsys_dir).items():
        r = run_cli("analyze", str(path))
        assert r.returncode == 4, (problem, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert lines[0].startswith(f"gpudiag: error: {path}: ") and problem in lines[0], lines
        assert lines[1].startswith("  hint: ") and len(lines) == 2
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_step_marker_matching_nothing_is_an_error(nsys_dir):
    r = run_cli(
        "analyze",
        str(nsys_dir / "ai-profiler" / "baseline_nvtx.sqlite"),
        "--step-marker",
        r"step \d+",
    )
    assert r.returncode == 4
    assert "step marker 'step \\d+' matches no range" in r.stderr
    assert "'Batch N' ×59" in r.stderr  # the hint names the user's own ranges first


def test_report_without_nsys_says_what_to_run(tmp_path, nsys_dir):
    rep = tmp_path / "baseline.nsys-rep"
    shutil.copy(nsys_dir / "ai-profiler" / "baseline.nsys-rep", rep)
    env = {"PATH": os.path.dirname(os.__file__), "GPUDIAG_NSYS": "", "HOME": str(tmp_path)}
    if os.path.exists(DEBIAN_NSYS):
        pytest.skip("nsys is installed in its usual place; covered by the in-process test")
    r = run_cli("analyze", str(rep), env=env)
    assert r.returncode == 3, r.stderr
    assert f"nsys export --type sqlite -o {tmp_path / 'baseline.sqlite'} {rep}" in r.stderr
    assert "captured by nsys before 2023.4" in r.stderr


def test_report_without_nsys_in_process(tmp_path, nsys_dir, no_nsys):
    rep = tmp_path / "baseline.nsys-rep"
    shutil.copy(nsys_dir / "ai-profiler" / "baseline.nsys-rep", rep)
    with pytest.raises(EnvironmentProblem) as e:
        gpudiag.analyze(rep, jobs=1)
    assert e.value.exit_code == 3
    assert f"nsys export --type sqlite -o {tmp_path / 'baseline.sqlite'} {rep}" in e.value.hint


def _versioned_report(tmp_path: Path, nsys_dir: Path, version: bytes) -> Path:
    raw = (nsys_dir / "ai-profiler" / "baseline.nsys-rep").read_bytes()
    assert raw.startswith(nsys.HEADER_MAGIC + b"1.")
    rep = tmp_path / "new.nsys-rep"
    rep.write_bytes(nsys.HEADER_MAGIC + version + raw[len(nsys.HEADER_MAGIC) + 2 :])
    return rep


def test_header_versions(tmp_path, nsys_dir):
    assert nsys.report_version(nsys_dir / "jacobi-mpi" / "report1.qdrep") == "before 2023.4"
    rep = _versioned_report(tmp_path, nsys_dir, b"2024@6@2@25-246234924588v0.")
    assert nsys.report_version(rep) == "2024.6.2.25"


def test_report_newer_than_local_nsys_names_both_versions(tmp_path, nsys_dir, monkeypatch):
    rep = _versioned_report(tmp_path, nsys_dir, b"2024@6@2@25-246234924588v0.")
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\necho 'NVIDIA Nsight Systems version 2022.4.2.1-df9881f'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("GPUDIAG_NSYS", str(fake))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(EnvironmentProblem) as e:
        gpudiag.analyze(rep, jobs=1)
    assert "captured by nsys 2024.6.2.25, local nsys is 2022.4.2.1" in e.value.message
    assert "nsys 2024.6.2.25 or newer" in e.value.hint


def test_failed_export_maps_to_one_message_and_leaves_nothing(tmp_path, nsys_dir, monkeypatch):
    # A 2022.4 nsys fails on a 2023.2 report with a protobuf error and a partial file.
    rep = tmp_path / "r.nsys-rep"
    shutil.copy(nsys_dir / "ai-profiler" / "baseline.nsys-rep", rep)
    fake = tmp_path / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = --output ] && o=$2; shift; done\n'
        'echo partial > "$o"\n'
        "echo 'ProtobufParseException: Cannot parse message' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "cache" / "x.sqlite"
    with pytest.raises(EnvironmentProblem) as e:
        nsys.export_report(rep, out, str(fake), "2022.4.2.1", "before 2023.4")
    assert "captured by nsys before 2023.4, local nsys is 2022.4.2.1" in e.value.message
    assert list(out.parent.iterdir()) == []  # the partial export was removed


# ---------------------------------------------------------------- a real nsys export


def _real_nsys() -> str:
    found = os.environ.get("GPUDIAG_NSYS") or shutil.which("nsys")
    if not found and os.access(DEBIAN_NSYS, os.X_OK):
        found = DEBIAN_NSYS
    if not found:
        pytest.skip(
            "no nsys binary (GPUDIAG_NSYS, PATH or Debian's nsight-systems-target); "
            "install it as .ci/run does to run the .nsys-rep export test"
        )
    return found


def test_nsys_rep_is_exported_to_the_cache_and_matches_the_shared_export(
    tmp_path, nsys_dir, monkeypatch
):
    exe = _real_nsys()
    rep = tmp_path / "baseline.nsys-rep"  # a copy: nothing is written into ../shared
    shutil.copy(nsys_dir / "ai-profiler" / "baseline.nsys-rep", rep)
    monkeypatch.setenv("GPUDIAG_NSYS", exe)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = run_cli(
        "analyze",
        str(rep),
        "--format",
        "json",
        "--nsys",
        exe,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    cached = list((tmp_path / "cache" / "gpudiag" / "nsys").glob("*.sqlite"))
    assert len(cached) == 1 and not list(tmp_path.glob("*.sqlite"))
    (mine,) = load_nsys(cached[0])
    (ref,) = load_nsys(nsys_dir / "ai-profiler" / "baseline.sqlite")
    # Exporters differ (2022.4 here, 2023.4 for the shared file): compare data, not metadata.
    assert _kinds(mine) == _kinds(ref)
    assert np.array_equal(np.sort(mine.start_ns), np.sort(ref.start_ns))
    again = gpudiag.analyze(rep, jobs=1)  # the cached export is reused
    assert again.ranks[0].idle_ratio == pytest.approx(0.951, abs=0.001)
