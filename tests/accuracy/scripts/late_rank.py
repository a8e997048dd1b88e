"""A DDP step (gloo, CPU) in which one rank enters each step late, profiled for one step.

The late rank sleeps ``--late-s`` before its forward (host-side work: a slow logger, a
checkpoint, Python). DDP buckets of ``--bucket-mb`` MB give several all-reduces per step.
``torch.profiler`` records a single step (``schedule(wait, warmup, active=1)``): too short
for any rule that compares steps, so only the collectives can name the late rank.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--late-rank", type=int, default=2)
    p.add_argument("--late-s", type=float, default=0.3)
    p.add_argument("--bucket-mb", type=float, default=0.25)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
        on_trace_ready=tensorboard_trace_handler(a.out, worker_name=f"rank{rank}", use_gzip=True),
    ) as prof:
        for _ in range(4):
            if rank == a.late_rank:
                time.sleep(a.late_s)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
