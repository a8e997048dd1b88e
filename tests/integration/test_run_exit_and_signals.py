"""``gpudiag run`` exits with the child's code, forwards signals and keeps what was written."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from run_helpers import DEMO, run_gpudiag, start_gpudiag, step_lines, wait_for

from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import load_steps


def test_exit_code_is_the_childs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--no-analyze",
            "--",
            sys.executable,
            "-c",
            "import sys; print('hello from job'); sys.exit(3)",
        ]
    )
    assert r.returncode == 3, r.stderr
    assert r.stdout == "hello from job\n"  # the job's stdout untouched, nothing of ours
    m = rundir.read_manifest(out / "manifest.json")
    assert m.exit_code == 3
    assert m.sources["telemetry"].captured is False


def test_script_without_torch_runs_unchanged(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import sys, json\nprint(json.dumps(sys.argv[1:]))\n")
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(tmp_path / "r"),
            "--no-analyze",
            "--",
            sys.executable,
            str(script),
            "--lr",
            "3e-4",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["--lr", "3e-4"]


def test_missing_command_exits_127(tmp_path: Path) -> None:
    r = run_gpudiag(["run", "--out", str(tmp_path / "r"), "--", "no-such-command-xyz"])
    assert r.returncode == 127
    assert "cannot start" in r.stderr


def test_sigint_is_forwarded(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    ready = tmp_path / "ready"
    # ready only inside the try: a SIGINT sent as soon as the file exists cannot land
    # before the handler (seen beside a hog: the job died outside it, printing nothing)
    script.write_text(
        "import pathlib, sys, time\n"
        "try:\n"
        f"    pathlib.Path({str(ready)!r}).write_text('x')\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    print('got SIGINT')\n"
        "    sys.exit(42)\n"
    )
    p = start_gpudiag(
        ["run", "--out", str(tmp_path / "r"), "--no-analyze", "--", sys.executable, str(script)],
        tmp_path,
    )
    wait_for(ready.exists, 30)
    p.send_signal(signal.SIGINT)
    # issue 21: an interrupted `gpudiag run` exits 130; the job's own code is kept
    assert p.wait(30) == 130
    assert "got SIGINT" in (tmp_path / "stdout.txt").read_text()
    m = rundir.read_manifest(tmp_path / "r" / "manifest.json")
    assert m.extra["signals_forwarded"] == ["SIGINT"]
    assert m.exit_code == 42 and m.extra["interrupted"]["job_exit_code"] == 42


@pytest.mark.usefixtures("torch_required")
def test_sigterm_kills_job_143_and_keeps_telemetry(tmp_path: Path) -> None:
    out = tmp_path / "r"
    p = start_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--no-analyze",
            "--profile-steps",
            "off",
            "--",
            sys.executable,
            str(DEMO),
            "--steps",
            "100000",
            "--sleep-rank",
            "0",
            "--sleep-s",
            "0.02",
            "--hidden",
            "32",
            "--layers",
            "1",
            "--batch",
            "8",
            "--dim",
            "16",
        ],
        tmp_path,
    )
    steps = rundir.steps_path(out, 0)
    wait_for(lambda: len(step_lines(steps)) >= 3, 60)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143
    m = rundir.read_manifest(out / "manifest.json")
    assert m.exit_code == 143
    assert m.ranks[0].rank == 0
    df = load_steps(out)
    assert len(df) >= 3
    assert list(df["step"]) == list(range(len(df)))
