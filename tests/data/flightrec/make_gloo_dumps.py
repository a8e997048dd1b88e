"""Real gloo flight-recorder dumps written by torch itself (2-rank torchrun on this CPU).

Run: python tests/data/flightrec/make_gloo_dumps.py   (needs torch; ~20 s)

Each scenario runs ``torchrun --standalone --nproc-per-node 2`` on this file with
TORCH_FR_BUFFER_SIZE set; a thread on each rank calls
``torch._C._distributed_c10d._dump_fr_trace`` (pickle) and ``_dump_fr_trace_json``
(JSON) while the job is stuck, and writes ``<scenario>/gloo_trace_rank_<R>`` and
``<scenario>_json/gloo_trace_rank_<R>.json``. ``dumped_ns.json`` records when each rank
dumped (git does not keep the files' modification times).

- gloo_hang: 3 all_reduces and a broadcast, then one all_reduce in a 2-rank subgroup
  "tp"; rank 1 then sleeps (a stuck loader) while rank 0 enters all_reduce #6 of the
  default group. Truth: rank 1 never entered all_reduce #6; rank 0 waits in it.

A size mismatch cannot be caught this way with gloo: torch 2.13's gloo aborts the process
(SIGABRT, "terminate called without an active exception") the moment the sizes meet,
before any thread can dump; the NCCL-shaped size mismatch is in make_dumps.py.
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


def worker(scenario: str) -> None:
    import datetime

    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    r = dist.get_rank()
    out = HERE / scenario
    out_json = HERE / f"{scenario}_json"

    def dump() -> None:
        time.sleep(3)
        t = time.time_ns()
        (out / f"gloo_trace_rank_{r}").write_bytes(c10d._dump_fr_trace())
        (out_json / f"gloo_trace_rank_{r}.json").write_bytes(c10d._dump_fr_trace_json())
        (out / f"dumped_ns_{r}.json").write_text(json.dumps(t))

    dumper = threading.Thread(target=dump, daemon=True)
    dumper.start()
    x = torch.ones(1024)
    tp = dist.new_group([0, 1], group_desc="tp")
    for _ in range(3):
        dist.all_reduce(x)
    dist.broadcast(x, 0)
    dist.all_reduce(x, group=tp)
    dist.all_reduce(x)  # default #5
    if r == 1:
        time.sleep(8)  # stuck in its loader: never reaches all_reduce #6 in time
        dumper.join()
        return
    with contextlib.suppress(RuntimeError):
        dist.all_reduce(x)  # default #6: rank 1 never comes
    dumper.join()


def main() -> None:
    for scenario in ("gloo_hang",):
        for d in (HERE / scenario, HERE / f"{scenario}_json"):
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
                "2",
                __file__,
            ],
            env=env,
            check=False,
            timeout=120,
        )
        stamps = {}
        for f in sorted((HERE / scenario).glob("dumped_ns_*.json")):
            stamps[f.stem.rsplit("_", 1)[1]] = json.loads(f.read_text())
            f.unlink()
        (HERE / f"{scenario}.dumped_ns.json").write_text(json.dumps(stamps) + "\n")


if __name__ == "__main__":
    if os.environ.get("GPUDIAG_FR_SCENARIO") and "LOCAL_RANK" in os.environ:
        worker(os.environ["GPUDIAG_FR_SCENARIO"])
    else:
        main()
