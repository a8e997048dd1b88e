"""The gate's error rates on a busy host: false alarms on unchanged code, detection of +25%.

Two parts (docs/gate.md, "Error rates on a busy host", reports the figures):

* ``record OUT.json``: runs real 2-rank CPU DDP jobs of the demo under ``gpudiag run``,
  each beside a CPU hog (one spinning process), and writes every run reduced as the gate
  reduces it (a baseline file: per-step wall and CPU times, run conditions). Labels
  ``base*`` / ``same*`` are unchanged code, ``slowNN`` adds NN% to the job's own work
  (the demo's ``--extra-work``). Each run costs ~40-70 s on a loaded 2-core host.
* ``replay RUNS.json``: every choice of 3 (``--baseline-runs``) baseline runs among the
  unchanged runs and one other unchanged run as the candidate, each also with
  ``--replicates`` seeded bootstrap replicates (every run's steps resampled with
  replacement); the candidate unchanged (false alarms) and with its own work +25% (per
  step: CPU time x 1.25, wall time + 0.25 x CPU time; detection); and the recorded
  ``slow*`` runs against every baseline. A candidate fails when the gate's timing checks
  fail it (``cpu_time_regression``, or ``step_time_regression`` on a quiet run or one whose
  baseline runs were as contended); the count of those the wall clock decided is printed.

    python benchmarks/bench_gate_signals.py record /tmp/runs.json --runs base1 base2 same1 slow30
    python benchmarks/bench_gate_signals.py record /tmp/pairs.json --concurrent \\
        --runs base_1 same_1 slow30_1 base_2 same_2 slow30_2
    python benchmarks/bench_gate_signals.py replay-paired /tmp/pairs.json
    python benchmarks/bench_gate_signals.py replay benchmarks/data/gate_hog_runs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpudiag.analysis.compare.baseline import (  # noqa: E402
    RunStat,
    baseline_from_json,
    baseline_to_json,
    run_stat,
)
from gpudiag.analysis.compare.timing import cpu_check, regression_check  # noqa: E402
from gpudiag.config import GateConfig  # noqa: E402
from gpudiag.rundir.conditions import RunConditions, contention  # noqa: E402

JOB = [
    "--pin",
    "--steps",
    "40",
    "--batch",
    "1024",
    "--hidden",
    "256",
    "--layers",
    "3",
    "--dim",
    "128",
]
EFFECT = 0.25


def _job(label: str, d: Path) -> list[str]:
    """The ``gpudiag run`` command of one recorded run (``slowNN``: +NN% own work)."""
    slow = re.match(r"slow(\d+)", label)
    extra = ["--extra-work", str(int(slow[1]) / 100)] if slow else []
    gpudiag = [sys.executable, "-m", "gpudiag", "run", "--out", str(d), "-q", "--no-analyze"]
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2"]
    demo = str(ROOT / "gpudiag" / "demo" / "train.py")
    return [*gpudiag, "--profile-steps", "5:10", "--", *torchrun, demo, *JOB, *extra]


def _groups(labels: Sequence[str], concurrent: bool) -> list[list[str]]:
    """The runs started together: one each, or (``concurrent``) a block's runs at once."""
    if not concurrent:
        return [[x] for x in labels]
    out: dict[int, list[str]] = {}
    for x in labels:
        kb = block(x)
        if kb is None:
            raise SystemExit(f"--concurrent needs block labels (base_1, same_1, …), not {x!r}")
        out.setdefault(kb[1], []).append(x)
    return list(out.values())


def record(
    out: Path, labels: Sequence[str], keep: Path | None = None, concurrent: bool = False
) -> None:
    """Run the demo once per label beside a CPU hog; write the runs as a baseline file.

    ``keep``: leave each run directory there (``KEEP/LABEL``), to gate them with the CLI.
    ``concurrent``: a block's runs (``base_k``, ``same_k``, ``slow30_k``…) start at the same
    time, side by side, so that they share the host's state of that minute.
    """
    from gpudiag.api.load import analyze
    from gpudiag.cli.gate import steady_conditions
    from gpudiag.config import Thresholds

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    runs = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = keep or Path(scratch)
            for group in _groups(labels, concurrent):
                procs = []
                for x in group:
                    log = open(Path(tmp) / f"{x}.log", "w")  # noqa: SIM115 (closed below)
                    cmd = _job(x, Path(tmp) / x)
                    procs.append((x, log, subprocess.Popen(cmd, env=env, stdout=log, stderr=log)))
                for label, log, proc in procs:
                    proc.wait()
                    log.close()
                    if proc.returncode != 0:
                        tail = (Path(tmp) / f"{label}.log").read_text()[-2000:]
                        raise SystemExit(f"{label}: gpudiag run exited {proc.returncode}\n{tail}")
                    d = Path(tmp) / label
                    diag = analyze(d)
                    cond = steady_conditions(d, diag, Thresholds(), GateConfig())
                    runs.append(run_stat(diag, label, cond))
                    print(f"{label}: recorded", file=sys.stderr)
    finally:
        hog.kill()
        hog.wait()
    out.write_text(json.dumps(baseline_to_json(runs, GateConfig(), "bench"), indent=1) + "\n")


def _median(v: Sequence[int]) -> float:
    return float(np.median(v))


def _resample(r: RunStat, rng: np.random.Generator) -> RunStat:
    idx = rng.integers(0, len(r.step_time_ns), len(r.step_time_ns))
    wall = [r.step_time_ns[i] for i in idx]
    cpu = [r.cpu_ns[i % len(r.cpu_ns)] for i in idx]
    return dataclasses.replace(r, step_time_ns=wall, step_time_ns_median=_median(wall), cpu_ns=cpu)


def slowed(r: RunStat, effect: float = EFFECT) -> RunStat:
    """The run with its own work ``effect`` larger: CPU × (1 + effect), wall + effect × CPU."""
    n = min(len(r.step_time_ns), len(r.cpu_ns))
    wall = [int(r.step_time_ns[i] + effect * r.cpu_ns[i]) for i in range(n)]
    cpu = [int(c * (1.0 + effect)) for c in r.cpu_ns[:n]]
    return dataclasses.replace(r, step_time_ns=wall, step_time_ns_median=_median(wall), cpu_ns=cpu)


def judge(cand: RunStat, base: Sequence[RunStat], cfg: GateConfig) -> tuple[bool, str]:
    """(fails, the signal that decided) by the gate's two timing checks."""
    cond = RunConditions(cand.conditions) if cand.conditions is not None else None
    busy = contention(cond, cfg)
    cpu = cpu_check(cand, base, cfg, "cpu", False)
    wall = regression_check(cand, base, cfg, busy)
    if cpu.status == "fail":
        return True, "cpu"
    if wall.status == "fail":
        return True, "wall"
    return False, "-"


def replay(path: Path, replicates: int, seed: int, n: int = 3) -> None:
    """Print the false-alarm and detection rates over every ``n``-run baseline (module doc)."""
    runs = baseline_from_json(json.loads(path.read_text()))
    same = [r for r in runs if not r.name.startswith("slow")]
    slow = [r for r in runs if r.name.startswith("slow")]
    cfg = GateConfig()
    rng = np.random.default_rng(seed)
    tally: dict[str, list[int]] = {"unchanged": [0, 0, 0], f"+{EFFECT:.0%} own work": [0, 0, 0]}
    for r in slow:
        tally[f"recorded {r.name}"] = [0, 0, 0]

    def count(key: str, subject: RunStat, b: Sequence[RunStat]) -> None:
        fails, why = judge(subject, b, cfg)
        tally[key][0] += fails
        tally[key][1] += 1
        tally[key][2] += why == "wall"

    for base in itertools.combinations(same, n):
        others = [r for r in same if r not in base]
        for rep in range(replicates + 1):
            b = list(base) if rep == 0 else [_resample(x, rng) for x in base]
            for cand in others:
                c = cand if rep == 0 else _resample(cand, rng)
                count("unchanged", c, b)
                count(f"+{EFFECT:.0%} own work", slowed(c), b)
            for r in slow:
                count(f"recorded {r.name}", r if rep == 0 else _resample(r, rng), b)
    print(
        f"{len(same)} unchanged runs, {len(slow)} slowed; {n}-run baselines, "
        f"{replicates} bootstrap replicates each"
    )
    for key, (fails, total, wall) in tally.items():
        print(
            f"  {key:24s} {fails:5d} of {total:5d} fail ({fails / max(total, 1):.1%}); "
            f"{wall} by the wall clock"
        )


def block(name: str) -> tuple[str, int] | None:
    """``base3`` → ("base", 3), ``slow30_3`` → ("slow30", 3): a run's kind and its block."""
    m = re.fullmatch(r"([a-z]+\d*?)_?(\d+)", name)
    return (m[1], int(m[2])) if m else None


def replay_paired(path: Path, replicates: int, seed: int, n: int = 3) -> None:
    """The paired rule on runs recorded in blocks (base_k, same_k, slowNN_k, …, k = 1, 2, …).

    Each block's runs ran one after the other, so a candidate run is paired with its
    block's ``base`` run. Every choice of ``n`` blocks, each also with seeded bootstrap
    replicates of every run's steps: the ``same`` runs (false alarms), the ``same`` runs
    with their own work +25% (detection, as :func:`slowed`), and each recorded ``slowNN``.
    """
    from gpudiag.analysis.compare.paired import paired_checks

    runs = baseline_from_json(json.loads(path.read_text()))
    blocks: dict[int, dict[str, RunStat]] = {}
    for r in runs:
        kb = block(r.name)
        if kb:
            blocks.setdefault(kb[1], {})[kb[0]] = r
    kinds = sorted({k for b in blocks.values() for k in b} - {"base"})
    cfg = GateConfig()
    rng = np.random.default_rng(seed)
    tally: dict[str, list[int]] = {}

    def count(key: str, cands: list[RunStat], base: list[RunStat]) -> None:
        checks = paired_checks(cands, base, cfg, "cpu", False)
        t = tally.setdefault(key, [0, 0, 0])
        fails = [c.name for c in checks if c.status == "fail"]
        t[0] += bool(fails)
        t[1] += 1
        t[2] += fails == ["step_time_regression"]

    for chosen in itertools.combinations(sorted(blocks), n):
        for rep in range(replicates + 1):

            def pick(kind: str, chosen: tuple[int, ...] = chosen, rep: int = rep) -> list[RunStat]:
                got = [blocks[k][kind] for k in chosen]
                return got if rep == 0 else [_resample(x, rng) for x in got]

            if not all(kind in blocks[k] for k in chosen for kind in ["base", *kinds]):
                continue
            base = pick("base")
            for kind in kinds:
                cands = pick(kind)
                count(kind, cands, base)
                if kind.startswith("same"):
                    count(f"{kind} +{EFFECT:.0%} own work", [slowed(c) for c in cands], base)
    print(f"{len(blocks)} blocks; {n}-pair subsets, {replicates} bootstrap replicates each")
    for key, (fails, total, wall) in tally.items():
        print(
            f"  {key:24s} {fails:5d} of {total:5d} fail ({fails / max(total, 1):.1%}); "
            f"{wall} by the wall clock alone"
        )
    for k in sorted(blocks):
        b = blocks[k]["base"]
        row = [f"block {k}: base {b.step_time_ns_median / 1e6:.0f} ms"]
        for kind in kinds:
            c = blocks[k].get(kind)
            if c is not None and b.cpu_ns and c.cpu_ns:
                wall = c.step_time_ns_median / b.step_time_ns_median  # type: ignore[operator]
                cpu = _median(c.cpu_ns) / _median(b.cpu_ns)
                row.append(f"{kind} wall ×{wall:.2f} cpu ×{cpu:.2f}")
        print("  " + "; ".join(row))


def main() -> None:
    """``record`` or ``replay`` (the module's doc)."""
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--runs", nargs="+", default=["base1", "base2", "base3", "same1", "slow30"])
    r.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    r.add_argument(
        "--concurrent", action="store_true", help="start each block's runs at the same time"
    )
    q = sub.add_parser("replay")
    q.add_argument("runs", type=Path)
    q.add_argument("--replicates", type=int, default=10)
    q.add_argument("--seed", type=int, default=32)
    q.add_argument("--baseline-runs", type=int, default=3)
    q2 = sub.add_parser("replay-paired")
    q2.add_argument("runs", type=Path)
    q2.add_argument("--replicates", type=int, default=10)
    q2.add_argument("--seed", type=int, default=32)
    q2.add_argument("--pairs", type=int, default=3)
    a = p.parse_args()
    if a.cmd == "record":
        record(a.out, a.runs, a.keep, a.concurrent)
    elif a.cmd == "replay-paired":
        replay_paired(a.runs, a.replicates, a.seed, a.pairs)
    else:
        replay(a.runs, a.replicates, a.seed, a.baseline_runs)


if __name__ == "__main__":
    main()
