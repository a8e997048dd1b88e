"""Issue 15: false alarms, detection and the noise floor of ``gpudiag gate`` on this host.

Runs the demo under ``gpudiag run`` (2 CPU ranks, gloo): ``--base`` baseline runs, then
``--reruns`` unchanged runs with a CPU hog beside them (``python3 -c 'while True: pass'``),
then one candidate with ``--slow`` (e.g. 0.3 = +30%) more time slept per step; each rerun and
the candidate are gated against the baseline runs. Prints each verdict (with the default
contention limits, and the timing verdict with them switched off), the baseline's
between-run spread and the minimum detectable effect for 2, 3 and 5 baseline runs.

    python benchmarks/bench_gate_noise.py --out /tmp/gate_noise --base 3 --reruns 10

The default job is dominated by a fixed 0.1 s wait on rank 0 (``--sleep-s``); ``--cpu``
uses a CPU-bound job instead (batch 2048), which the host's load stretches far more.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpudiag.analysis.compare.baseline import RunStat, run_stat
from gpudiag.analysis.compare.gate import evaluate
from gpudiag.analysis.compare.stats import t_ppf
from gpudiag.api.load import analyze
from gpudiag.cli.gate import run_conditions
from gpudiag.config import GateConfig, Thresholds

TH = Thresholds()
CFG = GateConfig(max_idle_ratio=1.0, stragglers="off")
NO_CONTENTION = GateConfig(
    max_idle_ratio=1.0, stragglers="off", max_other_cpu_ratio=1.0, max_steal_ratio=1.0
)


def job(args: argparse.Namespace, sleep_s: float) -> list[str]:
    if args.cpu:  # sleep_s: only the slowed candidate sleeps
        sleep = ["--sleep-rank", "0", "--sleep-s", f"{sleep_s:g}"] if sleep_s else []
        return ["--steps", "24", "--batch", "2048", "--pin", *sleep]
    return [
        "--steps",
        "24",
        "--batch",
        "16",
        "--hidden",
        "64",
        "--layers",
        "2",
        "--pin",
        "--sleep-rank",
        "0",
        "--sleep-s",
        f"{sleep_s:g}",
    ]


def one(out: Path, extra: list[str]) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "gpudiag",
        "run",
        "--out",
        str(out),
        "-q",
        "--no-analyze",
        "--profile-steps",
        "2:4",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "gpudiag.demo.train",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return out


def stat(path: Path) -> tuple[object, dict | None, RunStat]:
    d = analyze(path, thresholds=TH)
    c = run_conditions(path)
    return d, c, run_stat(d, path.name, c, None, TH)


def gate(path: Path, base: list[RunStat]) -> str:
    d, c, st = stat(path)
    r = evaluate(d, CFG, base, path.name, "base", TH, c)  # type: ignore[arg-type]
    r2 = evaluate(d, NO_CONTENTION, base, path.name, "base", TH, c)  # type: ignore[arg-type]
    reg = next(x for x in r.checks if x.name == "step_time_regression")
    reg2 = next(x for x in r2.checks if x.name == "step_time_regression")
    other = (c or {}).get("other_cpu_ratio_mean")
    other_s = "?" if other is None else f"{other:.0%}"
    print(
        f"{path.name}: median {(st.step_time_ns_median or 0) / 1e6:.1f} ms, effect "
        f"{reg.effect_ratio:+.1%}, MDE {reg.mde_ratio or 0:.1%}, other CPU {other_s} -> "
        f"{r.status}; timing without the contention rule: {reg2.status}"
    )
    return str(r.status)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base", type=int, default=3)
    ap.add_argument("--reruns", type=int, default=10)
    ap.add_argument("--slow", type=float, default=0.3)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base_paths = [
        one(args.out / f"base{i}", job(args, 0 if args.cpu else 0.1)) for i in range(args.base)
    ]
    base = [stat(p)[2] for p in base_paths]
    medians = [(b.step_time_ns_median or 0) / 1e6 for b in base]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        verdicts = [
            gate(one(args.out / f"same{i}", job(args, 0 if args.cpu else 0.1)), base)
            for i in range(args.reruns)
        ]
    finally:
        hog.kill()
    n_fail, n_pass = verdicts.count("failed"), verdicts.count("passed")
    print(
        f"unchanged reruns with a CPU hog: {n_fail}/{len(verdicts)} failed, {n_pass} passed, "
        f"{verdicts.count('inconclusive')} inconclusive"
    )
    # +slow of the step: the wait job's 0.1 s wait grows; the CPU job sleeps slow × its median
    extra = sum(medians) / len(medians) / 1e3 * args.slow if args.cpu else 0.1 * (1 + args.slow)
    gate(one(args.out / "slow", job(args, extra)), base)
    cv = float(np.std(medians, ddof=1) / np.mean(medians))
    print(f"baseline medians {[round(m, 1) for m in medians]} ms, spread ±{cv:.1%}")
    for n in (2, 3, 5):
        print(f"MDE with {n} baseline runs: {t_ppf(0.95, n - 1) * cv * math.sqrt(1 + 1 / n):.1%}")
    print("one baseline run: no spread; timing fails only above +50%")


if __name__ == "__main__":
    main()
