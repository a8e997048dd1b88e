"""What ``gpudiag run`` is asked and where it writes: options, run directory, environment.

The run directory's layout (``node-<K>/`` only for multi-node runs) and the job's
environment (the variables that switch the rank bootstrap on).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, Protocol

import gpudiag
from gpudiag._support.records import dataclass
from gpudiag.collect.launch import nsys as nsys_capture
from gpudiag.collect.launch import watchdog
from gpudiag.collect.rank import bootstrap
from gpudiag.collect.samplers.conditions import DEFAULT_INTERVAL_S
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.sections import WatcherName


class Watcher(Protocol):
    """A reader of the run directory while the job runs (the live alerts, gpudiag/live/)."""

    name: WatcherName  # the key of its record in the manifest's extra

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
