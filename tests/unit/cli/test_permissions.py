"""Issue 13: unreadable inputs and unwritable outputs, seen by a process that file
permissions apply to (root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, via setpriv)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import job_env

SETPRIV = shutil.which("setpriv")
DROP = "-dac_override,-dac_read_search"
pytestmark = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0,
    reason="needs root and setpriv to run gpudiag with file permissions enforced",
)
TRACE = "kineto/edge_mi300x_triton_tiny/mi300x.json.gz"
EXPORT = "nsys/nsys-ai/healthy_1pct.sqlite"


def _gpudiag(*args: str) -> subprocess.CompletedProcess[str]:
    """gpudiag as a process that cannot bypass file permissions."""
    cmd = [
        str(SETPRIV),
        f"--bounding-set={DROP}",
        f"--inh-caps={DROP}",
        sys.executable,
        "-m",
        "gpudiag",
        *args,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=job_env(), timeout=300, check=False
    )


def _error(r: subprocess.CompletedProcess[str]) -> str:
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpudiag: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    return errors[0]


def test_unreadable_inputs_are_named(shared_traces: Path, tmp_path: Path) -> None:
    f = tmp_path / "rank-0.json.gz"
    shutil.copyfile(shared_traces / TRACE, f)
    f.chmod(0)
    r = _gpudiag("analyze", str(f))
    assert r.returncode == 4 and f"{f}: permission denied" in _error(r)
    f.chmod(0o644)
    sub = tmp_path / "more"
    sub.mkdir()
    sub.chmod(0)
    try:
        r = _gpudiag("analyze", str(tmp_path))
        assert r.returncode == 4 and f"{sub}: permission denied" in _error(r)
        r = _gpudiag("report", str(f), "-o", str(tmp_path / "x.html"))  # click used to refuse
        assert r.returncode == 0, r.stderr
    finally:
        sub.chmod(0o755)


def test_export_in_a_read_only_directory(shared_traces: Path, tmp_path: Path) -> None:
    """mode=ro failed here with 'attempt to write a readonly database' in WAL mode."""
    import sqlite3

    d = tmp_path / "ro"
    d.mkdir()
    p = d / "report.sqlite"
    shutil.copyfile(shared_traces / EXPORT, p)
    with sqlite3.connect(p) as con:
        con.execute("PRAGMA journal_mode=WAL")
    con.close()
    d.chmod(0o555)
    try:
        r = _gpudiag("analyze", str(p), "-f", "json")
        assert r.returncode == 0, r.stderr
        assert [x.name for x in d.iterdir()] == ["report.sqlite"]
    finally:
        d.chmod(0o755)


def test_unwritable_outputs_exit_3(shared_traces: Path, tmp_path: Path) -> None:
    trace = str(shared_traces / TRACE)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    locked = tmp_path / "locked.json"
    locked.write_text("keep me")
    locked.chmod(0o444)
    try:
        for target in (ro / "x.json", locked):
            r = _gpudiag("analyze", trace, "-f", "json", "-o", str(target))
            assert r.returncode == 3, r.stderr
            assert f"cannot write {target}" in _error(r)
        assert locked.read_text() == "keep me"
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
