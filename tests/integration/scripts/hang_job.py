"""A 2-rank gloo training loop with an injected cause of a stuck or failed collective.

--cause loader    rank R blocks inside its dataset's load_batch at step S (blocked in C: sleep)
--cause spin      rank R spins in pure Python (spin_forever) at step S, holding the GIL
--cause skip      rank R skips the broadcast of step S (a data-dependent branch)
--cause mismatch  rank R all-reduces a tensor of another size at step S
--cause nested    3 ranks, group "tp" = [0, 1]: rank R (1) blocks in its loader at step S,
                  rank 0 then waits in tp's all_reduce, rank 2 in the default group's
--cause none      no fault
Every step: next batch → forward/backward → all_reduce of the gradient → broadcast of a
flag → optimizer step (which ends gpudiag's step).
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist


def load_batch(i: int, stuck: bool) -> torch.Tensor:
    if stuck:
        time.sleep(3600)  # a dead input pipeline: blocked in C, GIL released
    return torch.full((32, 64), float(i % 7))


def spin_forever() -> None:
    x = 0
    while True:  # pure Python: holds the GIL between switch intervals
        x += 1


class Batches(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, n: int, stuck_at: int | None) -> None:
        self.n, self.stuck_at = n, stuck_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return load_batch(i, i == self.stuck_at)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cause", default="none")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--at-step", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gloo-timeout", type=float, default=120.0)
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.gloo_timeout))
    rank = dist.get_rank()
    me = rank == a.rank
    stuck_at = a.at_step if me and a.cause in ("loader", "nested") else None
    tp = dist.new_group([0, 1], group_desc="tp") if a.cause == "nested" else None
    loader = torch.utils.data.DataLoader(Batches(a.steps, stuck_at), batch_size=None, num_workers=0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, x in enumerate(loader):
        if me and a.cause == "spin" and step == a.at_step:
            spin_forever()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        g = model.weight.grad
        assert g is not None
        if me and a.cause == "mismatch" and step == a.at_step:
            g = torch.zeros(17)
        if tp is not None and rank in (0, 1):
            dist.all_reduce(g, group=tp)
        dist.all_reduce(g)
        flag = torch.zeros(1)
        if not (me and a.cause == "skip" and step == a.at_step):
            dist.broadcast(flag, 0)
        opt.step()
        time.sleep(0.02)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
