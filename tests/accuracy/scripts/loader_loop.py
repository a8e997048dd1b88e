"""An ordinary user's DDP loop (gloo, CPU), annotated and profiled the way people do it.

``for batch in loader:`` with ``record_function(f"step {i}")`` around the step's work —
the range opens after the batch has arrived — and ``torch.profiler.profile()`` around
the whole loop (no schedule, so no ``ProfilerStep#N`` markers). The Dataset sleeps per
sample (slow storage) and ``--slow-first`` sleeps inside step 0 (a warm-up, like
autotuning). The script measures what it injected with ``time.perf_counter`` and writes
it to ``truth-<rank>.json``: for step i, its period (from its range's start to the next
one's) and the time spent fetching the batch of step i+1 inside that period. No gpudiag
import: the truth is the job's own.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, delay_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--sample-delay", type=float, default=0.0002)
    p.add_argument("--slow-first", type=float, default=0.0)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(
            nn.Linear(64, a.hidden),
            nn.ReLU(),
            nn.Linear(a.hidden, a.hidden),
            nn.ReLU(),
            nn.Linear(a.hidden, 1),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(
        SlowDataset(a.batch * (a.steps + 1), a.sample_delay), batch_size=a.batch, num_workers=0
    )
    starts, ends, fetch = [], [], []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        it = iter(loader)
        for i in range(a.steps):
            t0 = time.perf_counter()
            x, y = next(it)
            fetch.append(time.perf_counter() - t0)
            starts.append(time.perf_counter())
            with record_function(f"step {i}"):
                if i == 0 and a.slow_first:
                    time.sleep(a.slow_first)
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            ends.append(time.perf_counter())
    out = Path(a.out)
    prof.export_chrome_trace(str(out / f"rank-{rank}.pt.trace.json.gz"))
    truth = [
        {
            "step": i,
            "period_s": (starts[i + 1] if i + 1 < a.steps else ends[i]) - starts[i],
            "fetch_s": fetch[i + 1] if i + 1 < a.steps else 0.0,
        }
        for i in range(a.steps)
    ]
    (out / f"truth-{rank}.json").write_text(json.dumps(truth))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
