"""Issue 14: `analyze --scheduler` on a real Dask cluster gives the local Diagnosis, and each
of its failures (no scheduler, a dying worker, a path the workers cannot read, another
gpudiag on the workers) ends in one line and an exit code, in bounded time.

Every cluster here is real: `distributed.LocalCluster` with worker processes, or a
`dask worker` process started by the test. A task is held on its worker, without timing
guesses, by a named pipe in place of a trace: the worker blocks reading it until the test
kills that worker (found by the open pipe in /proc) or puts the real trace in its place.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, job_env, run_cli
from testpaths import SHARED_TRACES

distributed = pytest.importorskip("distributed", reason="pip install -e '.[test]' brings it")

import dask  # noqa: E402

import gpudiag  # noqa: E402
from gpudiag.config import Thresholds, scheduler_address  # noqa: E402
from gpudiag.fanout.work import RankWork  # noqa: E402
from gpudiag.traces.load import load_run  # noqa: E402

DATA = ROOT / "tests" / "data"
START_S = 180  # a cluster or a worker starting on a busy 2-core box
NO_SCHEDULER = {"DASK_SCHEDULER_ADDRESS": ""}  # whatever the caller's environment says


def _cluster(**kw: object) -> distributed.LocalCluster:
    # allowed-failures = 1: a task whose worker dies twice fails (the scheduler reads it now)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        return distributed.LocalCluster(
            processes=True, threads_per_worker=1, dashboard_address=":0", **kw
        )


@pytest.fixture(scope="module")
def cluster():
    c = _cluster(n_workers=2)
    with distributed.Client(c, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=START_S)
    yield c
    c.close()


@pytest.fixture
def fresh_cluster():
    """A cluster of its own, for tests that kill its workers."""
    c = _cluster(n_workers=2)
    with distributed.Client(c, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=START_S)
    yield c
    c.close()


@pytest.fixture
def bare_scheduler():
    """A scheduler without workers: the test starts the worker it needs."""
    c = _cluster(n_workers=0)
    yield c
    c.close()


def _json(d) -> str:
    return json.dumps(d.to_json(), sort_keys=True)


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    t0 = time.monotonic()
    res = run_cli(*args, cwd=cwd, env={**NO_SCHEDULER, **(env or {})}, timeout=600)
    return res, time.monotonic() - t0


def _one_error(stderr: str) -> str:
    """The error line of a one-line error (plus its hint), with no traceback."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert "Traceback" not in stderr, stderr
    assert lines and lines[0].startswith("gpudiag: error: "), stderr
    assert len(lines) <= 2 and all(x.startswith("  hint: ") for x in lines[1:]), stderr
    return lines[0]


# ---- the same Diagnosis ------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Path:
    """Eight ranks replicated from a real V100 trace (more tasks than workers)."""
    src = SHARED_TRACES / "kineto" / "v100x2_r1" / "rank-1.json.gz"
    if not src.is_file():
        pytest.skip(
            f"real traces not found at {src.parent} (CI provides ../shared; or run python tests/fetch_shared.py)"
        )
    out = tmp_path_factory.mktemp("replicated8")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "make_big_trace.py"),
            str(out),
            "--ranks",
            "8",
            "--copies",
            "1",
            "--source",
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def _inputs(name: str, request: pytest.FixtureRequest) -> Path:
    if name == "replicated8":
        return request.getfixturevalue("replicated")
    if name in ("sampled_2rank_a2a", "mfu_2gpu_before.sqlite"):
        shared = request.getfixturevalue("shared_traces")
        return (
            shared / "kineto" / name
            if name.startswith("sampled")
            else shared / "nsys" / "nsys-ai" / name
        )
    return DATA / name


@pytest.mark.parametrize(
    "name",
    [
        "pipeline_4stage",
        "straggler_comms_id",
        "nccl219_data",
        "sampled_2rank_a2a",
        "mfu_2gpu_before.sqlite",
        "replicated8",
    ],
)
def test_cluster_gives_the_local_diagnosis(cluster, name, request):
    path = _inputs(name, request).absolute()
    local = gpudiag.analyze(path)
    remote = gpudiag.analyze(path, scheduler=cluster.scheduler_address)
    assert _json(remote) == _json(local)
    assert remote.run.ranks >= 2


def test_a_connected_client_is_used_and_left_open(cluster):
    path = (DATA / "straggler_comms_id").absolute()
    with distributed.Client(cluster, set_as_default=False) as client:
        remote = gpudiag.analyze(path, scheduler=client)
        assert client.status == "running"
        assert _json(remote) == _json(gpudiag.analyze(path))


def test_cli_scheduler_matches_the_local_report_and_names_files_absolutely(cluster):
    # GIVEN a relative path, as a user types it in the directory that holds the traces
    res, _ = _cli(
        "analyze",
        "pipeline_4stage",
        "-f",
        "json",
        "--scheduler",
        cluster.scheduler_address,
        cwd=DATA,
    )
    local, _ = _cli("analyze", str(DATA / "pipeline_4stage"), "-f", "json")
    assert res.returncode == 0, res.stderr
    # THEN the report is the local one: the workers were given the absolute path
    assert res.stdout == local.stdout
    assert res.stderr == "" == local.stderr  # no progress bar when stderr is not a terminal
    doc = json.loads(res.stdout)
    assert doc["inputs"] and all(Path(p).is_absolute() for p in doc["inputs"])


def test_a_bad_trace_fails_on_the_cluster_as_it_does_locally(cluster, tmp_path):
    good = DATA / "straggler_comms_id" / "rank-0.json.gz"
    shutil.copy(good, tmp_path / "rank-0.json.gz")
    (tmp_path / "rank-1.json.gz").write_bytes(good.read_bytes()[:300])  # truncated gzip
    remote, _ = _cli("analyze", str(tmp_path), "--scheduler", cluster.scheduler_address)
    local, _ = _cli("analyze", str(tmp_path))
    assert remote.returncode == local.returncode == 4
    assert _one_error(remote.stderr) == _one_error(local.stderr)
    assert "rank-1.json.gz" in remote.stderr


def test_rank_results_are_bounded_by_steps_and_collectives(tmp_path):
    # GIVEN one real rank, and the same rank with four times its events (4 copies)
    src = DATA / "straggler_comms_id" / "rank-0.json.gz"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "make_big_trace.py"),
            str(tmp_path),
            "--ranks",
            "1",
            "--copies",
            "4",
            "--source",
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    th = Thresholds()
    for path in (src, tmp_path / "rank-0.json.gz"):
        (res,) = RankWork(th)(load_run(path).sources[0])
        size = len(pickle.dumps(res, protocol=5))
        colls = len(res.collectives.type) if res.collectives else 0
        # THEN what crosses back costs a constant (meta + the evidence summaries: device,
        # workload, host API, kernel families, coverage; ~3.5 kB measured), ~100 B a step and
        # ~60 B a collective: nothing in it grows with the events
        assert size <= 4000 + 150 * len(res.steps) + 80 * colls, (path, size, res.events)
        assert res.events > 0


# ---- where the scheduler comes from ------------------------------------------------------


def test_scheduler_precedence_cli_then_environment_then_config():
    th = Thresholds(extra={"scheduler": "tcp://config:1"})
    env = {"DASK_SCHEDULER_ADDRESS": "tcp://env:2"}
    assert scheduler_address("tcp://cli:3", th, env) == "tcp://cli:3"
    assert scheduler_address(None, th, env) == "tcp://env:2"
    assert scheduler_address(None, th, {"DASK_SCHEDULER_ADDRESS": ""}) == "tcp://config:1"
    assert scheduler_address("local", th, env) is None
    assert scheduler_address(None, Thresholds(), {}) is None


def test_environment_and_config_reach_the_cli(cluster, tmp_path):
    trace = str(DATA / "straggler_comms_id")
    (tmp_path / "pyproject.toml").write_text('[tool.gpudiag]\nscheduler = "bogus://x"\n')
    # the config's address is used (and refused) when nothing else is given
    res, _ = _cli("analyze", trace, cwd=tmp_path)
    assert res.returncode == 2 and "'bogus://x'" in _one_error(res.stderr)
    # the environment wins over the config
    res, _ = _cli(
        "analyze", trace, cwd=tmp_path, env={"DASK_SCHEDULER_ADDRESS": cluster.scheduler_address}
    )
    assert res.returncode == 0, res.stderr
    # and --scheduler local over both
    res, _ = _cli(
        "analyze",
        trace,
        "--scheduler",
        "local",
        cwd=tmp_path,
        env={"DASK_SCHEDULER_ADDRESS": "bogus://y"},
    )
    assert res.returncode == 0, res.stderr
    # --jobs means local processes: it does not go with a cluster
    res, _ = _cli("analyze", trace, "-j", "2", "--scheduler", cluster.scheduler_address)
    assert res.returncode == 2 and "--jobs" in _one_error(res.stderr)


# ---- failures: one line, an exit code, bounded time -----------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_scheduler_is_one_line_within_the_timeout():
    addr = f"tcp://127.0.0.1:{_free_port()}"
    res, took = _cli("analyze", str(DATA / "straggler_comms_id"), "--scheduler", addr)
    assert res.returncode == 3
    line = _one_error(res.stderr)
    assert f"cannot reach the Dask scheduler at {addr} (no answer within 10 s)" in line
    assert took < 10 + 60  # the connect timeout, plus a slow interpreter start


def test_without_distributed_the_option_says_how_to_install_it():
    code = (
        "import sys; sys.modules['distributed'] = None\n"  # as if it were not installed
        "from gpudiag.cli.main import main\n"
        f"main(['analyze', {str(DATA / 'straggler_comms_id')!r}, '--scheduler', 'tcp://127.0.0.1:1'])"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=job_env(NO_SCHEDULER),
        timeout=300,
        check=False,
    )
    assert res.returncode == 3
    _one_error(res.stderr)
    assert "pip install 'gpudiag[dask]'" in res.stderr


def _held_on_a_worker(tmp_path: Path, shared: Path) -> tuple[Path, Path]:
    """rank-0 (a small trace) and rank-1 (a real 35 MB trace a worker reads for a while).

    gpudiag reads regular files only (a named pipe is refused before it is opened), so the
    worker is caught while it streams a large real trace: /proc shows it holding the file.
    """
    src = DATA / "straggler_comms_id"
    shutil.copy(src / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    big = tmp_path / "rank-1.json.gz"
    shutil.copy(shared / "kineto" / "a100x8_r3" / "rank-3.json.gz", big)
    return tmp_path / "rank-0.json.gz", big


def _reader_of(path: Path, deadline: float, killed: set[int] | None = None) -> int:
    """The pid of the process (a Dask worker) holding ``path`` open, other than ``killed``."""
    target = os.stat(path)
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid() or int(pid) in (killed or set()):
                continue
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    return int(pid)
        time.sleep(0.005)
    raise AssertionError(f"no worker opened {path}")


def _analyze_in_background(address: str, *paths: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudiag",
            "analyze",
            *map(str, paths),
            "-f",
            "json",
            "--scheduler",
            address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=job_env(),
    )


def test_a_worker_killed_mid_analysis_is_retried(fresh_cluster, tmp_path, shared_traces):
    r0, big = _held_on_a_worker(tmp_path, shared_traces)
    proc = _analyze_in_background(fresh_cluster.scheduler_address, r0, big)
    try:
        # WHEN the worker is killed while it reads rank 1 ...
        pid = _reader_of(big, time.monotonic() + START_S)
        os.kill(pid, 9)
        out, err = proc.communicate(timeout=START_S)
    finally:
        proc.kill()
    # THEN Dask runs the task again on a live worker, and the report is the local one
    assert proc.returncode == 0, err
    assert json.loads(out) == json.loads(_json(gpudiag.analyze(r0, big)))


def test_a_rank_whose_workers_keep_dying_is_named(fresh_cluster, tmp_path, shared_traces):
    r0, big = _held_on_a_worker(tmp_path, shared_traces)
    t0 = time.monotonic()
    proc = _analyze_in_background(fresh_cluster.scheduler_address, r0, big)
    killed: set[int] = set()
    deadline = t0 + 2 * START_S  # a bounded wait: a client that never returns fails here
    try:
        while proc.poll() is None and len(killed) < 5 and time.monotonic() < deadline:
            try:
                pid = _reader_of(big, time.monotonic() + 5, killed)
            except AssertionError:
                continue
            os.kill(pid, 9)
            killed.add(pid)
        out, err = proc.communicate(timeout=START_S)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    line = _one_error(err)
    assert f"{big}: the Dask workers analysing it died 2 times" in line
    assert out == "" and len(killed) == 2
    assert time.monotonic() - t0 < 2 * START_S


def _worker(
    address: str, local_dir: Path, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *prefix,
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            "--local-directory",
            str(local_dir),
        ],
        env=env or job_env(),
        cwd=str(local_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_for_worker(address: str) -> None:
    with distributed.Client(address, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=START_S)


def test_a_worker_that_cannot_read_the_path(bare_scheduler, tmp_path):
    # GIVEN traces the client can list (it never reads them) but the worker cannot read:
    # mode 000, and a root worker without the capabilities that bypass file modes
    traces = tmp_path / "traces"
    shutil.copytree(DATA / "straggler_comms_id", traces)
    for f in traces.iterdir():
        f.chmod(0)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("a root worker reads any file; setpriv (util-linux) would drop that")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    worker = _worker(bare_scheduler.scheduler_address, tmp_path, prefix=prefix)
    try:
        _wait_for_worker(bare_scheduler.scheduler_address)
        res, took = _cli("analyze", str(traces), "--scheduler", bare_scheduler.scheduler_address)
    finally:
        worker.kill()
        worker.wait()
    assert res.returncode == 3, res.stderr
    line = _one_error(res.stderr)
    assert f"the workers cannot read {traces}/rank-" in line
    assert "(permission denied on Dask worker tcp://" in line
    assert "paths must be on a filesystem the workers share" in line
    assert took < START_S


def test_another_gpudiag_on_the_workers_is_refused(bare_scheduler, tmp_path):
    # GIVEN a worker whose gpudiag is another version (a real copy, first on its path)
    other = tmp_path / "other"
    shutil.copytree(ROOT / "gpudiag", other / "gpudiag")
    init = other / "gpudiag" / "__init__.py"
    init.write_text(
        init.read_text().replace(
            f'__version__ = "{gpudiag.__version__}"', '__version__ = "0.0.1+skew"'
        )
    )
    env = job_env()
    env["PYTHONPATH"] = str(other)
    worker = _worker(bare_scheduler.scheduler_address, tmp_path, env=env)
    try:
        _wait_for_worker(bare_scheduler.scheduler_address)
        res, took = _cli(
            "analyze",
            str(DATA / "straggler_comms_id"),
            "--scheduler",
            bare_scheduler.scheduler_address,
        )
    finally:
        worker.kill()
        worker.wait()
    assert res.returncode == 3, res.stderr
    line = _one_error(res.stderr)
    assert f"this client runs gpudiag {gpudiag.__version__}" in line
    assert "gpudiag 0.0.1+skew on tcp://" in line
    assert took < START_S


# ---- progress ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "cluster"])
def test_progress_bar_on_a_terminal_only(cluster, where):
    import pty

    args = [
        sys.executable,
        "-m",
        "gpudiag",
        "analyze",
        str(DATA / "pipeline_4stage"),
        "-f",
        "json",
        "--scheduler",
        cluster.scheduler_address if where == "cluster" else "local",
    ]
    leader, follower = pty.openpty()
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end closed
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            env=job_env({"COLUMNS": "120"}),
        )
        os.close(follower)
        out, _ = proc.communicate(timeout=300)
        reader.join(timeout=60)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    assert json.loads(out)["run"]["ranks"] == 4  # stdout: the report only
    terminal = b"".join(seen)
    assert b"4/4" in terminal and b"rank traces" in terminal, terminal
