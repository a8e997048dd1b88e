"""A 2-rank DDP job (gloo on CPU) whose steps change part-way through, for the live alerts.

Each step fetches a batch, does ``--work-ms`` of work (``--compute``: real matrix products,
else a sleep, so that a shared 2-core host does not decide the step time), runs forward
and backward through a small DDP model (the gradient all-reduce waits for the slowest rank)
and steps the optimizer. From step ``--onset`` on:

* ``--straggle-rank R --straggle-s S``: rank R sleeps S seconds more before its forward
  (a persistent straggler: the others wait for it in DDP's all-reduce);
* ``--slow-data-s S``: every rank's dataset takes S seconds more per batch (the input
  pipeline slows: the time is spent in ``DataLoader.__next__``);
* ``--straggle-compute``: the straggler's extra time is matrix products, not a sleep (a
  compute straggler);
* ``--own-batches``: the batches come from the job's own generator function, not a
  DataLoader (a hand-written loader), which from step ``--onset`` takes ``--slow-batch-s``
  seconds more per batch.

Step numbers are gpudiag's (the loop index). No gpudiag import: an ordinary user script.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset[Any]):
    """Random batches; from batch ``onset`` on each takes ``slow_s`` more to read."""

    def __init__(self, n: int, dim: int, onset: int, slow_s: float) -> None:
        self.n, self.dim, self.onset, self.slow_s = n, dim, onset, slow_s
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, dim, generator=g)
        self.y = torch.randn(n, 64, 1, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow_s and i >= self.onset:
            time.sleep(self.slow_s)
        return self.x[i], self.y[i]


def own_batches(data: Batches, onset: int, slow_s: float) -> Any:
    """The job's own batch function (no DataLoader): from batch ``onset`` on, slower."""
    for i in range(len(data)):
        if slow_s and i >= onset:
            time.sleep(slow_s)
        yield data.x[i], data.y[i]


def work(ms: float, compute: bool, a: torch.Tensor) -> None:
    """About ``ms`` of work: matrix products (``compute``) or a sleep."""
    if not compute:
        time.sleep(ms / 1000.0)
        return
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        a @ a


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--work-ms", type=float, default=100.0)
    p.add_argument("--compute", action="store_true", help="busy work instead of a sleep")
    p.add_argument("--onset", type=int, default=15)
    p.add_argument("--straggle-rank", type=int, default=-1)
    p.add_argument("--straggle-s", type=float, default=0.0)
    p.add_argument("--slow-data-s", type=float, default=0.0)
    p.add_argument("--straggle-compute", action="store_true", help="extra matmul, not a sleep")
    p.add_argument("--own-batches", action="store_true", help="a generator, not a DataLoader")
    p.add_argument("--slow-batch-s", type=float, default=0.0)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = Batches(a.steps, 32, a.onset, a.slow_data_s)
    loader = (
        own_batches(data, a.onset, a.slow_batch_s)
        if a.own_batches
        else DataLoader(data, batch_size=None)
    )
    mat = torch.randn(128, 128)
    for step, (x, y) in enumerate(loader):
        work(a.work_ms, a.compute, mat)
        if rank == a.straggle_rank and step >= a.onset:
            work(a.straggle_s * 1000.0, a.straggle_compute, mat)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    del model, opt  # free what gloo's threads reference before the interpreter exits
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
