"""What torch's flight recorder costs per collective and per step of gpudiag's demo.

torch 2.13 keeps the recorder on by default (2000 entries; ``TORCH_FR_BUFFER_SIZE=0``
turns it off); ``gpudiag run`` sets ``TORCH_FR_BUFFER_SIZE=2000`` only when the job set
neither it nor ``TORCH_NCCL_TRACE_BUFFER_SIZE``. Its cost is CPU work on the calling
thread (a Python stack capture and a locked ring-buffer write per collective), far below
the wall-time noise of a shared 2-CPU host, so it is measured as the calling thread's CPU
time (``time.thread_time_ns``) of a 1-rank gloo all_reduce of 4 floats, recorder off
(``0``) and on (``2000``) in alternating processes, each the 10th percentile of 40
batches of 1000 calls. The cost per step is that difference × the collectives one step of
gpudiag's demo issues (counted from the recorder itself: a 1-rank DDP run of the demo's
model, 10 steps).

Run: python benchmarks/bench_flightrec.py [--rounds 3]   (~1 min)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys

PER_CALL = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
t = torch.ones(4)
for _ in range(500):
    dist.all_reduce(t)
res = []
for _ in range(40):
    t0 = time.thread_time_ns()
    for _ in range(1000):
        dist.all_reduce(t)
    res.append((time.thread_time_ns() - t0) / 1000 / 1e3)
res.sort()
print(res[4])
os._exit(0)
"""

PER_STEP = """
import os, pickle, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
layers, dim, hidden = [], 256, 512  # the demo's defaults: --dim 256 --hidden 512 --layers 3
for i in range(3):
    layers += [torch.nn.Linear(dim if i == 0 else hidden, hidden), torch.nn.ReLU()]
model = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, dim)
before = len(pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))["entries"])
for _ in range(10):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
after = len(pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))["entries"])
print((after - before) / 10)
os._exit(0)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(code: str, size: str) -> float:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size}
    out = subprocess.run(
        [sys.executable, "-c", code % _port()],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    off: list[float] = []
    on: list[float] = []
    for _ in range(a.rounds):
        off.append(_run(PER_CALL, "0"))
        on.append(_run(PER_CALL, "2000"))
    per_step = _run(PER_STEP, "2000")
    d = statistics.median(on) - statistics.median(off)
    print(
        f"all_reduce, calling thread CPU: off {[round(x, 2) for x in off]} us, "
        f"on {[round(x, 2) for x in on]} us: +{d:.2f} us per collective"
    )
    print(
        f"demo (DDP, defaults): {per_step:g} collectives per step → +{d * per_step:.2f} us "
        "of CPU per step"
    )


if __name__ == "__main__":
    main()
