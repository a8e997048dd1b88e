"""Issue 21: the launcher's hang watchdog and the rank's responder thread.

The responder is exercised for real in this process: one thread spins in pure Python
(holding the GIL between switch intervals), another blocks in C (``time.sleep``), and the
responder, told through the control file, must still write every thread's stack.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpudiag.collect.launch import outcome, watchdog
from gpudiag.collect.rank import hangdump
from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.flightrec import read_dump, read_stacks


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _steps(run_dir: Path, rank: int, n: int, dur_ns: int = 100_000_000) -> None:
    p = rundir.steps_path(run_dir, rank)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {"type": "step", "step": i, "start_ns": i * dur_ns, "end_ns": (i + 1) * dur_ns},
                    separators=(",", ":"),
                )
                + "\n"
            )


def _answer(run_dir: Path, rank: int, rid: str) -> None:
    p = hangdump.stacks_path(run_dir, rank)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(
        json.dumps(
            {"format": "gpudiag.stacks", "rank": rank, "request": rid, "time_ns": 1, "threads": []}
        )
    )


def test_watchdog_fires_after_timeout_asks_and_reports(tmp_path: Path) -> None:
    clock, seen = Clock(), []
    wd = watchdog.Watchdog(tmp_path, 15.0, "kill", seen.append, clock=clock)
    _steps(tmp_path, 0, 5)
    _steps(tmp_path, 1, 5)
    assert not wd.tick() and wd.event is None
    clock.t = 14.9
    assert not wd.tick() and wd.event is None
    clock.t = 15.0
    assert not wd.tick()
    ev = wd.event
    assert ev is not None and ev.expected == [0, 1] and ev.steps == {0: 5, 1: 5}
    req = json.loads(rundir.control_path(tmp_path).read_text())
    assert req["hang_dump"]["id"] == ev.request_id
    _answer(tmp_path, 0, ev.request_id)
    clock.t = 16.0
    assert not wd.tick() and not seen  # rank 1 has not answered yet
    _answer(tmp_path, 1, ev.request_id)
    clock.t = 16.5
    assert wd.tick() is True  # --on-hang kill
    assert seen == [ev] and ev.answered == [0, 1]
    assert not wd.tick()  # once per run


def test_progress_resets_the_clock_and_report_mode_never_kills(tmp_path: Path) -> None:
    clock = Clock()
    wd = watchdog.Watchdog(tmp_path, 10.0, "report", None, clock=clock, answer_wait_s=2.0)
    _steps(tmp_path, 0, 3)
    wd.tick()
    clock.t = 9.0
    _steps(tmp_path, 0, 1)
    wd.tick()
    clock.t = 18.0
    wd.tick()
    assert wd.event is None  # 9 s since the last step
    clock.t = 19.0
    wd.tick()
    assert wd.event is not None
    clock.t = 21.5  # nobody answers: reported after answer_wait_s, not killed
    assert wd.tick() is False and wd._reported


def test_automatic_timeout_rule(tmp_path: Path) -> None:
    wd = watchdog.Watchdog(tmp_path, None, "report", None, min_timeout_s=300, step_factor=20)
    assert wd.timeout_s() == 300  # before any step
    _steps(tmp_path, 0, 9, dur_ns=30 * 10**9)  # 30 s steps: 20 × 30 s = 600 s
    wd.tail.poll()
    assert wd.timeout_s() == 600
    fixed = watchdog.Watchdog(tmp_path / "x", 15.0, "report", None, min_timeout_s=300)
    assert fixed.timeout_s() == 300  # start-up: at least the minimum
    _steps(tmp_path / "x", 0, 1)
    fixed.tail.poll()
    assert fixed.timeout_s() == 15.0


def test_flight_recorder_env_respects_the_job(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    info = watchdog.flight_recorder_env(env, tmp_path)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and info["set_by"] == "gpudiag"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].endswith("ranks/hang/torch_fr_rank_")
    env = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/x/y_"}
    info = watchdog.flight_recorder_env(env, tmp_path)
    assert env == {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/x/y_"}
    assert "TORCH_FR_BUFFER_SIZE" in info["set_by"]


def spin_in_python(flag: list[bool]) -> None:
    x = 0
    while not flag[0]:  # only bytecode: no call that could release the GIL
        x += 1


def blocked_in_c(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.5)


def test_responder_answers_while_threads_spin_and_block(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(4))
        _respond_under_load(tmp_path, torch)
    finally:
        dist.destroy_process_group()


def _respond_under_load(tmp_path: Path, torch: Any) -> None:
    stop = threading.Event()
    flag = [False]
    spinner = threading.Thread(target=spin_in_python, args=(flag,), name="spinner")
    sleeper = threading.Thread(target=blocked_in_c, args=(stop,), name="sleeper")
    spinner.start()
    sleeper.start()
    r = hangdump.start(tmp_path, 3, torch, step=lambda: 7)
    try:
        time.sleep(0.3)
        req: dict[str, Any] = {"profile_next": 0, "hang_dump": {"id": "abc"}}
        rundir.control_path(tmp_path).write_text(json.dumps(req))
        t0 = time.monotonic()
        path = hangdump.stacks_path(tmp_path, 3)
        while not path.exists() and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        flag[0] = True
        r.stopped.set()
        spinner.join()
        sleeper.join()
    assert path.exists(), "no answer while a thread spun in pure Python"
    assert elapsed < 3.0
    st = read_stacks(path)
    assert st.rank == 3 and st.step == 7
    doc = json.loads(path.read_text())
    assert doc["request"] == "abc"
    assert doc["flight_recorder"]["error"] is None
    assert doc["groups"] == {"0": {"desc": "default_pg", "ranks": [0]}}
    fr = read_dump(hangdump.fr_path(tmp_path, 3), rank=3)
    assert [(e.op, e.seq, e.done) for e in fr.entries][-1] == ("all_reduce", 1, True)
    names = {t.name: t for t in st.threads}
    assert names["spinner"].frames[0].name == "spin_in_python"
    assert names["sleeper"].frames[0].name == "blocked_in_c"
    assert "gpudiag-hang" not in names  # its own thread is left out
    assert st.main is not None and st.main.name == "MainThread"


def test_lost_window_rule() -> None:
    died = {0: [{"type": "exit"}], 1: []}
    assert outcome.lost_window("5:10", {"0": 7, "1": 7}, died, 1) is not None
    assert outcome.lost_window("5:10", {"0": 3, "1": 3}, died, 1) is None  # not reached
    assert outcome.lost_window("5:10", {"0": 12}, died, 1) is None  # past it
    ok = {0: [{"type": "exit"}]}
    assert outcome.lost_window("5:10", {"0": 7}, ok, 0) is None
