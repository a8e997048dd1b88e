"""Issue 13: outputs (-o, --save-baseline, --junit, --markdown) never damage what they write to."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import job_env, run_cli

from gpudiag._support.fileio import check_output, write_output
from gpudiag.errors import EnvironmentProblem, UsageError

TRACE = "kineto/edge_mi300x_triton_tiny/mi300x.json.gz"


def _one_error_line(stderr: str) -> str:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("gpudiag: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def test_new_file_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with write_output(tmp_path / "a.json") as f:
            f.write("{}")
        os.umask(0o027)
        with write_output(tmp_path / "b.json") as f:
            f.write("{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o640


def test_replaced_file_keeps_its_mode_and_nothing_is_left_behind(tmp_path: Path) -> None:
    p = tmp_path / "r.md"
    p.write_text("old")
    p.chmod(0o600)
    with write_output(p) as f:
        f.write("new")
    assert p.read_text() == "new"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.md"]


def test_failed_render_leaves_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "r.md"
    p.write_text("old")

    def render() -> None:
        with write_output(p) as f:
            f.write("half")
            raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError):
        render()
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.md"]


def test_symlink_is_written_through_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert check_output(link) == "direct"
    with write_output(link) as f:
        f.write("new")
    assert link.is_symlink() and target.read_text() == "new"


def test_fifo_is_written_directly(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    assert check_output(fifo) == "direct"
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer does not block
    try:
        with write_output(fifo) as f:
            f.write("through the pipe")
        assert os.read(r, 100) == b"through the pipe"
    finally:
        os.close(r)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_dev_null_stays_a_device() -> None:
    assert check_output("/dev/null") == "direct"
    with write_output("/dev/null") as f:
        f.write("x" * 1000)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda p: p.mkdir(), UsageError, "it is a directory"),
        (lambda p: None, UsageError, "no such directory"),
    ],
)
def test_bad_targets_are_usage_errors(tmp_path: Path, make, error, words) -> None:
    target = tmp_path / "x.json" if words != "no such directory" else tmp_path / "no" / "x.json"
    make(target)
    with pytest.raises(error, match=words), write_output(target) as f:
        f.write("x")


def test_unwritable_target_is_an_environment_problem() -> None:
    with (
        pytest.raises(EnvironmentProblem, match=r"cannot write /proc/gpudiag\.json"),
        write_output("/proc/gpudiag.json") as f,
    ):
        f.write("x")


def test_cli_outputs(shared_traces: Path, tmp_path: Path) -> None:
    trace = str(shared_traces / TRACE)
    # -o - is stdout
    r = run_cli("analyze", trace, "-f", "json", "-o", "-")
    assert r.returncode == 0 and json.loads(r.stdout)["schema_version"] == 1
    # a directory, a missing parent: one line, exit 2; /proc: exit 3
    (tmp_path / "d").mkdir()
    for target, code in (
        (tmp_path / "d", 2),
        (tmp_path / "no" / "x.json", 2),
        (Path("/proc/x.json"), 3),
    ):
        r = run_cli("analyze", trace, "-f", "json", "-o", str(target))
        assert r.returncode == code, r.stderr
        assert str(target) in _one_error_line(r.stderr)
    # /dev/stdout appends where the shell appends (reopening it would truncate the log)
    log = tmp_path / "log.txt"
    log.write_text("first line\n")
    with log.open("a") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", "analyze", trace, "-f", "json", "-o", "/dev/stdout"],
            stdout=f,
            stderr=subprocess.PIPE,
            env=job_env(),
            check=False,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    assert text.startswith("first line\n") and '"schema_version": 1' in text


def test_gate_files_follow_the_rules(shared_traces: Path, tmp_path: Path) -> None:
    trace = str(shared_traces / TRACE)
    (tmp_path / "j").mkdir()
    r = run_cli("gate", trace, "--junit", str(tmp_path / "j"))
    assert r.returncode == 2 and "it is a directory" in _one_error_line(r.stderr)
    base = tmp_path / "base.json"
    r = run_cli(
        "gate",
        trace,
        "--save-baseline",
        str(base),
        "--junit",
        str(tmp_path / "g.xml"),
        "--markdown",
        str(tmp_path / "g.md"),
        "--inconclusive-ok",
    )
    assert r.returncode in (0, 1), r.stderr
    for name in ("base.json", "g.xml", "g.md"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
