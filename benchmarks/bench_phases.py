"""CPU cost of the step phases' hooks (issue 30 point 7: ≤ 1%), in a way host load cannot flip.

    python benchmarks/bench_phases.py [--reps 60] [--steps 50] [--width 8] [--layers 20]

Two measures, both in **CPU time of the training thread** (``time.thread_time_ns``), which
other processes on the host do not add to (they take the CPU away; they do not make this
thread's work cost more CPU, barring cache effects), unlike wall time:

1. **Inside the hooks.** Each piece of per-step work the phase marks add, timed alone over
   many calls: the global forward pre-hook (registered again, dispatched at the step's
   first module call, marking and removing itself — timed as a module call with it minus
   the same call without), the optimizer pre-step mark, the backward mark (one clock read)
   and the phases' arithmetic at the step's end. Their sum is the marks' CPU per step; over
   the plain step's CPU it is the overhead.
2. **Paired interleaved runs.** ``--reps`` reps of ``--steps`` training steps of a small
   MLP, each rep a plain run, a run with the marks and a second plain run (the control), in
   the orders of a Latin square (each run first, second and third equally often); per rep
   the marked run's CPU per step over the plain one's, and the control's: its spread is the
   noise floor the marks' figure must be read against (on a shared 2-core host it is wider
   than 1%, which is why measure 1 is the figure to quote).

A small model (20 layers of 8×8 by default, batch 4, one thread) is the worst case: its step
is mostly Python overhead, so a fixed per-step cost weighs most there. The figure printed
last is the one to quote, with the host's load average (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _per_call_ns(fn: Any, n: int) -> float:
    """Thread CPU time per call of ``fn`` over ``n`` calls (the fastest of 5 runs)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / n)
    return best


def inside_the_hooks(n: int = 20000) -> dict[str, float]:
    """CPU ns per step of each piece of the marks' work (measure 1)."""
    import torch

    from gpudiag.collect.rank import patches
    from gpudiag.collect.rank.hook import RankHook

    x = torch.randn(4, 8)
    ident = torch.nn.Identity()
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    with tempfile.TemporaryDirectory() as d:
        h = RankHook(Path(d), rank=0, local_rank=0, world_size=1, window=None)
        h.torch = torch
        patches._install_forward_mark(torch, h)
        arm = h.arm_forward
        assert arm is not None
        ident(x)  # fire the armed hook away

        def marked_call() -> None:
            h.forward_at = None
            arm()
            ident(x)  # dispatched with the global hook, which marks and removes itself

        plain_call = _per_call_ns(lambda: ident(x), n)
        forward = _per_call_ns(marked_call, n) - plain_call

        import torch.optim.optimizer as topt

        def opt_step() -> None:
            h.optimizer_at = None
            opt.step()

        plain_step = _per_call_ns(opt_step, n // 4)
        pre = topt.register_optimizer_step_pre_hook(h.on_optimizer_pre)
        optimizer = _per_call_ns(opt_step, n // 4) - plain_step  # dispatch and mark
        pre.remove()
        backward = _per_call_ns(time.time_ns, n)  # the mark: one clock read (and a test)
        h.forward_at = h.backward_at = h.optimizer_at = 10
        phases = _per_call_ns(lambda: h._phases(0, 100), n)
    return {
        "forward pre-hook (arm, dispatch, mark, remove)": forward,
        "optimizer pre-step hook (dispatch, mark)": optimizer,
        "backward mark (clock read)": backward,
        "phases at the step's end": phases,
    }


def paired_runs(
    reps: int, steps: int, width: int, layers: int
) -> tuple[list[float], list[float], float]:
    """(marked ÷ plain, plain ÷ plain CPU per step for each rep, the plain step's CPU ns)."""
    import torch
    import torch.optim.optimizer as topt

    from gpudiag.collect.rank import patches
    from gpudiag.collect.rank.hook import RankHook

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, width)
    ratios: list[float] = []
    control: list[float] = []
    plain_ns: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        h = RankHook(Path(d), rank=0, local_rank=0, world_size=1, window=None)
        h.torch = torch
        patches._install_forward_mark(torch, h)
        arm = h.arm_forward
        assert arm is not None
        model(x)  # fire the armed hook away before timing the plain steps

        def run(marks: bool) -> float:
            # the optimizer mark is registered for the marked runs only
            pre = topt.register_optimizer_step_pre_hook(h.on_optimizer_pre) if marks else None
            t0 = time.thread_time_ns()
            for _ in range(steps):
                if marks:
                    arm()
                model(x).sum().backward()
                if marks and h.backward_at is None:
                    h.backward_at = time.time_ns()  # the backward wrapper's mark
                opt.step()
                opt.zero_grad(set_to_none=True)
                if marks:
                    h._phases(0, time.time_ns())
                h.forward_at = h.backward_at = h.optimizer_at = None
            dt = (time.thread_time_ns() - t0) / steps
            if pre is not None:
                pre.remove()
            return dt

        run(False)
        run(True)  # warm both paths
        # a Latin square: each run is first, second and third equally often
        orders = [(False, True, None), (True, None, False), (None, False, True)]
        for i in range(reps):
            # the order rotates (plain, marked and a second plain run, the control), so a
            # drift within a rep cancels over four; the control's ratio is the noise floor
            got: dict[object, float] = {}
            for which in orders[i % 3]:
                got[which] = run(bool(which))
            plain_ns.append(got[False])
            ratios.append(got[True] / got[False])
            control.append(got[None] / got[False])
    return ratios, control, statistics.median(plain_ns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=60, help="a multiple of 3")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--layers", type=int, default=20)
    a = ap.parse_args()
    load = os.getloadavg()
    parts = inside_the_hooks()
    ratios, control, plain = paired_runs(a.reps, a.steps, a.width, a.layers)
    total = sum(parts.values())
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    shape = f"{a.layers} layers of {a.width}×{a.width}, 1 thread"
    print(f"plain step ({shape}): {plain / 1e3:.1f} µs CPU")
    print("inside the hooks, CPU per step:")
    for k, v in parts.items():
        print(f"  {k}: {v / 1e3:.2f} µs")
    print(f"  total {total / 1e3:.2f} µs = {total / plain:.2%} of the plain step's CPU")
    for label, r in (("marked ÷ plain", ratios), ("control: plain ÷ plain", control)):
        q = statistics.quantiles(r, n=4)
        print(
            f"interleaved runs ({a.reps} reps of {a.steps} steps), {label} CPU a step: "
            f"median {statistics.median(r) - 1:+.2%} (quartiles {q[0] - 1:+.2%} to "
            f"{q[2] - 1:+.2%})"
        )


if __name__ == "__main__":
    main()
