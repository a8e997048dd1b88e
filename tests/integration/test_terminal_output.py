"""On a real terminal (tmux), ``gpudiag run``'s progress never overwrites what the job prints.

The truth is the terminal's own record: ``tmux capture-pane`` of the pane the job printed
into, history included. The job prints 12 lines on stdout and 3 on stderr, waits after the
sixth (so that gpudiag's status is drawn while the job's lines are on screen, and the pane is
resized), then exits with its own code.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, job_env

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

STATUS = re.compile(r"gpudiag: \d+s steps ")  # report/live.py's progress line
JOB = """\
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
for i in range(12):
    print(f"step {i} loss {1.0 / (i + 1):.4f}", flush=True)
    if i % 4 == 0:
        print(f"job stderr {i}", file=sys.stderr, flush=True)
    time.sleep(0.25)
    if i == 5:
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
sys.exit(7)
"""


def _tmux(session: str, *args: str) -> str:
    """tmux on the session's own server (``-L``, named as the session): never the user's, and
    never one that is exiting. On the shared default socket the second test of this module
    once failed to start its session (``new-session`` exit 1) while the server of the first,
    its last session killed, was shutting down."""
    r = subprocess.run(["tmux", "-L", session, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"tmux {shlex.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _end(session: str) -> None:
    """End the session's own server, and the session with it."""
    subprocess.run(["tmux", "-L", session, "kill-server"], check=False, capture_output=True)


def _pane(session: str) -> list[str]:
    return _tmux(session, "capture-pane", "-p", "-S", "-", "-t", session).splitlines()


def _wait(pred, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


def _start(tmp_path: Path, job_text: str, *job_args: str) -> tuple[str, Path]:
    """A tmux session (120×40) running ``gpudiag run -- python JOB ARGS``; (session, rc file)."""
    job, rc = tmp_path / "job.py", tmp_path / "rc"
    job.write_text(job_text)
    env = job_env({"TERM": "xterm-256color"})
    gpudiag = [
        sys.executable,
        "-m",
        "gpudiag",
        "run",
        "--out",
        str(tmp_path / "run"),
        "--no-analyze",
        "--",
        sys.executable,
        str(job),
        *job_args,
    ]
    script = tmp_path / "run.sh"
    script.write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if k.isidentifier())
        + f"cd {shlex.quote(str(ROOT))}\n{shlex.join(gpudiag)}\necho $? > {shlex.quote(str(rc))}\n"
        + "sleep 600\n"
    )
    session = f"gpudiag-test-{tmp_path.name}"[:60].replace(".", "-")
    _tmux(
        session,
        "new-session",
        "-d",
        "-s",
        session,
        "-x",
        "120",
        "-y",
        "40",
        f"bash {shlex.quote(str(script))}",
    )
    return session, rc


def test_every_job_line_survives_in_order_on_a_terminal(tmp_path: Path) -> None:
    go = tmp_path / "go"
    session, rc = _start(tmp_path, JOB, str(go))
    try:
        # gpudiag's status is on screen while the job's first six lines are
        shown = _wait(
            lambda: (
                any(STATUS.match(line) for line in _pane(session))
                and sum(line.startswith("step ") for line in _pane(session)) >= 6
            ),
            60,
        )
        during = _pane(session)
        _tmux(session, "resize-window", "-t", session, "-y", "30")  # SIGWINCH while the job prints
        go.write_text("x")
        assert _wait(rc.exists, 60), "\n".join(_pane(session))
        after = _pane(session)
    finally:
        _end(session)
    assert shown, "no gpudiag status while the job ran:\n" + "\n".join(during)
    steps = [line.rstrip() for line in after if line.startswith("step ")]
    assert steps == [f"step {i} loss {1.0 / (i + 1):.4f}" for i in range(12)], "\n".join(after)
    job_lines = [line.rstrip() for line in after if line.startswith(("step ", "job stderr"))]
    assert job_lines[:3] == ["step 0 loss 1.0000", "job stderr 0", "step 1 loss 0.5000"]
    assert [x for x in job_lines if x.startswith("job")] == [
        "job stderr 0",
        "job stderr 4",
        "job stderr 8",
    ]
    assert not any(STATUS.match(line) for line in after)  # the status is erased at the end
    assert rc.read_text().strip() == "7"  # the job's exit code, exactly
    # the job's lines are whole lines of the pane: nothing of gpudiag's is written into them
    assert not any("gpudiag" in line for line in steps)


INTERRUPTIBLE = """\
import sys, time
for i in range(3):
    print(f"line {i}", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("job got SIGINT", flush=True)
    sys.exit(5)
"""


def test_ctrl_c_on_the_terminal_reaches_the_job_once(tmp_path: Path) -> None:
    session, rc = _start(tmp_path, INTERRUPTIBLE)
    try:
        assert _wait(
            lambda: (
                any(STATUS.match(line) for line in _pane(session)) and "line 2" in _pane(session)
            ),
            60,
        ), "\n".join(_pane(session))
        _tmux(session, "send-keys", "-t", session, "C-c")
        assert _wait(rc.exists, 60), "\n".join(_pane(session))
        # the terminal echoes ^C where the cursor is, as it would without gpudiag
        after = [line.rstrip().removeprefix("^C") for line in _pane(session)]
    finally:
        _end(session)
    assert rc.read_text().strip() == "130"  # an interrupted run exits 130 (issue 21), as before
    assert [x for x in after if x.startswith(("line", "job"))] == [
        "line 0",
        "line 1",
        "line 2",
        "job got SIGINT",
    ]
    assert not any(STATUS.match(line) for line in after)
