"""The capture commands' argument handling: doctor, attach."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpudiag.collect.launch.attach import process_tree, request_profile
from gpudiag.rundir import layout as rundir


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", *args], capture_output=True, text=True, timeout=180
    )


def test_doctor_json_says_why() -> None:
    r = _cli("doctor", "--json")
    assert r.returncode == 0, r.stderr
    caps = json.loads(r.stdout)
    assert caps["nvml"] or caps["nvml_reason"]
    assert caps["nsys_path"] or caps["nsys_reason"]


def test_attach_usage_errors(tmp_path: Path) -> None:
    assert _cli("attach").returncode == 2
    assert _cli("attach", "--profile-next", "3").returncode == 2
    r = _cli("attach", "--run", str(tmp_path), "--profile-next", "3")
    assert r.returncode == 2
    assert "no live" in r.stderr


def test_profile_request_on_live_run(tmp_path: Path) -> None:
    rundir.write_manifest(tmp_path, rundir.RunManifest())
    (tmp_path / "ranks").mkdir()
    r = _cli("attach", "--run", str(tmp_path), "--profile-next", "4")
    assert r.returncode == 0, r.stderr
    req = json.loads(rundir.control_path(tmp_path).read_text())
    assert req["profile_next"] == 4
    request_profile(tmp_path, 2)
    assert json.loads(rundir.control_path(tmp_path).read_text())["id"] != req["id"]


def test_process_tree_includes_children() -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", "import subprocess,sys; subprocess.run(['sleep','120'])"]
    )
    try:
        import time

        # the child needs its interpreter to start before it forks `sleep`: poll, since a
        # loaded host can take seconds for that (a fixed 0.5 s wait failed there)
        deadline = time.monotonic() + 60
        while len(process_tree(p.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(process_tree(p.pid)) >= 2
    finally:
        for pid in process_tree(p.pid) - {p.pid}:  # the `sleep` too, not left behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        p.kill()
        p.wait()
