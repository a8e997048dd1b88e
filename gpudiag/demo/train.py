"""Tiny DDP training job (gloo on CPU, NCCL on GPU) with injectable bottlenecks.

Used by the end-to-end tests and the README demo. It has no gpudiag imports:
it is an ordinary user script. It can profile itself as users do: ``--profile-dir``
(a ``schedule`` and ``tensorboard_trace_handler``), or ``--profile-from N`` (a plain
``with torch.profiler.profile()`` from step N to the end, exported with
``--profile-export``). ``--print-loss`` prints rank 0's view of each step's mean loss
(an all-reduce from Python), so runs can be compared by their output.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random regression samples; ``delay_s`` per item simulates slow storage."""

    def __init__(self, n: int, dim: int, delay_s: float) -> None:
        self.n, self.dim, self.delay_s = n, dim, delay_s
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]

    def __getitems__(self, idx: list[int]) -> Any:
        if self.delay_s:  # slow storage: one read per sample
            return [self[i] for i in idx]
        return self.x[idx], self.y[idx]  # fast path: one gather per batch, already collated


def collate(batch: Any) -> Any:
    """Batches gathered by ``__getitems__`` are already stacked; per-sample lists are not."""
    return batch if isinstance(batch, tuple) else default_collate(batch)


def square_sum(n: int) -> float:
    """Work for a spawned pool (``--mp-spawn``): a child process that imports torch."""
    return float((torch.arange(n, dtype=torch.float64) ** 2).sum())


_EXTRA = torch.ones(64, 64)


def extra_work(a: argparse.Namespace, rank: int, own_ns: int) -> int:
    """``--extra-work F``: spend F × ``own_ns`` more CPU time of this thread on small matrix
    products (a slower code path); ``own_ns`` is the last step's own CPU time (else this
    one's so far), so the injected slowdown is that share of the job's work, whatever else
    the host runs. Returns the CPU time spent (0 on ranks other than ``--extra-work-rank``).
    """
    if not a.extra_work or a.extra_work_rank not in (-1, rank):
        return 0
    start = time.thread_time_ns()
    end = start + a.extra_work * own_ns
    while time.thread_time_ns() < end:
        torch.mm(_EXTRA, _EXTRA)
    return time.thread_time_ns() - start


def parse_args() -> argparse.Namespace:
    """The job's options: its size, the bottlenecks to inject, how it profiles itself."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--slow-data", type=float, default=0.0, help="seconds per sample")
    p.add_argument("--slow-data-rank", type=int, default=-1, help="only this rank (-1: all)")
    p.add_argument("--sleep-rank", type=int, default=-1, help="rank that sleeps in forward")
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--sleep-every", type=int, default=1, help="sleep every Nth step")
    p.add_argument(
        "--extra-work",
        type=float,
        default=0.0,
        help="add this fraction of each step's own CPU work (0.3: +30%%), as real compute",
    )
    p.add_argument("--extra-work-rank", type=int, default=-1, help="only this rank (-1: all)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--worker-start", default="", help="DataLoader workers: fork or spawn")
    p.add_argument("--mp-spawn", type=int, default=0, help="run a spawn Pool of N first")
    p.add_argument("--profile-dir", default="", help="record torch.profiler traces here")
    p.add_argument("--profile-wait", type=int, default=2)
    p.add_argument("--profile-active", type=int, default=5)
    p.add_argument(
        "--profile-from", type=int, default=-1, help="plain torch.profiler.profile() from step N"
    )
    p.add_argument(
        "--profile-export", default="", help="with --profile-from: export_chrome_trace here"
    )
    p.add_argument("--print-loss", action="store_true", help="print each step's mean loss")
    p.add_argument(
        "--pin", action="store_true", help="pin each rank to its own CPU core (steadier timings)"
    )
    p.add_argument("--exit-code", type=int, default=0, help="exit with this code at the end")
    p.add_argument("--raise-at", type=int, default=-1, help="raise on rank 1 at this step")
    p.add_argument("--time-file", default="", help="rank 0 writes its step times (s) here")
    return p.parse_args()


def setup(a: argparse.Namespace) -> tuple[bool, bool, int, torch.device]:
    """Pin the CPU, join the process group, pick the device: (distributed, cuda, rank, device)."""
    if a.pin and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(os.environ.get("LOCAL_RANK", 0)) % len(cpus)]})
    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    use_cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(rank)
    return distributed, use_cuda, rank, device


def build_model(a: argparse.Namespace, device: torch.device, distributed: bool) -> nn.Module:
    """An MLP of ``--layers`` hidden layers, wrapped in DDP when distributed."""
    layers: list[nn.Module] = [nn.Linear(a.dim, a.hidden), nn.ReLU()]
    for _ in range(a.layers - 1):
        layers += [nn.Linear(a.hidden, a.hidden), nn.ReLU()]
    layers.append(nn.Linear(a.hidden, 1))
    model: nn.Module = nn.Sequential(*layers).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    return model


def scheduled_profiler(a: argparse.Namespace, rank: int, use_cuda: bool) -> Any:
    """``--profile-dir``: a started profiler with a schedule, as users record; else None."""
    if not a.profile_dir:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    prof = profile(
        activities=acts,
        schedule=schedule(wait=a.profile_wait, warmup=1, active=a.profile_active, repeat=1),
        on_trace_ready=tensorboard_trace_handler(
            a.profile_dir, worker_name=f"rank{rank}", use_gzip=True
        ),
    )
    prof.start()
    return prof


def main() -> None:
    """Train ``--steps`` steps with the injected bottlenecks, then leave cleanly."""
    a = parse_args()
    distributed, use_cuda, rank, device = setup(a)
    model = build_model(a, device, distributed)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    if a.mp_spawn:
        with multiprocessing.get_context("spawn").Pool(a.mp_spawn) as pool:
            total = sum(pool.map(square_sum, [1000 * (i + 1) for i in range(a.mp_spawn)]))
        if rank == 0:
            print(f"spawned pool: {total:.1f}", flush=True)

    slow = a.slow_data if a.slow_data_rank in (-1, rank) else 0.0
    ds = SyntheticDataset(a.batch * (a.steps + 2), a.dim, slow)
    loader = DataLoader(
        ds,
        batch_size=a.batch,
        num_workers=a.workers,
        collate_fn=collate,
        multiprocessing_context=(a.worker_start or None) if a.workers else None,
    )
    prof = scheduled_profiler(a, rank, use_cuda)
    own = contextlib.ExitStack()
    plain = None
    it = iter(loader)
    times: list[float] = []
    own_cpu = 0  # the last step's CPU time on this thread, without the extra work
    for step in range(a.steps):
        if step == a.profile_from:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
            plain = own.enter_context(profile(activities=acts))
        t_step = time.perf_counter()
        cpu_step = time.thread_time_ns()
        x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if rank == a.sleep_rank and step % a.sleep_every == a.sleep_every - 1:
            time.sleep(a.sleep_s)
        if step == a.raise_at and rank == 1:
            raise RuntimeError(f"injected failure at step {step}")
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        spent = extra_work(a, rank, own_cpu or time.thread_time_ns() - cpu_step)
        opt.step()
        if prof is not None:
            prof.step()
        if plain is not None:
            plain.step()
        if a.print_loss:
            mean = loss.detach().clone()
            if distributed:
                dist.all_reduce(mean)
                mean /= dist.get_world_size()
            if rank == 0:
                print(f"step {step} loss {mean.item():.6f}", flush=True)
        times.append(time.perf_counter() - t_step)
        own_cpu = time.thread_time_ns() - cpu_step - spent
    if a.time_file and rank == 0:
        with open(a.time_file, "w") as f:
            f.write("\n".join(f"{t:.9f}" for t in times) + "\n")
    if prof is not None:
        prof.stop()
    own.close()
    if plain is not None and a.profile_export:
        plain.export_chrome_trace(a.profile_export.format(rank=rank))
    if distributed:
        # Free what gloo's worker threads still reference (DDP buckets, the last all-reduce)
        # while the interpreter is alive: a worker freeing a tensor during interpreter
        # shutdown aborts the rank (torch 2.13 CPU: "terminate called without an active
        # exception", 1 exit in 4 with --print-loss, 1 in 10 without).
        del model, opt
        gc.collect()
        dist.destroy_process_group()
    if a.exit_code:
        raise SystemExit(a.exit_code)


if __name__ == "__main__":
    main()
