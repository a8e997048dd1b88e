"""A job-control signal at any moment of ``gpudiag run``'s start reaches the job.

The job runs in a session of its own, so a Ctrl-C reaches it only through gpudiag. The
signal is sent from inside the launcher at two moments of its start, through the real
launcher and a real job: before the job exists (while it is being started) and right
after (while the run-conditions sampler starts, where beside a CPU hog a test's SIGINT
once landed before any handler: gpudiag exited 130, the job slept on, the manifest never
ended). Either way the job is interrupted, gpudiag says so, and the manifest is complete.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from gpudiag.collect.launch import launcher
from gpudiag.collect.launch.run_setup import RunOptions
from gpudiag.rundir import layout as rundir

JOB = "import time\ntime.sleep(30)\n"  # the default SIGINT: KeyboardInterrupt, then 130


@pytest.mark.parametrize("where", ["_spawn", "start_conditions"])
def test_sigint_during_start_reaches_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    real = getattr(launcher, where)

    def signalled(*args: object, **kw: object) -> object:
        if where == "_spawn":  # before the job exists
            os.kill(os.getpid(), signal.SIGINT)
            return real(*args, **kw)
        got = real(*args, **kw)  # the job exists: the sampler is starting
        os.kill(os.getpid(), signal.SIGINT)
        return got

    monkeypatch.setattr(launcher, where, signalled)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    opts = RunOptions([sys.executable, str(script)], out=tmp_path / "r", nvml=False)
    res = launcher.run(opts)
    # THEN the job ended by the signal, long before its 30 s, and gpudiag says interrupted
    assert res.exit_code == 130
    m = rundir.read_manifest(res.run_dir / rundir.MANIFEST)
    assert m.ended_ns is not None and m.exit_code not in (None, 0)
    assert (m.ended_ns - m.started_ns) / 1e9 < 20
    assert m.extra["signals_forwarded"] == ["SIGINT"]
    assert m.extra["interrupted"]["signal"] == "SIGINT"
