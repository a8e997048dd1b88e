"""The fixed cost of a gpudiag command against the floor of its own stack (issue 23).

Writes a tiny Kineto trace (3 events: one step, one kernel, one data range) outside the
repository, then runs each command ``--repeat`` times in a fresh interpreter and keeps the
minimum wall time and the minimum peak RSS (``ru_maxrss`` of the child from ``wait4``,
which covers the process and any worker it waited for):

Wall time, CPU time (user + sys, from ``wait4``: steadier than wall on a busy host) and peak
RSS, each the minimum over the runs. The rows:

* floors: ``python -c "import numpy, msgspec"`` (the decode stack) and the same with
  ``typer`` and ``rich`` (the CLI stack);
* ``gpudiag --version`` and ``--help``;
Bytecode is compiled once into a scratch ``PYTHONPYCACHEPREFIX`` first (as an installed
package has it), whatever ``PYTHONDONTWRITEBYTECODE`` says.

* ``gpudiag analyze TINY -f json`` with ``--no-cache`` (the first look), then with the cache
  (a second look on the unchanged trace), and ``gpudiag report TINY``.

Usage::

    python benchmarks/bench_fixed_cost.py [--repeat 7] [--json out.json]

The host's load average is printed beside the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "schemaVersion": 1,
    "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"},
    "traceEvents": [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 1000,
            "dur": 1000,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "enumerate(DataLoader)#_next_",
            "pid": 1,
            "tid": 1,
            "ts": 1010,
            "dur": 100,
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 1200,
            "dur": 600,
        },
    ],
}


def measure(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds, peak RSS in bytes and exit status of ``cmd``."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode and p.stderr is not None:
        sys.stderr.write(p.stderr.read().decode(errors="replace"))
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, p.returncode


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--repo", type=Path, default=REPO, help="the gpudiag tree to time")
    ns = ap.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="gpudiag-fixed-") as tmp:
        tiny = Path(tmp) / "rank-0.json.gz"
        tiny.write_bytes(gzip.compress(json.dumps(TINY).encode()))
        # Bytecode as an installed package has it (compiled once, into a scratch prefix),
        # even where PYTHONDONTWRITEBYTECODE is set: compiling sources is not gpudiag's cost.
        env = dict(
            os.environ,
            PYTHONPATH=str(ns.repo.resolve()),
            GPUDIAG_CACHE_DIR=str(Path(tmp) / "cache"),
            PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"),
        )
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        gd = [py, "-m", "gpudiag"]
        cases = {
            "python -c pass": [py, "-c", "pass"],
            "floor: import numpy, msgspec": [py, "-c", "import numpy, msgspec"],
            "floor + typer, rich": [py, "-c", "import numpy, msgspec, typer, rich"],
            "gpudiag --version": [*gd, "--version"],
            "gpudiag --help": [*gd, "--help"],
            "analyze tiny -f json --no-cache": [
                *gd,
                "analyze",
                str(tiny),
                "-f",
                "json",
                "--no-cache",
            ],
            "analyze tiny -f json (cached)": [*gd, "analyze", str(tiny), "-f", "json"],
            "report tiny (cached)": [*gd, "report", str(tiny), "-o", str(Path(tmp) / "r.html")],
        }
        # cwd = the scratch directory: `python -m` puts the cwd first on sys.path
        helptext = subprocess.run(
            [*gd, "analyze", "--help"], env=env, capture_output=True, text=True, cwd=tmp
        ).stdout
        if "--no-cache" not in helptext:  # a gpudiag without the cache: every run is a first
            for cmd in cases.values():
                if "--no-cache" in cmd:
                    cmd.remove("--no-cache")
        # One run each writes the bytecode and fills the cache for the cached rows.
        for cmd in cases.values():
            subprocess.run(cmd, env=env, capture_output=True, cwd=tmp)
        rows: dict[str, dict[str, Any]] = {}
        loads = [loadavg()]
        for _ in range(ns.repeat):  # interleaved, so a load spike hits every row alike
            for name, cmd in cases.items():
                wall, cpu, rss, rc = measure(cmd, env, tmp)
                r = rows.setdefault(name, {"wall": [], "cpu": [], "rss": [], "rc": rc})
                r["wall"].append(wall)
                r["cpu"].append(cpu)
                r["rss"].append(rss)
        loads.append(loadavg())
    floor = rows["floor: import numpy, msgspec"]
    fw, fc, fr = min(floor["wall"]), min(floor["cpu"]), min(floor["rss"])
    print(f"load average before / after: {loads[0]} / {loads[1]}; best of {ns.repeat}")
    print(
        f"{'command':34} {'wall s':>6} {'×floor':>6} {'CPU s':>6} {'×floor':>6} "
        f"{'RSS MB':>6} {'×floor':>6}  rc"
    )
    out = {"load": loads, "repeat": ns.repeat, "rows": {}}
    for name, r in rows.items():
        w, c, m = min(r["wall"]), min(r["cpu"]), min(r["rss"])
        print(
            f"{name:34} {w:6.3f} {w / fw:6.2f} {c:6.3f} {c / fc:6.2f} {m / 1e6:6.1f} "
            f"{m / fr:6.2f}  {r['rc']}"
        )
        out["rows"][name] = {"wall_s": w, "cpu_s": c, "rss_bytes": m, "rc": r["rc"]}
    if ns.json:
        ns.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
