"""Issue 12 in-process: the rank hook's failures (injected with GPUDIAG_FAULT or real) never
reach the job, and its telemetry file always holds whole records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpudiag.collect.rank import faults as F
from gpudiag.collect.rank import hook as H
from gpudiag.collect.rank import patches as P
from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import read_steps_file


def _hook(tmp_path: Path, faults: str = "") -> H.RankHook:
    return H.RankHook(tmp_path, rank=0, local_rank=0, world_size=1, window=None, faults=faults)


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    text = rundir.steps_path(tmp_path, 0).read_text()
    assert text.endswith("\n")
    return [json.loads(x) for x in text.splitlines()]  # every line whole


def test_parse_faults() -> None:
    assert F.parse_faults("hook:data, hook:step@3,write:enospc@3-5,hook:comm@4-,nvml:x") == {
        "hook:data": (0, None),
        "hook:step": (3, 3),
        "write:enospc": (3, 5),
        "hook:comm": (4, None),
    }
    with pytest.raises(ValueError, match="unknown site"):
        F.parse_faults("hook:nope")


def test_full_disk_drops_records_whole_and_says_what_was_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN writes that stop half-way with ENOSPC during steps 2..3
    h = _hook(tmp_path, "write:enospc@2-3")
    for _ in range(6):
        h.end_step()
    h.at_exit()
    recs = _records(tmp_path)
    # THEN no half line was left, steps 2-3 are missing, and a `lost` record says so
    assert [r["step"] for r in recs if r["type"] == "step"] == [0, 1, 4, 5]
    lost = [r for r in recs if r["type"] == "lost"]
    assert len(lost) == 1
    assert (lost[0]["records"], lost[0]["first_step"], lost[0]["last_step"]) == (2, 2, 3)
    assert lost[0]["types"] == {"step": 2}  # what was lost, by record type
    assert "No space left" in lost[0]["message"]
    assert recs[-1]["type"] == "exit"
    assert capsys.readouterr().err.count("telemetry write failed") == 1  # logged once
    _, steps, _ = read_steps_file(rundir.steps_path(tmp_path, 0))  # the loader agrees
    assert [s["step"] for s in steps] == [0, 1, 4, 5]


def test_unwritable_directory_then_writable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN ranks/ is a file: the rank cannot create its telemetry
    (tmp_path / rundir.RANKS_DIR).write_text("not a directory")
    h = _hook(tmp_path)
    h.end_step()
    h.end_step()
    assert h.enabled  # the hook carries on
    assert "telemetry write failed" in capsys.readouterr().err
    # WHEN the directory becomes usable, the file starts with a header and the loss
    (tmp_path / rundir.RANKS_DIR).unlink()
    h.end_step()
    recs = _records(tmp_path)
    assert [r["type"] for r in recs] == ["header", "lost", "step"]
    assert recs[1]["records"] == 2
    assert recs[2]["step"] == 2


def test_forked_child_never_writes_to_the_ranks_file(tmp_path: Path) -> None:
    h = _hook(tmp_path)
    os.register_at_fork(after_in_child=h.after_fork_in_child)
    h.end_step()
    pid = os.fork()
    if pid == 0:  # the child: what a DataLoader worker or os.fork() child could do
        try:
            h.end_step()
            h.record_error("job", "from the child")
            h.at_exit()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    h.end_step()
    h.at_exit()
    assert [r["type"] for r in _records(tmp_path)] == ["header", "step", "step", "exit"]


class Boom(Exception):
    pass


@pytest.mark.parametrize(
    ("site", "make"),
    [
        ("hook:data", lambda h, f: P._wrap_data(h, f)),
        ("hook:comm", lambda h, f: P._wrap_comm(h, f, is_wait=False)),
        ("hook:backward", lambda h, f: P._wrap_backward(h, f)),
    ],
)
def test_wrapper_faults_never_change_the_jobs_call(tmp_path: Path, site: str, make: Any) -> None:
    # GIVEN a wrapper whose gpudiag part fails
    h = _hook(tmp_path, site)
    calls: list[Any] = []

    def job_fn(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if args and args[0] == "raise":
            raise Boom("the job's own error")
        return ("result", args)

    w = make(h, job_fn)
    # THEN the job's function runs once, its result comes back, gpudiag turns itself off
    assert w("x") == ("result", ("x",))
    assert len(calls) == 1
    assert not h.enabled
    # AND a later call passes straight through, the job's own exception unchanged
    with pytest.raises(Boom, match="the job's own error"):
        w("raise")
    assert len(calls) == 2
    errors = [r for r in _records(tmp_path) if r["type"] == "error"]
    assert len(errors) == 1
    assert site in errors[0]["message"]


def test_jobs_exception_passes_through_a_failing_wrapper(tmp_path: Path) -> None:
    # GIVEN a failing gpudiag part AND a job function that raises: the job's error wins
    h = _hook(tmp_path, "hook:data")

    def job_next(_it: Any) -> Any:
        raise StopIteration

    with pytest.raises(StopIteration):
        P._wrap_data(h, job_next)(object())
    assert not h.enabled


def test_exit_fault_still_closes_the_file(tmp_path: Path) -> None:
    h = _hook(tmp_path, "hook:exit")
    h.end_step()
    h.at_exit()
    recs = _records(tmp_path)
    assert [r["type"] for r in recs] == ["header", "step", "error", "exit"]
    assert "hook:exit" in recs[2]["message"]
