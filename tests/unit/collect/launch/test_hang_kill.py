"""``--on-hang kill`` ends the job as Ctrl-C does first, so the ranks' exit handlers run.

Truth from outside gpudiag: real child processes in their own process group; one writes a
file from its exit handler (as gpudiag's rank hook saves a cut profiler window), one
ignores SIGINT (a rank stuck where Python cannot raise), and what the OS says ended them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpudiag.collect.launch.watchdog import kill_job

SLEEPER = """
import atexit, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
atexit.register(lambda: out.write_text("saved"))
out.with_suffix(".ready").write_text("")
time.sleep(60)
"""


def _start(tmp: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp / f"{mode}.txt"
    p = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(out), mode],
        start_new_session=True,
        stderr=subprocess.DEVNULL,
    )
    # a loaded host can take many seconds to start an interpreter: signalling it before its
    # handlers are in place would test nothing, so wait for them (20 s was too short once)
    deadline = time.monotonic() + 120
    while not out.with_suffix(".ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.with_suffix(".ready").exists(), "the sleeper never started"
    return p, out


def _wait(p: subprocess.Popen[bytes]):  # type: ignore[no-untyped-def]
    def wait(t: float) -> int | None:
        try:
            return p.wait(timeout=t)
        except subprocess.TimeoutExpired:
            return None

    return wait


def test_sigint_first_lets_exit_handlers_run(tmp_path: Path) -> None:
    p, out = _start(tmp_path, "normal")
    try:
        assert kill_job(p.pid, _wait(p), interrupt_grace_s=10, kill_grace_s=1) == "SIGINT"
        assert out.read_text() == "saved"  # the exit handler ran: a window would be kept
    finally:
        p.kill()


def test_a_job_deaf_to_sigint_is_terminated(tmp_path: Path) -> None:
    p, out = _start(tmp_path, "ignore")
    try:
        t0 = time.monotonic()
        assert kill_job(p.pid, _wait(p), interrupt_grace_s=0.3, kill_grace_s=5) == "SIGTERM"
        assert time.monotonic() - t0 < 5 and p.returncode == -15 and not out.exists()
    finally:
        p.kill()
