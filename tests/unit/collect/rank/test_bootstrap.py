"""The sitecustomize bootstrap: who is a rank, chaining, and never breaking a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testpaths import ROOT

from gpudiag.collect.rank import bootstrap
from gpudiag.collect.rank.hook import parse_window


def _env(run_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDIAG_")}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(bootstrap.site_dir()), *extra.pop("PATHS", "").split(os.pathsep)]
    ).rstrip(os.pathsep)
    env[bootstrap.ENV_RUN_DIR] = str(run_dir)
    env[bootstrap.ENV_PKG_ROOT] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _py(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_is_rank_process_rules() -> None:
    base = {bootstrap.ENV_RUN_DIR: "/tmp/x"}
    assert bootstrap.is_rank_process(base, ["train.py"])  # plain python: rank 0 of 1
    assert not bootstrap.is_rank_process({}, ["train.py"])  # not under gpudiag run
    assert not bootstrap.is_rank_process(base, ["/usr/bin/torchrun", "train.py"])  # agent
    assert bootstrap.is_rank_process({**base, "LOCAL_RANK": "0"}, ["train.py"])
    other = {**base, bootstrap.ENV_RANK_PID: str(os.getpid() + 1)}
    assert not bootstrap.is_rank_process(other, ["train.py"])  # a rank's subprocess
    assert not bootstrap.is_rank_process(base, ["python", "--multiprocessing-fork"])
    # an image a rank exec'd: the rank's own PID, a rank only with the state it handed on
    me = {**base, bootstrap.ENV_RANK_PID: str(os.getpid())}
    assert not bootstrap.is_rank_process(me, ["train.py"])
    state = json.dumps({"pid": os.getpid(), "step": 4})
    assert bootstrap.is_rank_process({**me, bootstrap.ENV_EXEC_STATE: state}, ["train.py"])
    stale = json.dumps({"pid": os.getpid() + 1, "step": 4})
    assert not bootstrap.is_rank_process({**me, bootstrap.ENV_EXEC_STATE: stale}, ["train.py"])


def test_parse_window() -> None:
    assert parse_window("5:10") == (5, 10)
    assert parse_window("off") is None
    for bad in ("0:3", "5:5", "7", "a:b"):
        with pytest.raises(ValueError):  # noqa: PT011
            parse_window(bad)


def test_script_without_torch_is_untouched(tmp_path: Path) -> None:
    r = _py("import sys; print('ok', 'torch' in sys.modules)", _env(tmp_path / "run"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok False\n"
    assert r.stderr == ""
    assert not (tmp_path / "run").exists()


def test_torch_without_optimizer_writes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = "import torch; print(float(torch.ones(2).sum()))"
    r = _py(code, _env(tmp_path / "run"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "2.0\n"
    assert not (tmp_path / "run").exists()


def test_chains_to_existing_sitecustomize(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    r = _py(
        "import builtins; print(getattr(builtins, 'THEIRS_RAN', False))",
        _env(tmp_path / "run", PATHS=str(theirs)),
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "True\n"


def test_broken_bootstrap_never_breaks_the_job(tmp_path: Path) -> None:
    # GIVEN a gpudiag that fails to import inside the job
    fake = tmp_path / "shadow" / "gpudiag"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    env = _env(tmp_path / "run", PATHS=str(fake.parent))
    r = _py("print('job ran')", env, tmp_path)
    # THEN the job still runs, and says once why it is not instrumented
    assert r.returncode == 0
    assert r.stdout == "job ran\n"
    assert "not instrumented" in r.stderr
    assert "broken install" in r.stderr


def test_dataloader_workers_and_manual_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from gpudiag.collect.rank import hook
ds = TensorDataset(torch.randn(32, 4))
loader = DataLoader(ds, batch_size=4, num_workers=2)
model = torch.nn.Linear(4, 1)
opt1 = torch.optim.SGD(model.parameters(), lr=0.1)
opt2 = torch.optim.SGD(model.parameters(), lr=0.1)
for (x,) in loader:
    model(x).sum().backward()
    opt1.step(); opt2.step()   # two optimizers: one step per iteration
print("done")
"""
    run = tmp_path / "run"
    r = _py(code, _env(run, GPUDIAG_PROFILE_STEPS="2:4"), tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (run / "ranks" / "rank-0.steps.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(8))
    assert all(s["data_fetches"] == 1 for s in steps)
    assert [s["profiled"] for s in steps] == [False, False, True, True] + [False] * 4
    assert [x["pid"] for x in lines if x["type"] == "header"] != []
    assert len([x for x in lines if x["type"] == "header"]) == 1  # workers wrote nothing
    assert (run / "ranks" / "rank-0.pt.trace.json.gz").exists()
    assert sorted(p.name for p in (run / "ranks").iterdir()) == [
        "rank-0.pt.trace.json.gz",
        "rank-0.steps.jsonl",
    ]


def test_partial_window_is_saved_at_exit(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = """
import torch
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(4):
    m(torch.ones(1, 2)).sum().backward(); o.step()
"""
    run = tmp_path / "run"
    r = _py(code, _env(run, GPUDIAG_PROFILE_STEPS="2:10"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert (run / "ranks" / "rank-0.pt.trace.json.gz").exists()
    recs = [json.loads(x) for x in (run / "ranks" / "rank-0.steps.jsonl").read_text().splitlines()]
    assert [x["type"] for x in recs][-3:] == ["profile", "window", "exit"]
    assert recs[-2]["status"] == "cut_by_exit"
    assert recs[-2]["kept"] == [recs[-3]["start_step"], recs[-3]["end_step"]]
