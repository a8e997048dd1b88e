"""Which per-step signal of a CPU DDP job holds on a busy host: thread, process, scheduler.

Runs the demo's training loop (its model, data and ``--extra-work``; no gpudiag) as a
2-rank CPU DDP job under ``torchrun`` several times, quiet and beside CPU hogs (two
spinning processes), and records per step and rank: the wall time, the training thread's
CPU time (``time.thread_time_ns``), the process's (``time.process_time_ns``), the thread's
scheduler figures from ``/proc/thread-self/schedstat`` (time on a CPU, time runnable but
waiting for one) and its involuntary context switches (``/proc/thread-self/status``), and
``torch.get_num_threads()``. Then prints, per signal, the between-run spread of the
unchanged runs' medians (per step the slowest rank) and where each ``--extra-work`` run
lies against their mean (docs/gate.md, "What the signals do on a busy host").

    python benchmarks/bench_step_signals.py quiet hog quiet hog extra25 hog-extra25
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
JOB = ["--pin", "--steps", "40", "--batch", "1024", "--hidden", "256", "--layers", "3"]
JOB += ["--dim", "128"]
SIGNALS = ("wall", "thread", "process", "on_cpu", "runnable_wait", "wall_minus_wait")


def _schedstat() -> tuple[int, int, int]:
    """(ns on a CPU, ns runnable and waiting, involuntary switches) of the calling thread."""
    with open("/proc/thread-self/schedstat") as f:
        run, wait = (int(x) for x in f.read().split()[:2])
    with open("/proc/thread-self/status") as f:
        nv = next(int(ln.split()[1]) for ln in f if ln.startswith("nonvoluntary_ctxt"))
    return run, wait, nv


def rank_main(out: str) -> None:
    """Inside each rank: the demo's loop, with every signal read at each step boundary."""
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist

    from gpudiag.demo import train as T

    a = T.parse_args()
    _, _, rank, device = T.setup(a)
    model = T.build_model(a, device, True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ds = T.SyntheticDataset(a.batch * (a.steps + 2), a.dim, 0.0)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=a.batch, collate_fn=T.collate))
    recs, own = [], 0
    for _ in range(a.steps):
        w0, c0, p0, s0 = (
            time.perf_counter_ns(),
            time.thread_time_ns(),
            time.process_time_ns(),
            _schedstat(),
        )
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        spent = T.extra_work(a, rank, own or time.thread_time_ns() - c0)
        opt.step()
        w1, c1, p1, s1 = (
            time.perf_counter_ns(),
            time.thread_time_ns(),
            time.process_time_ns(),
            _schedstat(),
        )
        own = c1 - c0 - spent
        recs.append([w1 - w0, c1 - c0, p1 - p0, s1[0] - s0[0], s1[1] - s0[1], s1[2] - s0[2]])
    info = {"threads": torch.get_num_threads(), "tid": threading.get_native_id()}
    Path(out.format(rank=rank)).write_text(json.dumps({"info": info, "steps": recs}))
    del model, opt
    dist.destroy_process_group()


def run(label: str, tmp: Path) -> dict[str, float]:
    """One job (``hog`` in the label: beside two CPU hogs; ``extraNN``: +NN% own work)."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 if "hog" in label else 0)
    ]
    extra = ["--extra-work", str(int(label.split("extra")[1]) / 100)] if "extra" in label else []
    out = str(tmp / f"{label}-{{rank}}.json")
    load = os.getloadavg()[0]
    try:
        cmd = ["torchrun", "--standalone", "--nproc-per-node", "2", __file__, "--rank-out", out]
        subprocess.run([*cmd, *JOB, *extra], check=True, capture_output=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    ranks = [json.loads(Path(out.format(rank=r)).read_text()) for r in (0, 1)]
    n = min(len(r["steps"]) for r in ranks)
    a = np.array([r["steps"][3:n] for r in ranks], float)  # [rank, step, field]; 3 warm-up
    per = {
        "wall": a[:, :, 0],
        "thread": a[:, :, 1],
        "process": a[:, :, 2],
        "on_cpu": a[:, :, 3],
        "runnable_wait": a[:, :, 4],
        "wall_minus_wait": a[:, :, 0] - a[:, :, 4],
    }
    row = {k: float(np.median(v.max(axis=0))) / 1e6 for k, v in per.items()}
    row["switches"] = float(np.median(a[:, :, 5].sum(axis=0)))
    x, y = a[:, :, 5].ravel(), a[:, :, 1].ravel() / 1e6
    row["ms_per_switch"] = float(np.polyfit(x, y, 1)[0]) if x.std() > 0 else 0.0
    row["threads"] = ranks[0]["info"]["threads"]
    row["load"] = load
    return row


def main() -> None:
    """Run the labelled jobs and print the table (the module's doc)."""
    if "--rank-out" in sys.argv:
        i = sys.argv.index("--rank-out")
        out = sys.argv[i + 1]
        del sys.argv[i : i + 2]
        rank_main(out)
        return
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("labels", nargs="+", help="quiet, hog, extra25, hog-extra25, ...")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {f"{lab}#{i}": run(lab, Path(tmp)) for i, lab in enumerate(a.labels)}
    for name, r in rows.items():
        print(name, " ".join(f"{k}={v:.2f}" for k, v in r.items()))
    same = [r for n, r in rows.items() if "extra" not in n]
    slow = [r for n, r in rows.items() if "extra" in n]
    if len(same) < 2:
        return
    print(f"{len(same)} unchanged runs: between-run spread of the run medians (s/m)")
    for k in SIGNALS:
        v = np.array([r[k] for r in same])
        where = ", ".join(f"{r[k] / v.mean() - 1:+.0%}" for r in slow)
        print(
            f"  {k:16s} mean {v.mean():7.2f} ms  ±{v.std(ddof=1) / v.mean():5.1%}  extra: {where}"
        )


if __name__ == "__main__":
    main()
