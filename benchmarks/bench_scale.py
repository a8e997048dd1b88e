"""Scaling of ``gpudiag analyze``: local processes vs a Dask LocalCluster, 8 to 256 ranks.

For each rank count, ``gpudiag analyze DIR -f json`` runs in a subprocess twice: with the
local process pool (``--scheduler local``) and with ``--scheduler`` pointing at a
``distributed.LocalCluster`` (worker processes, one thread each) that this script starts.
Measured: wall time; CPU time (local: the whole process tree; cluster: the client, the
workers' own ``getrusage`` and this process, which hosts the scheduler); the client's peak
RSS (its own VmHWM at exit); the workers' peak RSS (local: polled VmHWM) and the peak of
the sampled sum of PSS over the local tree; the bytes each rank ships (pickled task in,
pickled result out). Both reports must be identical. Then the cross-rank step
(``build_diagnosis``) is timed on synthetic per-rank results, copies of a real one with
jittered times, for the projection.

The rank files are replicated from a real trace by make_big_trace.py (``--copies`` copies
of its events each), once for the largest count; smaller counts use the first N of them.

Usage::

    python benchmarks/bench_scale.py /tmp/scale [--ranks 8,64,256] [--workers 2]
        [--synthetic-ranks 1024,8192] [--source ../shared/traces/kineto/a100x8_r3/rank-3.json.gz]
    python benchmarks/bench_scale.py /tmp/scale --synthetic [--synthetic-ranks 1024,8192]

``--synthetic`` times only the cross-rank step: the source file is analysed once here and
its per-rank result copied into N synthetic ranks, so no rank file is written or decoded.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_analyze import _pss, _status, _tree

HERE = Path(__file__).resolve().parent
MB = 1e6

# Runs the CLI and reports its own peak RSS: VmHWM, not ru_maxrss, which execve carries over
# from the process that forked it (this benchmark, with its cluster).
_RUNNER = r"""
import atexit, json, sys
def report():
    with open("/proc/self/status") as f:
        hwm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))
    print(json.dumps({"self_maxrss": hwm}), file=sys.stderr)
atexit.register(report)
from gpudiag.cli.main import main
main(sys.argv[1:])
"""

# Times build_diagnosis on N synthetic ranks made from one real rank's result.
_CROSS = r"""
import dataclasses, json, pickle, sys, time
import numpy as np
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))
from gpudiag.analysis.diagnose import build_diagnosis
from gpudiag.config import Thresholds
base = pickle.loads(open(sys.argv[1], "rb").read())
n = int(sys.argv[2])
rng = np.random.default_rng(14)
before = hwm()
results = []
for r in range(n):
    f = rng.normal(1.0, 0.02, len(base.steps))
    steps = []
    for s, k in zip(base.steps, f):
        compute = int(s.compute_ns * k)
        other = max(0, s.other_ns + s.compute_ns - compute)
        dur = compute + s.comm_wait_ns + s.data_wait_ns + other
        steps.append(dataclasses.replace(s, rank=r, compute_ns=compute, other_ns=other,
                                         duration_ns=dur))
    c = base.collectives
    if c is not None:
        jitter = rng.integers(0, 50_000, len(c.start))
        c = dataclasses.replace(c, rank=r, start=c.start + jitter,
                                dur=np.maximum(c.dur - jitter, 1))
    meta = dataclasses.replace(base.meta, world_size=n)
    results.append(dataclasses.replace(base, rank=r, steps=steps, collectives=c, meta=meta))
shipped = sum(len(pickle.dumps([x], protocol=5)) for x in results)
built = hwm()
t0, c0 = time.perf_counter(), time.process_time()
d = build_diagnosis(results, Thresholds())
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"ranks": n, "wall_s": wall, "cpu_s": cpu, "shipped_bytes": shipped,
                  "hwm_before": before, "hwm_results": built, "hwm_after": hwm(),
                  "findings": len(d.findings), "steps": len(d.steps)}))
"""


def make_inputs(work: Path, ranks: list[int], source: Path, copies: int) -> dict[str, Any]:
    """Rank files for the largest count (made once) and a directory of links per count."""
    full = work / f"all-{max(ranks)}"
    info_file = full / ".bench-info.json"
    if not info_file.is_file() or len(json.loads(info_file.read_text())["files"]) < max(ranks):
        cmd = [
            sys.executable,
            str(HERE / "make_big_trace.py"),
            str(full),
            "--ranks",
            str(max(ranks)),
            "--copies",
            str(copies),
            "--source",
            str(source),
        ]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    info: dict[str, Any] = json.loads(info_file.read_text())
    for n in ranks:
        d = work / f"r{n}"
        d.mkdir(exist_ok=True)
        for r in range(n):
            link = d / f"rank-{r}.json.gz"
            if not link.exists():
                link.symlink_to(full / f"rank-{r}.json.gz")
    return info


def run_cli(directory: Path, scheduler: str, out: Path) -> dict[str, Any]:
    """One ``gpudiag analyze`` subprocess, measured from outside and from inside."""
    cmd = [
        sys.executable,
        "-c",
        _RUNNER,
        "analyze",
        str(directory),
        "--format",
        "json",
        "-o",
        str(out),
        "--scheduler",
        scheduler,
    ]
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env)
    tree_pss = worker_hwm = 0
    while proc.poll() is None:
        if scheduler == "local":  # the forked workers: peak RSS each, and the tree's PSS
            pids = _tree(proc.pid)
            tree_pss = max(tree_pss, sum(_pss(p) * 1024 for p in pids))
            hwms = [_status(p).get("VmHWM", 0) * 1024 for p in pids if p != proc.pid]
            worker_hwm = max([worker_hwm, *hwms])
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"gpudiag analyze failed ({proc.returncode}):\n{err}")
    inner = json.loads(err.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": wall,
        "client_cpu_s": cpu,
        "tree_pss": tree_pss,
        "worker_hwm": worker_hwm,
        **inner,
    }


def _usage() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _hwm() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def shipped_per_rank(path: Path) -> tuple[int, int, Any]:
    """Pickled bytes of one rank's task (function + source) and of its result."""
    import functools

    from gpudiag.config import Thresholds
    from gpudiag.traces.load import load_run

    fn: Any
    try:
        from gpudiag.fanout.work import RankWork

        fn = RankWork(Thresholds())
    except ImportError:  # a tree from before issue 28's work item (timed with PYTHONPATH)
        try:
            from gpudiag.analysis.rank.analyse import (  # type: ignore[attr-defined]
                source_results,
            )
        except ImportError:  # a tree from before issue 19's split
            from gpudiag.analysis.diagnose import (  # type: ignore[attr-defined,no-redef]
                analyze_source as source_results,
            )
        fn = functools.partial(source_results, thresholds=Thresholds())

    source = load_run(path).sources[0]
    task = len(pickle.dumps((fn, source), protocol=5))
    results = fn(source)
    return task, len(pickle.dumps(results, protocol=5)), results[0]


def cross_rank(base: Any, n: int, work: Path) -> dict[str, Any]:
    """build_diagnosis on ``n`` synthetic ranks, in a fresh interpreter."""
    blob = work / "rank-result.pickle"
    blob.write_bytes(pickle.dumps(base, protocol=5))
    out = subprocess.run(
        [sys.executable, "-c", _CROSS, str(blob), str(n)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    row: dict[str, Any] = json.loads(out)
    return row


def main(argv: list[str] | None = None) -> int:
    """Print the scaling table and the cross-rank table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path, help="scratch directory outside the repository")
    ap.add_argument("--ranks", default="8,64,256")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--synthetic",
        action="store_true",
        help="only the cross-rank step on synthetic ranks (no rank files, no cluster)",
    )
    ap.add_argument("--synthetic-ranks", default="1024,8192")
    ap.add_argument("--repeat", type=int, default=1, help="synthetic runs per count (best kept)")
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--modes", default="local,cluster")
    ap.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="MALLOC_MMAP_THRESHOLD_ for the workers (0: Dask's environment)",
    )
    ap.add_argument(
        "--source",
        type=Path,
        default=HERE.parent.parent / "shared/traces/kineto/a100x8_r3/rank-3.json.gz",
    )
    ns = ap.parse_args(argv)
    ranks = [int(x) for x in ns.ranks.split(",")]
    work: Path = ns.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if ns.synthetic:
        _, result_b, base = shipped_per_rank(ns.source)
        print(
            f"source: {ns.source} ({len(base.steps)} steps, "
            f"{len(base.collectives.type) if base.collectives else 0} collectives, "
            f"{result_b:,} B pickled); {os.cpu_count()} CPUs, load {_load()}"
        )
        synthetic_table(base, ns.synthetic_ranks, ns.repeat, work)
        return 0
    info = make_inputs(work, ranks, ns.source, ns.copies)
    per_file = next(iter(info["files"].values()))
    print(
        f"input: {ns.source.name} x{ns.copies} per rank: {per_file['events']:,} events, "
        f"{per_file['json_bytes'] / MB:.1f} MB JSON; {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}; cluster: {ns.workers} worker processes x 1 thread"
        + (f", MALLOC_MMAP_THRESHOLD_={ns.mmap_threshold}" if ns.mmap_threshold else "")
    )

    task_b, result_b, base = shipped_per_rank(work / f"r{ranks[0]}" / "rank-0.json.gz")
    print(
        f"shipped per rank: task {task_b:,} B in, result {result_b:,} B out "
        f"({len(base.steps)} steps, {len(base.collectives.type) if base.collectives else 0} "
        "collectives)\n"
    )

    import dask
    from distributed import Client, LocalCluster

    modes = ns.modes.split(",")
    if ns.mmap_threshold:
        # Dask's nannies set MALLOC_TRIM_THRESHOLD_, which turns off glibc's sliding mmap
        # threshold: every large temporary buffer is then mmapped and page-faulted anew.
        key = "distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_"
        dask.config.set({key: ns.mmap_threshold})
    cluster = LocalCluster(
        n_workers=ns.workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(ns.workers, timeout=300)
    rows = []
    print(
        f"  {'ranks':>5} {'mode':<8} {'wall s':>7} {'CPU s':>7} {'client RSS':>11} "
        f"{'worker RSS':>11} {'tree PSS':>9} {'B/rank out':>11} {'same':>5}"
    )
    try:
        for n in ranks:
            d = work / f"r{n}"
            events = n * per_file["events"]
            local = run_cli(d, "local", work / "local.json") if "local" in modes else None
            w0 = client.run(_usage)
            s0 = _usage()
            remote = run_cli(d, cluster.scheduler_address, work / "dask.json")
            s1 = _usage()
            w1 = client.run(_usage)
            same = (
                local is None
                or (work / "local.json").read_bytes() == (work / "dask.json").read_bytes()
            )
            remote["workers_cpu_s"] = sum(w1[w] - w0[w] for w in w1)
            remote["scheduler_cpu_s"] = s1 - s0
            remote["worker_hwm"] = max(client.run(_hwm).values())
            rows.append((n, events, local, remote, same))
            print_row(n, events, local, remote, same, result_b)
    finally:
        client.close()
        cluster.close()

    synthetic_table(base, ns.synthetic_ranks, ns.repeat, work)
    return 0 if all(r[4] for r in rows) else 1


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def synthetic_table(base: Any, counts: str, repeat: int, work: Path) -> None:
    """build_diagnosis on synthetic ranks, best of ``repeat`` fresh interpreters per count."""
    if not counts:
        return
    print("\ncross-rank step (build_diagnosis) on synthetic ranks, fresh interpreter each:")
    print(
        f"  {'ranks':>6} {'wall s':>8} {'CPU s':>8} {'results MB':>11} "
        f"{'RSS before':>11} {'with results':>13} {'peak':>8}  load"
    )
    cpus = {}
    for n in [int(x) for x in counts.split(",")]:
        c = min((cross_rank(base, n, work) for _ in range(repeat)), key=lambda r: r["cpu_s"])
        cpus[n] = c["cpu_s"]
        print(
            f"  {n:>6} {c['wall_s']:8.2f} {c['cpu_s']:8.2f} {c['shipped_bytes'] / MB:11.1f} "
            f"{c['hwm_before'] / MB:9.0f}MB {c['hwm_results'] / MB:11.0f}MB "
            f"{c['hwm_after'] / MB:6.0f}MB  {_load()}",
            flush=True,
        )
    if len(cpus) > 1:
        lo, hi = min(cpus), max(cpus)
        print(
            f"  {hi:,} ranks / {lo:,} ranks: x{hi / lo:.0f} ranks, x{cpus[hi] / cpus[lo]:.1f} CPU"
        )


def print_row(
    n: int,
    events: int,
    local: dict[str, Any] | None,
    remote: dict[str, Any],
    same: bool,
    result_b: int,
) -> None:
    """The rows of one rank count."""
    if local is not None:
        print(
            f"  {n:>5} {'local':<8} {local['wall_s']:7.1f} {local['client_cpu_s']:7.1f} "
            f"{local['self_maxrss'] / MB:9.0f}MB {local['worker_hwm'] / MB:9.0f}MB "
            f"{local['tree_pss'] / MB:7.0f}MB {'-':>11} {'':>5}"
        )
    cpu = remote["client_cpu_s"] + remote["workers_cpu_s"] + remote["scheduler_cpu_s"]
    print(
        f"  {n:>5} {'cluster':<8} {remote['wall_s']:7.1f} {cpu:7.1f} "
        f"{remote['self_maxrss'] / MB:9.0f}MB {remote['worker_hwm'] / MB:9.0f}MB {'':>9} "
        f"{result_b:>11,} {'yes' if same else 'NO':>5}"
    )
    print(
        f"        {'':<8} {'':>7} cluster CPU = client {remote['client_cpu_s']:.1f} + workers "
        f"{remote['workers_cpu_s']:.1f} + scheduler {remote['scheduler_cpu_s']:.1f}; "
        f"{events / remote['workers_cpu_s']:,.0f} events/s per worker CPU-second",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
