"""Finds a running job's rank processes and GPUs by PID and samples them.

NVML lists the processes on each GPU by *host* PID. Inside a container without
``--pid=host`` those never match the PIDs seen here; when no GPU lists a PID of the
process tree, every GPU of the node is sampled and the manifest says why.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpudiag
from gpudiag._support.records import dataclass
from gpudiag.collect.samplers.nvml import NvmlSampler, gpu_pids, list_gpus, load_nvml
from gpudiag.rundir import layout as rundir


def process_tree(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """``pid`` and all its descendants, from ``/proc/<pid>/stat`` parent links."""
    children: dict[int, list[int]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p in tree:
            continue
        tree.add(p)
        todo.extend(children.get(p, []))
    return tree


def alive(pid: int) -> bool:
    """Whether the process exists (zombies count as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class AttachResult:
    """Where the samples went and how the GPUs were chosen."""

    run_dir: Path
    gpus: list[str]
    reason: str


def request_profile(run_dir: Path, steps: int) -> Path:
    """Ask the ranks of a live ``gpudiag run`` to profile their next ``steps`` steps."""
    path = rundir.control_path(run_dir)
    with rundir.atomic_write(path) as f:
        json.dump({"id": secrets.token_hex(4), "profile_next": steps, "time_ns": time.time_ns()}, f)
    return path


def attach(
    pid: int,
    out: Path,
    interval_s: float = 0.1,
    nvml: Any | None = None,
    stop: Callable[[], bool] | None = None,
) -> AttachResult:
    """Sample the GPUs of ``pid``'s process tree until it ends (or ``stop()``)."""
    from gpudiag.errors import EnvironmentProblem, UsageError

    if not alive(pid):
        raise UsageError(f"no running process with PID {pid}", "check the PID with `ps`")
    nv = load_nvml(nvml)
    if nv.nvml is None:
        raise EnvironmentProblem(
            f"NVML not available ({nv.reason}); attach only samples GPUs",
            "run on the GPU host, or start the container with `--gpus all`",
        )
    tree = process_tree(pid)
    chosen, reason = [], ""
    for g, h in list_gpus(nv.nvml):
        pids = gpu_pids(nv.nvml, h)
        if pids and pids & tree:
            chosen.append(g.uuid)
    if not chosen:
        reason = (
            "no GPU lists a PID of the process tree (NVML reports host PIDs; in a "
            "container use --pid=host): sampling every GPU"
        )
    host = socket.gethostname()
    m = rundir.RunManifest(
        gpudiag_version=gpudiag.__version__,
        argv=[f"attach --pid {pid}"],
        started_ns=time.time_ns(),
        hosts=[host],
        extra={
            "attached_pid": pid,
            "process_tree": sorted(tree),
            "gpu_selection": reason or "GPUs listing a PID of the process tree",
        },
    )
    s = NvmlSampler(
        nv.nvml,
        rundir.nvml_path(out, host),
        host,
        interval_s=interval_s,
        gpus=chosen or None,
        driver_version=nv.driver_version,
    )
    m.sources["nvml"] = rundir.SourceStatus(True, reason, [str(s.path.relative_to(out))])
    m.sources["telemetry"] = rundir.SourceStatus(False, "attach samples NVML only")
    m.sources["kineto"] = rundir.SourceStatus(False, "attach samples NVML only")
    rundir.write_manifest(out, m)
    s.start()
    try:
        while alive(pid) and not (stop is not None and stop()):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        s.stop()
        m.ended_ns = time.time_ns()
        m.diagnosis_incomplete.extend(s.errors)
        rundir.write_manifest(out, m)
    return AttachResult(out, [g.uuid for g, _ in s.gpus], reason)


def live_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` belongs to a ``gpudiag run`` that has not finished."""
    try:
        m = rundir.read_manifest(run_dir / rundir.MANIFEST)
    except ValueError:
        return False
    return m.exit_code is None and os.path.isdir(run_dir / rundir.RANKS_DIR)
