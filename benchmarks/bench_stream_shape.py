"""Time the Kineto loader on traces of unusual shape: one huge string field, one huge event.

The streaming reader cuts the event array at ``},{`` boundaries; a trace whose text has
no boundary for tens of megabytes (one event with a 100 MB string argument, a long run
of nested arrays) must still load in time linear in its size. Each case is built in a
temporary directory outside the repository and loaded in a fresh interpreter that
reports its wall time and peak RSS (VmHWM).

Usage::

    python benchmarks/bench_stream_shape.py [--sizes 25 50 100 200] [--shape string]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_LOAD = r"""
import json, sys, time
from pathlib import Path
from gpudiag.errors import GpudiagError
from gpudiag.traces.kineto import load_kineto
t = time.perf_counter()
try:
    tl = load_kineto(Path(sys.argv[1]))
    outcome = f"{len(tl)} intervals"
except GpudiagError as e:
    outcome = f"error: {e.message[:80]}"
wall = time.perf_counter() - t
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
print(json.dumps({"wall_s": wall, "hwm_bytes": hwm * 1024, "outcome": outcome}))
"""

_EVENT = (
    '{{"ph":"X","cat":"cpu_op","name":"op{i}","pid":1,"tid":1,"ts":{ts},"dur":5,'
    '"args":{{"External id":{i}}}}}'
)


def build(path: Path, mb: int, shape: str) -> int:
    """Write a small trace with ``mb`` megabytes in one field; returns the file size."""
    events = [_EVENT.format(i=i, ts=1000 + 10 * i) for i in range(2000)]
    events.insert(
        2,
        '{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,'
        '"tid":1,"ts":1000,"dur":30000}',
    )
    n = mb * 1_000_000
    if shape == "string":  # one string argument without a single brace or comma
        big = (
            '{"ph":"X","cat":"cpu_op","name":"big","pid":1,"tid":1,"ts":1500,"dur":5,'
            '"args":{"note":"' + "a" * n + '"}}'
        )
    elif shape == "array":  # a long array of numbers in an unknown key
        big = (
            '{"ph":"X","cat":"cpu_op","name":"big","pid":1,"tid":1,"ts":1500,"dur":5,'
            '"extra":[' + ",".join(["1"] * (n // 2)) + "]}"
        )
    else:
        raise SystemExit(f"unknown shape {shape}")
    events.insert(1000, big)
    doc = '{"schemaVersion":1,"traceEvents":[' + ",".join(events) + '],"displayTimeUnit":"ms"}'
    path.write_text(doc)
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """Print one row per size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 200])
    ap.add_argument("--shape", choices=["string", "array"], default="string")
    ns = ap.parse_args(argv)
    print(f"{'field MB':>9} {'file MB':>8} {'wall s':>8} {'peak RSS MB':>12}  outcome")
    with tempfile.TemporaryDirectory(prefix="gpudiag-shape-") as tmp:
        for mb in ns.sizes:
            path = Path(tmp) / f"rank-0.{mb}.json"
            size = build(path, mb, ns.shape)
            out = subprocess.run(
                [sys.executable, "-c", _LOAD, str(path)], check=True, capture_output=True, text=True
            ).stdout
            r = json.loads(out)
            print(
                f"{mb:>9} {size / 1e6:>8.1f} {r['wall_s']:>8.2f} {r['hwm_bytes'] / 1e6:>12.0f}"
                f"  {r['outcome']}"
            )
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
