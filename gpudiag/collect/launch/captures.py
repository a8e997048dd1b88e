"""The captures beside the job: the NVML and run-conditions samplers, the watchers, the nsys export.

Each is started and stopped here; one that fails is logged, recorded in
``manifest.diagnosis_incomplete`` and left out: nothing here can stop the job.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpudiag.collect.launch import nsys as nsys_capture
from gpudiag.collect.launch.log import log
from gpudiag.collect.launch.run_setup import RunOptions, Watcher
from gpudiag.collect.rank import bootstrap
from gpudiag.collect.samplers.conditions import ConditionsSampler
from gpudiag.collect.samplers.nvml import NvmlSampler, load_nvml, nvidia_driver_loaded
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.conditions import RunConditions


def start_watchers(
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


def stop_watchers(watchers: Sequence[Watcher], m: rundir.RunManifest) -> None:
    """Stop each watcher and record what it says in ``manifest.extra``; a failure is logged."""
    for w in watchers:
        try:
            m.extra[w.name] = w.stop()
        except Exception as e:
            msg = f"{w.name} failed: {type(e).__name__}: {e}"
            log(msg)
            m.diagnosis_incomplete.append(msg)


def collect_nsys(nsys_bin: str, run_dir: Path, node_rank: int, m: rundir.RunManifest) -> None:
    """Export this node's Nsight Systems report and record the source's status."""
    try:
        m.sources["nsys"] = nsys_capture.collect(nsys_bin, run_dir, node_rank)
    except Exception as e:
        m.sources["nsys"] = rundir.SourceStatus(False, f"nsys export failed: {e}")
    if not m.sources["nsys"].captured:
        log(f"Nsight Systems: {m.sources['nsys'].reason}")


def start_nvml(
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
            if not nvidia_driver_loaded():  # a CPU-only host: nothing to warn about
                m.sources["nvml"] = rundir.SourceStatus(False, rundir.NO_NVIDIA_DRIVER)
                return None, None
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
        if nv.driver_version is not None:
            m.extra["driver_version"] = nv.driver_version
        return s, nvml_mod
    except Exception as e:
        msg = f"NVML sampler not started: {type(e).__name__}: {e}"
        log(msg)
        m.sources["nvml"] = rundir.SourceStatus(False, msg)
        m.diagnosis_incomplete.append(msg)
        return None, nvml_mod


def start_conditions(
    opts: RunOptions, run_dir: Path, host: str, pid: int, nvml_mod: Any, m: rundir.RunManifest
) -> ConditionsSampler | None:
    """The run-conditions sampler (started), None when not requested or it failed."""
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


def finish_conditions(c: ConditionsSampler, run_dir: Path, m: rundir.RunManifest) -> None:
    """Stop the run-conditions sampler and record its summary in the manifest."""
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
