"""Benchmark ``gpudiag analyze`` on a large Nsight Systems export (issue 6).

Builds an export of about ``--size-mb`` MB (default 135) in a temporary directory by
replicating the activity rows of a shared export back to back (kernels, copies, memsets,
runtime calls and NVTX ranges, shifted in time by the capture span and in correlation id
per copy), then runs ``python -m gpudiag analyze BIG.sqlite --format json -o -`` (stdout discarded)
``--repeat`` times and reports wall and CPU time, peak RSS and rows per second.

Usage::

    python benchmarks/bench_nsys.py [--source ../shared/traces/nsys/nsys-ai/mfu_2gpu_before.sqlite]
        [--size-mb 135] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "traces" / "nsys" / "nsys-ai" / "mfu_2gpu_before.sqlite"
TABLES = [
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
]


def build(source: Path, out: Path, size_mb: float) -> dict[str, int]:
    """Copy ``source`` to ``out`` and append shifted copies of its rows until it is big enough."""
    shutil.copy(source, out)
    os.chmod(out, 0o644)
    con = sqlite3.connect(out)
    tabs = [
        t
        for t in TABLES
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone()
    ]
    lo, hi, corr = 2**62, 0, 0
    for t in tabs:
        a, b = con.execute(f'SELECT MIN(start), MAX(COALESCE("end", start)) FROM {t}').fetchone()
        lo, hi = min(lo, a), max(hi, b)
        if "correlationId" in {r[1] for r in con.execute(f"PRAGMA table_info({t})")}:
            corr = max(corr, con.execute(f"SELECT MAX(correlationId) FROM {t}").fetchone()[0])
    span = hi - lo + 1_000_000
    originals = {t: con.execute(f"SELECT MAX(rowid) FROM {t}").fetchone()[0] for t in tabs}
    k = 0
    while out.stat().st_size < size_mb * 1e6:
        k += 1
        for t in tabs:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
            sel = []
            for c in cols:
                if c in ("start", "end"):
                    sel.append(f'"{c}" + {k * span}')
                elif c == "correlationId":
                    sel.append(f"correlationId + {k * (corr + 1)}")
                else:
                    sel.append(f'"{c}"')
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(
                f"INSERT INTO {t} ({names}) SELECT {', '.join(sel)} FROM {t} "
                f"WHERE rowid <= {originals[t]}"
            )
        con.commit()
    counts = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tabs}
    con.close()
    counts["copies"] = k + 1
    return counts


def run_once(path: Path) -> tuple[float, float, int]:
    """Wall s, CPU s and peak RSS (bytes) of one ``gpudiag analyze`` subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    # The report goes to stdout (-o -), discarded by the parent: never `-o /dev/null`,
    # which older gpudiag replaced with a regular file through its temporary-file rename.
    r = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(path), "--format", "json", "-o", "-"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        check=False,
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"gpudiag analyze failed ({r.returncode}):\n{r.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--size-mb", type=float, default=135.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="build into this directory and keep the file")
    args = ap.parse_args()
    if not args.source.is_file():
        sys.exit(f"source export not found: {args.source}")
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="gpudiag-bench-nsys-"))
    tmp.mkdir(parents=True, exist_ok=True)
    if ROOT in tmp.resolve().parents or tmp.resolve() == ROOT:
        sys.exit("refusing to write inside the repository")
    big = tmp / "big.sqlite"
    t = time.perf_counter()
    counts = build(args.source, big, args.size_mb)
    print(
        f"built {big} ({big.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s: "
        + ", ".join(f"{k} {v:,}" for k, v in counts.items())
    )
    rows = sum(v for k, v in counts.items() if k != "copies")
    print("run  wall_s  cpu_s  peak_rss_MB  rows/s(wall)")
    try:
        for i in range(args.repeat):
            wall, cpu, rss = run_once(big)
            print(f"{i + 1:>3}  {wall:6.2f}  {cpu:5.2f}  {rss / 1e6:11.0f}  {rows / wall:12,.0f}")
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
