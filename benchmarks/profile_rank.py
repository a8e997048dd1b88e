"""Per-rank CPU against the decode floor, and where the rest goes (issue 23).

For one Kineto trace file, in this process (best of ``--repeat`` each, CPU time):

* **floor**: read + gunzip the file and decode it with msgspec into gpudiag's typed event
  structs in one call (``kineto.read_bytes`` + ``kineto.decode``): what any reader of the
  format pays before it knows anything;
* **per rank**: ``RankWork`` (``source_results`` before issue 28, ``analyze_source``
  before 19) — the whole per-file unit of work of an analysis (the streamed load into
  columns, steps, classification, collectives, evidence);

then a cProfile of ``RankWork``, its own time grouped by gpudiag module (and
"gunzip", "msgspec decode", "numpy" for the libraries), and the top functions.

Usage::

    python benchmarks/profile_rank.py ../shared/traces/kineto/a100x8_r3/rank-3.json.gz
    python benchmarks/profile_rank.py /tmp/big8/rank-0.json.gz --repeat 3 --top 25
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any


def cpu(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        c = time.process_time()
        fn()
        best = min(best, time.process_time() - c)
    return best


def group_of(filename: str, func: str) -> str:
    """A profile entry's bucket: a gpudiag module, or the library doing the work."""
    if "gpudiag" in filename:
        return "gpudiag/" + filename.split("gpudiag/", 1)[-1]
    if "msgspec" in func:
        return "msgspec decode (C)"
    if "gzip" in filename or "_compression" in filename or "zlib" in func or "isal" in func:
        return "gunzip (C + gzip.py)"
    if "fromiter" in func:
        return "numpy.fromiter (struct fields -> columns)"
    if "numpy" in filename or "numpy" in func or "ndarray" in func or "ufunc" in func:
        return "numpy (other)"
    if "re.Pattern" in func or "/re/" in filename:
        return "re"
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--top", type=int, default=20)
    ns = ap.parse_args(argv)

    try:
        from gpudiag.fanout.work import RankWork

        def analyze_source(source: Any, thresholds: Any) -> Any:
            return RankWork(thresholds)(source)
    except ImportError:  # a tree from before issue 28's work item
        try:
            from gpudiag.analysis.rank.analyse import (  # type: ignore[attr-defined,no-redef]
                source_results as analyze_source,
            )
        except ImportError:  # a tree from before issue 19's split
            from gpudiag.analysis.diagnose import (  # type: ignore[attr-defined,no-redef]
                analyze_source,
            )
    from gpudiag.config import Thresholds
    from gpudiag.traces import kineto
    from gpudiag.traces.load import load_run

    th = Thresholds()
    source = load_run(ns.trace).sources[0]
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])

    def floor() -> None:
        kineto.decode(ns.trace, kineto.read_bytes(ns.trace))

    def gunzip() -> None:
        kineto.read_bytes(ns.trace)

    def rank() -> None:
        analyze_source(source, th)

    results = analyze_source(source, th)
    events = sum(r.events for r in results)
    g = cpu(gunzip, ns.repeat)
    f = cpu(floor, ns.repeat)
    r = cpu(rank, ns.repeat)
    print(f"{ns.trace}: {events:,} events; load average {load}; best of {ns.repeat}, CPU s")
    print(f"  read + gunzip            {g:7.3f}")
    print(f"  floor (+ typed decode)   {f:7.3f}   {events / f / 1e3:6.0f}k events/s")
    print(
        f"  analyze_source           {r:7.3f}   {events / r / 1e3:6.0f}k events/s   "
        f"x{r / f:.2f} the floor, +{r - f:.3f} s"
    )

    prof = cProfile.Profile()
    prof.enable()
    analyze_source(source, th)
    prof.disable()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    groups: dict[str, float] = defaultdict(float)
    for (filename, _, func), v in st.stats.items():  # type: ignore[attr-defined]
        groups[group_of(filename, func)] += v[2]
    print(f"\n  own time by module under cProfile (total {total:.3f} s, profiler overhead incl.):")
    for name, t in sorted(groups.items(), key=lambda kv: -kv[1])[:15]:
        print(f"    {t:7.3f} s {t / total:6.1%}  {name}")
    print(f"\n  top {ns.top} functions by own time:")
    st.sort_stats("tottime").print_stats(ns.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
