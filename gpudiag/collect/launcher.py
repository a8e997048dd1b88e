"""Builds and supervises the child command, forwards signals, records its exit in the manifest.

The child runs in its own session (``start_new_session=True``), so terminal signals reach
gpudiag only and are forwarded exactly once to the child's process group: SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2. A new session, rather than only a new
process group, keeps a job that reads the terminal from being stopped by SIGTTIN. The
child inherits stdin, stdout and stderr (no pipes, so it can never block on gpudiag).
gpudiag's exit code is the child's (128 + N when it died by signal N); failures of the
capture are logged once to stderr and listed in ``manifest.diagnosis_incomplete``.

Nothing the launcher does can stop the job: the samplers (NVML, run conditions) are
threads of this process, every file the job needs is its own, and a ``gpudiag`` killed
outright (SIGKILL) leaves the job running in its session, with the manifest written at
launch (``ended_ns`` null, ``extra.child_pid`` set) and every telemetry line whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import gpudiag
from gpudiag import rundir
from gpudiag.collect import bootstrap, outcome, watchdog
from gpudiag.collect import nsys as nsys_capture
from gpudiag.collect.conditions import DEFAULT_INTERVAL_S, ConditionsSampler
from gpudiag.collect.nvml import NvmlSampler, load_nvml
from gpudiag.records import dataclass
from gpudiag.runconditions import RunConditions

FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def log(msg: str) -> None:
    """Gpudiag's own messages go to stderr, never stdout; a closed stderr is not an error."""
    with contextlib.suppress(Exception):
        print(f"gpudiag: {msg}", file=sys.stderr, flush=True)


class Watcher(Protocol):
    """A reader of the run directory while the job runs (the live alerts, gpudiag/live/)."""

    name: str

    def start(self, run_dir: Path, child_pid: int) -> None:
        """The job was started; follow ``run_dir``."""

    def stop(self) -> dict[str, Any]:
        """The job ended: finish, and say what to record in ``manifest.extra[name]``."""


@dataclass
class RunOptions:
    """What ``gpudiag run`` was asked to do."""

    command: list[str]
    out: Path | None = None
    profile_steps: str | None = "5:10"
    nvml: bool = True
    nvml_interval_s: float = 0.1
    node_rank: int | None = None
    nvml_backend: Any = None
    nsys: bool = False
    nsys_range: str = "window"
    conditions: bool = True
    conditions_interval_s: float = DEFAULT_INTERVAL_S
    watchers: list[Watcher] = field(default_factory=list)
    hang: watchdog.HangOptions | None = None  # None: no watchdog (collect/watchdog.py)


@dataclass
class RankProgress:
    """Steps seen so far for one rank, from its telemetry file."""

    steps: int = 0
    steps_per_s: float | None = None
    last_end_ns: int | None = None


@dataclass
class Progress:
    """A snapshot for the live display."""

    run_dir: Path
    elapsed_s: float
    gpus: list[dict[str, Any]] = field(default_factory=list)
    ranks: dict[int, RankProgress] = field(default_factory=dict)
    alerts: list[str] = field(default_factory=list)  # raised now (the watchers' lines)


@dataclass
class RunResult:
    """What the run left behind."""

    out_dir: Path
    run_dir: Path
    exit_code: int
    manifest: rundir.RunManifest


def default_out_dir(now: float | None = None) -> Path:
    """``runs/<YYYYmmdd-HHMMSS>-<short id>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return Path("runs") / f"{stamp}-{secrets.token_hex(3)}"


def _launcher_option(command: Sequence[str], *names: str) -> str | None:
    """The value of a launcher option (``--opt V`` or ``--opt=V``) before the script."""
    for i, a in enumerate(command):
        if a in names:
            return command[i + 1] if i + 1 < len(command) else None
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _nnodes(command: Sequence[str], env: dict[str, str]) -> int:
    val = _launcher_option(command, "--nnodes", "--nnodes_")
    if val:
        with contextlib.suppress(ValueError):
            return int(val.split(":")[-1])
    with contextlib.suppress(ValueError):
        return int(env.get("SLURM_NNODES", "1"))
    return 1


def _node_rank(command: Sequence[str], env: dict[str, str]) -> int | None:
    """The launcher's ``--node-rank``, else GROUP_RANK / SLURM_NODEID of this environment."""
    val = _launcher_option(command, "--node-rank", "--node_rank")
    if val and val.isdigit():
        return int(val)
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        if env.get(var, "").isdigit():
            return int(env[var])
    return None


def layout(opts: RunOptions, env: dict[str, str]) -> tuple[Path, Path, int]:
    """(out dir, this node's run dir, node rank): ``node-<K>/`` only for multi-node runs."""
    out = opts.out or default_out_dir()
    node_rank = opts.node_rank if opts.node_rank is not None else _node_rank(opts.command, env)
    multi = opts.node_rank is not None or _nnodes(opts.command, env) > 1
    k = node_rank or 0
    return out, (rundir.node_dir(out, k) if multi else out), k


def python_flags_problem(command: Sequence[str]) -> str | None:
    """Why the bootstrap cannot run in this command (``python -S/-E/-I``), or None."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    for a in command[1:]:
        if not a.startswith("-") or a in ("-m", "-c"):
            break
        if a.startswith("-") and not a.startswith("--") and set(a[1:]) & set("SEI"):
            return f"{command[0]} {a} ignores PYTHONPATH or site: rank hooks not installed"
    return None


def child_env(run_dir: Path, node_rank: int, opts: RunOptions) -> dict[str, str]:
    """The job's environment plus the variables that switch the rank bootstrap on."""
    env = dict(os.environ)
    env.pop(bootstrap.ENV_RANK_PID, None)
    env.pop(bootstrap.ENV_EXEC_STATE, None)
    site = str(bootstrap.site_dir())
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = site + (os.pathsep + old if old else "")
    env[bootstrap.ENV_RUN_DIR] = str(run_dir.resolve())
    env[bootstrap.ENV_PROFILE] = opts.profile_steps or "off"
    env[bootstrap.ENV_NODE_RANK] = str(node_rank)
    env[bootstrap.ENV_PKG_ROOT] = str(Path(gpudiag.__file__).resolve().parent.parent)
    if opts.nsys:
        env[nsys_capture.ENV_RANGE] = opts.nsys_range
    if opts.hang is not None:
        opts.hang.flight_recorder = watchdog.flight_recorder_env(env, run_dir)
    return env


class StepsTail:
    """Follows every ``rank-*.steps.jsonl`` of a run directory for the live display."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}
        self.ranks: dict[int, RankProgress] = {}
        self.history: dict[int, list[tuple[float, int]]] = {}

    def poll(self) -> dict[int, RankProgress]:
        """Read the lines appended since the last poll."""
        now = time.monotonic()
        for rank, lines in rundir.appended_step_lines(self.run_dir, self.offsets):
            rp = self.ranks.setdefault(rank, RankProgress())
            rp.steps += sum(b'"type":"step"' in line for line in lines)
            hist = self.history.setdefault(rank, [])
            hist.append((now, rp.steps))
            while len(hist) > 2 and now - hist[0][0] > 10.0:
                hist.pop(0)
            t0, s0 = hist[0]
            rp.steps_per_s = (rp.steps - s0) / (now - t0) if now - t0 > 0.5 else None
        return self.ranks


@contextlib.contextmanager
def forward_signals(child: subprocess.Popen[bytes]) -> Iterator[list[int]]:
    """Forward the job-control signals to the child's process group while the block runs."""
    received: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in FORWARDED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                old[sig] = signal.signal(sig, handler)
    try:
        yield received
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def exit_status(returncode: int) -> int:
    """The shell convention: the code itself, or 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run(
    opts: RunOptions,
    progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 1.0,
) -> RunResult:
    """Launch the command, capture while it runs, write the manifest; never raises after launch."""
    env0 = dict(os.environ)
    # --nsys without nsys fails before anything is created or launched
    nsys_bin, nsys_ver = nsys_capture.resolve() if opts.nsys else ("", "")
    out, run_dir, node_rank = layout(opts, env0)
    _make_run_dir(run_dir)
    host = socket.gethostname()
    m = _new_manifest(opts, run_dir, host, node_rank)
    command = list(opts.command)
    if nsys_bin:
        (run_dir / rundir.NSYS_DIR).mkdir(parents=True, exist_ok=True)
        base = nsys_capture.report_base(run_dir, node_rank)
        command = nsys_capture.profile_command(nsys_bin, base, command, opts.nsys_range)
        m.extra["nsys"] = {"binary": nsys_bin, "version": nsys_ver, "range": opts.nsys_range}
    sampler, nvml_mod = _start_sampler(opts, run_dir, host, m)
    _safe_write_manifest(run_dir, m)
    child = _spawn(opts, command, run_dir, node_rank, sampler)
    m.extra["child_pid"] = child.pid
    conditions = _start_conditions(opts, run_dir, host, child.pid, nvml_mod, m)
    _safe_write_manifest(run_dir, m)  # a gpudiag killed now leaves the child's pid behind
    watchers = _start_watchers(opts.watchers, run_dir, child.pid, m)
    wd = watchdog.start(opts.hang, run_dir, m)
    with forward_signals(child) as received:
        rc = _wait(child, run_dir, sampler, progress, progress_interval_s, wd, m)
    _stop_watchers(watchers, m)
    code = exit_status(rc)
    m.ended_ns = time.time_ns()
    m.exit_code = code
    if wd is not None:
        code = watchdog.finish(wd, m, code)
    code = outcome.interrupted(received, m, code)
    if received:
        m.extra["signals_forwarded"] = [signal.Signals(s).name for s in received]
    if conditions is not None:
        _finish_conditions(conditions, run_dir, m)
    if sampler is not None:
        sampler.stop()
        m.sources["nvml"].files = [str(sampler.path.relative_to(run_dir))]
        if sampler.errors:
            m.diagnosis_incomplete.extend(sampler.errors)
    if nsys_bin:
        _collect_nsys(nsys_bin, run_dir, node_rank, m)
    try:
        finish_manifest(run_dir, m)
    except Exception as e:
        msg = f"reading rank telemetry failed: {type(e).__name__}: {e}"
        log(msg)
        m.diagnosis_incomplete.append(msg)
    _safe_write_manifest(run_dir, m)
    return RunResult(out, run_dir, code, m)


def _make_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from gpudiag.errors import GpudiagError

        raise GpudiagError(
            f"cannot create the run directory {run_dir} ({e}); the job was not started",
            "pass --out DIR on a writable filesystem",
            exit_code=3,
        ) from e


def _new_manifest(opts: RunOptions, run_dir: Path, host: str, node_rank: int) -> rundir.RunManifest:
    m = rundir.RunManifest(
        gpudiag_version=gpudiag.__version__,
        argv=list(opts.command),
        started_ns=time.time_ns(),
        hosts=[host],
        node_rank=node_rank,
        profile_steps=opts.profile_steps,
        extra={"gpudiag_argv": list(sys.argv), "run_dir": str(run_dir)},
    )
    problem = python_flags_problem(opts.command)
    if problem:
        log(problem)
        m.diagnosis_incomplete.append(problem)
    return m


def _spawn(
    opts: RunOptions,
    command: list[str],
    run_dir: Path,
    node_rank: int,
    sampler: NvmlSampler | None,
) -> subprocess.Popen[bytes]:
    """Start the job in its own session; a command that cannot start stops the sampler."""
    try:
        return subprocess.Popen(
            command, env=child_env(run_dir, node_rank, opts), start_new_session=True
        )
    except OSError as e:
        if sampler is not None:
            sampler.stop()
        from gpudiag.errors import GpudiagError

        # What a shell would exit with: 127 not found, 126 not executable.
        code = 127 if isinstance(e, FileNotFoundError) else 126
        raise GpudiagError(
            f"cannot start {opts.command[0]!r}: {e}", "check the command after `--`", exit_code=code
        ) from e


def _wait(
    child: subprocess.Popen[bytes],
    run_dir: Path,
    sampler: NvmlSampler | None,
    progress: Callable[[Progress], None] | None,
    interval_s: float,
    wd: watchdog.Running | None = None,
    m: rundir.RunManifest | None = None,
) -> int:
    """Wait for the job, showing progress every ``interval_s``; its return code.

    With a hang watchdog it looks at least once a second, and returns once it ended the job.
    """
    tail = StepsTail(run_dir)
    t0 = time.monotonic()
    if wd is not None:
        interval_s = min(interval_s, 1.0)
    while True:
        try:
            return child.wait(timeout=interval_s)
        except subprocess.TimeoutExpired:
            pass
        if wd is not None and m is not None and watchdog.tick(wd, child, m):
            return child.wait()
        if progress is not None:
            try:
                snap = Progress(run_dir, time.monotonic() - t0, ranks=dict(tail.poll()))
                if sampler is not None:
                    snap.gpus = list(sampler.latest.values())
                progress(snap)
            except Exception as e:
                log(f"live display stopped ({e})")
                progress = None


def _start_watchers(
    watchers: Sequence[Watcher], run_dir: Path, pid: int, m: rundir.RunManifest
) -> list[Watcher]:
    """Start each watcher; one that fails is logged and left out, the job runs on."""
    started = []
    for w in watchers:
        try:
            w.start(run_dir, pid)
            started.append(w)
        except Exception as e:
            msg = f"{w.name} not started: {type(e).__name__}: {e}"
            log(msg)
            m.diagnosis_incomplete.append(msg)
    return started


def _stop_watchers(watchers: Sequence[Watcher], m: rundir.RunManifest) -> None:
    for w in watchers:
        try:
            m.extra[w.name] = w.stop()
        except Exception as e:
            msg = f"{w.name} failed: {type(e).__name__}: {e}"
            log(msg)
            m.diagnosis_incomplete.append(msg)


def _collect_nsys(nsys_bin: str, run_dir: Path, node_rank: int, m: rundir.RunManifest) -> None:
    try:
        m.sources["nsys"] = nsys_capture.collect(nsys_bin, run_dir, node_rank)
    except Exception as e:
        m.sources["nsys"] = rundir.SourceStatus(False, f"nsys export failed: {e}")
    if not m.sources["nsys"].captured:
        log(f"Nsight Systems: {m.sources['nsys'].reason}")


def _start_sampler(
    opts: RunOptions, run_dir: Path, host: str, m: rundir.RunManifest
) -> tuple[NvmlSampler | None, Any]:
    """The NVML sampler (started) and the initialised NVML module, each None when absent."""
    if not opts.nvml:
        m.sources["nvml"] = rundir.SourceStatus(False, "disabled with --no-nvml")
        return None, None
    nvml_mod = None
    try:
        nv = load_nvml(opts.nvml_backend)
        if nv.nvml is None:
            log(f"NVML not available ({nv.reason}); GPU-utilisation columns will be empty")
            m.sources["nvml"] = rundir.SourceStatus(False, nv.reason)
            return None, None
        nvml_mod = nv.nvml
        s = NvmlSampler(
            nv.nvml,
            rundir.nvml_path(run_dir, host),
            host,
            interval_s=opts.nvml_interval_s,
            driver_version=nv.driver_version,
        )
        if not s.gpus:
            m.sources["nvml"] = rundir.SourceStatus(False, "NVML reports no GPUs")
            return None, None
        s.start()
        m.sources["nvml"] = rundir.SourceStatus(True)
        m.extra["driver_version"] = nv.driver_version
        return s, nvml_mod
    except Exception as e:
        msg = f"NVML sampler not started: {type(e).__name__}: {e}"
        log(msg)
        m.sources["nvml"] = rundir.SourceStatus(False, msg)
        m.diagnosis_incomplete.append(msg)
        return None, nvml_mod


def _start_conditions(
    opts: RunOptions, run_dir: Path, host: str, pid: int, nvml_mod: Any, m: rundir.RunManifest
) -> ConditionsSampler | None:
    if not opts.conditions:
        m.sources["conditions"] = rundir.SourceStatus(False, "not requested")
        return None
    try:
        c = ConditionsSampler(
            rundir.conditions_path(run_dir, host),
            host,
            job_pid=pid,
            interval_s=opts.conditions_interval_s,
            nvml=nvml_mod,
            faults=os.environ.get(bootstrap.ENV_FAULT),
        )
        c.start()
        return c
    except Exception as e:
        msg = f"run-conditions sampler not started: {type(e).__name__}: {e}"
        log(msg)
        m.sources["conditions"] = rundir.SourceStatus(False, msg)
        m.diagnosis_incomplete.append(msg)
        return None


def _finish_conditions(c: ConditionsSampler, run_dir: Path, m: rundir.RunManifest) -> None:
    try:
        c.stop()
        summary = c.summary()
        m.conditions = RunConditions(summary)
        if c.samples_written:
            summary["file"] = str(c.path.relative_to(run_dir))
            m.sources["conditions"] = rundir.SourceStatus(True, files=[summary["file"]])
        else:
            m.sources["conditions"] = rundir.SourceStatus(
                False, "; ".join(c.errors) or "no sample was taken"
            )
        m.diagnosis_incomplete.extend(c.errors)
    except Exception as e:
        msg = f"run conditions lost: {type(e).__name__}: {e}"
        log(msg)
        m.sources["conditions"] = rundir.SourceStatus(False, msg)
        m.diagnosis_incomplete.append(msg)


def _safe_write_manifest(run_dir: Path, m: rundir.RunManifest) -> None:
    try:
        rundir.write_manifest(run_dir, m)
    except Exception as e:
        log(f"cannot write the manifest in {run_dir}: {e}")


def read_rank_records(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int]:
    """(last header, every record but steps, step count) of one telemetry file."""
    header: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    steps = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if '"type":"step"' in line:
                steps += 1
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("type") == "header":
                header, events, steps = rec, [], 0  # a restarted rank starts a new segment
            else:
                events.append(rec)
    return header, events, steps


def suggest_window(steps: int) -> str | None:
    """A ``--profile-steps`` that fits a job of ``steps`` steps (one warm-up step before it)."""
    if steps < 2:
        return None
    a = min(5, max(1, steps // 3))
    return f"{a}:{min(steps, a + 5)}"


def finish_manifest(run_dir: Path, m: rundir.RunManifest) -> None:
    """Fill ranks, hosts, world size and sources from what the ranks wrote."""
    ranks_dir = run_dir / rundir.RANKS_DIR
    files = (
        sorted(p for p in ranks_dir.glob("rank-*.steps.jsonl") if p.is_file())
        if ranks_dir.is_dir()
        else []
    )
    errors: list[dict[str, Any]] = []
    per_rank: dict[int, list[dict[str, Any]]] = {}
    steps_total = 0
    for path in files:
        header, events, steps = read_rank_records(path)
        if header is None:
            continue
        r = int(header["rank"])
        steps_total += steps
        per_rank[r] = events
        m.ranks.append(
            rundir.RankInfo(
                rank=r,
                local_rank=int(header.get("local_rank", 0)),
                host=str(header.get("host", "")),
                pid=header.get("pid"),
                gpu_uuid=header.get("gpu_uuid"),
                device=header.get("device"),
            )
        )
        if header.get("host") and header["host"] not in m.hosts:
            m.hosts.append(str(header["host"]))
        ws = header.get("world_size")
        if isinstance(ws, int):
            m.world_size = max(m.world_size or 0, ws)
        for ev in events:
            kind = ev.get("type")
            if kind == "error":
                errors.append({"rank": r, "where": ev.get("where"), "message": ev.get("message")})
                if ev.get("where") == "gpudiag":
                    m.diagnosis_incomplete.append(f"rank {r}: {ev.get('message')}")
            elif kind == "lost":
                m.diagnosis_incomplete.append(
                    f"rank {r}: telemetry lost {ev.get('records')} records (steps "
                    f"{ev.get('first_step')}-{ev.get('last_step')}): {ev.get('message')}"
                )
        kinds = {ev.get("type") for ev in events}
        if m.exit_code == 0 and steps and not kinds & {"exit", "exec"}:
            m.diagnosis_incomplete.append(
                f"rank {r}: telemetry ends without an exit record after {steps} steps "
                "(its last writes failed, or the rank was killed)"
            )
        m.extra.setdefault("steps_per_rank", {})[str(r)] = steps
    m.ranks.sort(key=lambda x: x.rank)
    if errors:
        m.extra["rank_errors"] = errors
    rel = [str(p.relative_to(run_dir)) for p in files]
    if steps_total:
        m.sources["telemetry"] = rundir.SourceStatus(True, files=rel)
    else:
        if ranks_dir.exists() and not ranks_dir.is_dir():
            why = f"{ranks_dir} is not a directory: the ranks could not write their telemetry"
        else:
            why = (
                "no rank reported a step: no torch.optim step() ran, the job is not Python, "
                "or python -S/-E/-I skipped the bootstrap"
            )
        m.sources["telemetry"] = rundir.SourceStatus(False, why, files=rel)
        m.diagnosis_incomplete.append(why)
    _job_profiler_extras(per_rank, m)
    m.sources["kineto"] = _kineto_status(run_dir, ranks_dir, per_rank, m)
    m.sources.setdefault("nsys", rundir.SourceStatus(False, "not requested"))


def _job_profiler_extras(per_rank: dict[int, list[dict[str, Any]]], m: rundir.RunManifest) -> None:
    """``extra.job_traces``, ``extra.job_profiler`` and ``extra.profile_windows``."""
    traces: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    windows: list[dict[str, Any]] = []
    for r, events in sorted(per_rank.items()):
        open_: dict[str, dict[str, Any]] = {}
        for ev in events:
            kind = ev.get("type")
            if kind == "job_trace":
                traces.append(
                    {"rank": r, **{k: ev.get(k) for k in ("path", "api", "step", "time_ns")},
                     "exists": os.path.exists(str(ev.get("path")))}
                )  # fmt: skip
            elif kind == "job_profiler" and ev.get("event") == "start":
                s = {"rank": r, "api": ev.get("api"), "start_step": ev.get("step"),
                     "start_ns": ev.get("time_ns"), "stop_step": None, "stop_ns": None}  # fmt: skip
                open_[str(ev.get("api"))] = s
                sessions.append(s)
            elif kind == "job_profiler" and ev.get("event") == "stop":
                s = open_.pop(str(ev.get("api")), {})
                if s:
                    s["stop_step"], s["stop_ns"] = ev.get("step"), ev.get("time_ns")
            elif kind == "window":
                windows.append(
                    {"rank": r, **{k: ev.get(k) for k in ("window", "status", "step", "reason",
                                                          "kept", "job_api", "job_since_step")}}
                )  # fmt: skip
    if traces:
        m.extra["job_traces"] = traces
    if sessions:
        m.extra["job_profiler"] = sessions
    if windows:
        m.extra["profile_windows"] = windows


def _kineto_status(
    run_dir: Path, ranks_dir: Path, per_rank: dict[int, list[dict[str, Any]]], m: rundir.RunManifest
) -> rundir.SourceStatus:
    """Whether gpudiag's traces were captured and, either way, what happened to the window."""
    traces = sorted(ranks_dir.glob("rank-*.pt.trace.json.gz")) if ranks_dir.is_dir() else []
    files = [str(p.relative_to(run_dir)) for p in traces]
    windows = [w for w in m.extra.get("profile_windows", []) if w.get("status") != "saved"]
    job_traces = m.extra.get("job_traces", [])
    tail = ""
    if job_traces:
        tail = (
            f"; the job's own traces: {len(job_traces)} file(s) in extra.job_traces, "
            f"e.g. {job_traces[0]['path']}"
        )
    note = _window_note(windows)
    if traces:
        lost_some = outcome.lost_traces(m.profile_steps, traces, per_rank, m.extra)
        note = "; ".join(x for x in (note, lost_some) if x)
        return rundir.SourceStatus(True, note + tail if note else "", files=files)
    if not m.profile_steps or m.profile_steps == "off":
        return rundir.SourceStatus(False, "profiling off (--profile-steps off)" + tail)
    if note:
        log(f"no profiler trace from gpudiag: {note}{tail}")
        return rundir.SourceStatus(False, note + tail)
    lost = outcome.lost_window(
        m.profile_steps, m.extra.get("steps_per_rank", {}), per_rank, m.exit_code
    )
    if lost:
        log(lost)
        return rundir.SourceStatus(False, lost + tail)
    most = max(m.extra.get("steps_per_rank", {}).values(), default=0)
    why = f"profile window {m.profile_steps} not reached: ranks ran {most} steps"
    fit = suggest_window(most)
    why += f"; rerun with --profile-steps {fit}" if fit else ""
    if most:
        log(why)
    return rundir.SourceStatus(False, why + tail)


def _window_note(windows: list[dict[str, Any]]) -> str:
    """One sentence on the first window that did not end normally, naming the ranks."""
    if not windows:
        return ""
    first = windows[0]
    same = sorted(
        {
            w["rank"]
            for w in windows
            if w.get("status") == first.get("status") and w.get("window") == first.get("window")
        }
    )
    who = "every rank" if len(same) == len({w["rank"] for w in windows}) else f"ranks {same}"
    w = first.get("window") or [0, 0]
    win = f"{w[0]}:{w[1]}"
    status, step, reason = first.get("status"), first.get("step"), first.get("reason") or ""
    api = first.get("job_api") or "torch.profiler"
    if status == "stood_down":
        if first.get("job_since_step") == 0:
            return f"the job runs its own {api} from step 0; no gpudiag window ({who})"
        return f"window {win} not opened at step {step}: {reason} ({who})"
    if status == "cut":
        kept = first.get("kept")
        if kept:
            return (
                f"window {win} cut at step {step}: {reason}; steps {kept[0]}-{kept[1] - 1} "
                f"kept ({who})"
            )
        return f"window {win} cut at step {step} before a complete step: {reason} ({who})"
    if status == "cut_by_exit":
        kept = first.get("kept") or w
        return f"window {win} cut by the job's exit; steps {kept[0]}-{kept[1] - 1} kept ({who})"
    if status == "not_reached":
        return ""  # the caller words it with the step count and a window that fits
    if status == "not_saved":
        return f"window {win}: {reason} ({who})"
    if status == "failed":
        return f"window {win} lost at step {step}: {reason} ({who})"
    return f"window {win} {status} at step {step}: {reason} ({who})"


def record_incomplete(run_dir: Path, message: str) -> None:
    """Append one 'diagnosis incomplete' reason to an existing manifest; never raises."""
    try:
        m = rundir.read_manifest(run_dir / rundir.MANIFEST)
        m.diagnosis_incomplete.append(message)
        rundir.write_manifest(run_dir, m)
    except Exception as e:
        log(f"cannot update the manifest: {e}")
