"""Real 4-rank gloo flight-recorder dumps of multi-group jobs whose stuck collective is known.

Run: python tests/data/flightrec/make_multigroup_dumps.py   (needs torch; ~1 min)

Groups (gloo, torch 2.13): tensor groups tp_a = [0, 1] and tp_b = [2, 3], data groups
dp_a = [0, 2] and dp_b = [1, 3]. Every step: 0.1 s of loading, an all_reduce in the
rank's tensor group, 0.3 s of "compute", an all_reduce in its data group. A thread on each rank dumps the
flight recorder (pickle) while the job is stuck, into ``<scenario>/gloo_trace_rank_<R>``;
``<scenario>.dumped_ns.json`` records when (git keeps no modification times).

- mg_skip: rank 1 skips the tensor all_reduce of step 2 (a data-dependent branch). gloo
  pairs collectives by order, so the job runs on until rank 0's last tensor all_reduce
  (#6 of tp_a), which rank 1 never enters: rank 0 waits in it, and rank 2 waits in dp_a's
  last all_reduce (#6), which rank 0 never reaches. Truth: all_reduce #6 of tp_a, rank 1
  never entered it; dp_a's stall is its effect.
- mg_stop: rank 2 blocks in its loader at step 3 (never enters tp_b's all_reduce #4):
  rank 3 waits in it, rank 0 waits in dp_a's #4 (rank 2 never came), rank 1 in dp_b's #4
  (rank 3 is stuck in tp_b). Truth: all_reduce #4 of tp_b, rank 2 never entered it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
STEPS = 6
SCENARIOS = ("mg_skip", "mg_stop")
GROUPS = {"tp_a": [0, 1], "tp_b": [2, 3], "dp_a": [0, 2], "dp_b": [1, 3]}


def worker(scenario: str) -> None:
    import datetime

    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=12))
    r = dist.get_rank()
    out = HERE / scenario
    groups = {n: dist.new_group(ranks, group_desc=n) for n, ranks in GROUPS.items()}
    tp = groups["tp_a"] if r in (0, 1) else groups["tp_b"]
    dp = groups["dp_a"] if r in (0, 2) else groups["dp_b"]

    def dump() -> None:
        time.sleep(6)
        t = time.time_ns()
        (out / f"gloo_trace_rank_{r}").write_bytes(c10d._dump_fr_trace())
        (out / f"dumped_ns_{r}.json").write_text(json.dumps(t))

    dumper = threading.Thread(target=dump, daemon=True)
    dumper.start()
    x = torch.ones(256)
    with contextlib.suppress(RuntimeError):
        for step in range(STEPS):
            time.sleep(0.1)  # the loader
            if scenario == "mg_stop" and r == 2 and step == 3:
                time.sleep(20)  # a dead input pipeline
            if not (scenario == "mg_skip" and r == 1 and step == 2):
                dist.all_reduce(x, group=tp)
            time.sleep(0.3)
            dist.all_reduce(x, group=dp)
    dumper.join()
    if r in (1, 3) or scenario == "mg_stop":
        time.sleep(8)  # stay until every rank dumped


def main() -> None:
    for scenario in SCENARIOS:
        d = HERE / scenario
        d.mkdir(exist_ok=True)
        for f in d.iterdir():
            f.unlink()
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "64", "GPUDIAG_FR_SCENARIO": scenario}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "4",
                __file__,
            ],
            env=env,
            check=False,
            timeout=180,
        )
        stamps = {}
        for f in sorted(d.glob("dumped_ns_*.json")):
            stamps[f.stem.rsplit("_", 1)[1]] = json.loads(f.read_text())
            f.unlink()
        (HERE / f"{scenario}.dumped_ns.json").write_text(json.dumps(stamps) + "\n")


if __name__ == "__main__":
    if os.environ.get("GPUDIAG_FR_SCENARIO") and "LOCAL_RANK" in os.environ:
        worker(os.environ["GPUDIAG_FR_SCENARIO"])
    else:
        main()
