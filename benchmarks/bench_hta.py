"""gpudiag against Holistic Trace Analysis on the same traces, and a cached second look (issue 23).

For a directory of Kineto traces (``make_big_trace.py`` makes 8 × 56 MB), each run in a
fresh subprocess and measured from outside — wall time, CPU of the whole process tree
(``wait4``), peak RSS of the largest process (``ru_maxrss``) and the peak of the
sampled sum of PSS over the tree (shared pages counted once). CPU and peak RSS are the
child's own ``wait4`` rusage, which covers the workers it waited for (HTA's pool, gpudiag's);
the peak RSS is that of the largest single process:

* ``gpudiag analyze DIR -f json --no-cache`` (the first look);
* ``gpudiag analyze DIR -f json`` twice with an empty cache directory: the run that fills
  the cache, then the second look, answered from it;
* HTA (``pip install holistictraceanalysis``, in its own virtual environment given with
  ``--hta-python``): ``TraceAnalysis(trace_dir=DIR)`` (parses every rank) and
  ``get_temporal_breakdown`` (idle / compute / non-compute time per rank), the nearest of
  its analyses to gpudiag's step breakdown.

Usage::

    python benchmarks/make_big_trace.py /tmp/big8
    python -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis
    python benchmarks/bench_hta.py /tmp/big8 --hta-python /tmp/hta/bin/python [--repeat 2]

Each figure is the best of ``--repeat`` runs (gpudiag and HTA alternate, so both see the
same load); the host's load average is printed beside it. Every run must read every rank
file (HTA reports the ranks it parsed, gpudiag's JSON lists them): a run that read fewer is
reported and no ratio is printed — HTA's rank regex once read compact JSON
(``"rank":3``) as rank 0, and one rank of eight made it look ×3 faster than it is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_analyze import _pss, _tree

REPO = Path(__file__).resolve().parents[1]

_HTA = r"""
import sys, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
b = a.get_temporal_breakdown(visualize=False)
print("ranks", len(a.t.traces), len(b))
"""


def rank_files(d: str) -> int:
    """The trace files of the directory: what every analyser must read."""
    return sum(
        1
        for p in Path(d).iterdir()
        if p.name.endswith((".json", ".json.gz")) and not p.name.startswith(".")
    )  # make_big_trace.py's .bench-info.json is no trace


def measure(
    cmd: list[str], env: dict[str, str], cwd: str, sample_pss: bool = False
) -> dict[str, Any]:
    """Wall, CPU and peak RSS of the command's tree (its own rusage); with ``sample_pss``,
    the sampled peak PSS of the tree instead of timing figures.

    Sampling reads ``/proc`` every 50 ms: 10-18% of a core here (more for HTA's larger
    processes), taken from the command it watches. So timed runs never sample, and the
    PSS comes from runs of their own, whose times are not reported.
    """
    # output to files, not pipes: nobody reads a pipe until the child ends, and a child
    # whose output passes the pipe's 64 KiB (a diagnosis of 8 ranks does) would block
    # on it forever
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fout, stderr=ferr)
        pss = 0
        while True:  # wait4 (not poll): the child's own rusage, its waited-for workers included
            if not sample_pss:
                _, status, ru = os.wait4(p.pid, 0)
                break
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            pss = max(pss, 1024 * sum(_pss(q) for q in _tree(p.pid)))  # kB
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fout.seek(0)
        ferr.seek(0)
        out = fout.read().decode(errors="replace")
        err = ferr.read().decode(errors="replace")
    if p.returncode:
        sys.stderr.write(err[-2000:])
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "maxrss": ru.ru_maxrss * 1024,
        "pss": pss,
        "rc": p.returncode,
        "ranks": _ranks_read(out),
    }


def _ranks_read(stdout: str) -> int:
    """How many ranks the run read: HTA's own count, or the ranks of gpudiag's JSON."""
    for line in stdout.splitlines():
        if line.startswith("ranks "):
            return int(line.split()[1])
    try:
        import json

        return len(json.loads(stdout)["ranks"])
    except (ValueError, KeyError, TypeError):
        return -1


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {k: min(r[k] for r in rows) for k in rows[0]}
    out["ranks"] = min(r["ranks"] for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", type=Path)
    ap.add_argument("--hta-python", type=Path, help="python of a venv with HTA installed")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--repo", type=Path, default=REPO, help="the gpudiag tree to time")
    ns = ap.parse_args(argv)
    d = str(ns.traces.resolve())
    rows: dict[str, list[dict[str, Any]]] = {}
    pss: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="gpudiag-hta-") as tmp:
        env = dict(
            os.environ,
            PYTHONPATH=str(ns.repo.resolve()),
            PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"),
        )
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("GPUDIAG_NO_CACHE", None)
        gd = [sys.executable, "-m", "gpudiag", "analyze", d, "-f", "json"]
        help_text = subprocess.run(
            [*gd[:4], "--help"], env=env, cwd=tmp, capture_output=True, text=True
        ).stdout
        has_cache = "--no-cache" in help_text
        subprocess.run([sys.executable, "-m", "gpudiag", "--version"], env=env, cwd=tmp)
        first_look = gd + (["--no-cache"] if has_cache else [])
        hta = [str(ns.hta_python), "-c", _HTA, d] if ns.hta_python else None
        # untimed: writes the bytecode into the scratch prefix, as an installed package has it
        subprocess.run(first_look, env=env, cwd=tmp, capture_output=True)
        print(f"load average at start: {loadavg()}; best of {ns.repeat}", flush=True)
        for i in range(ns.repeat):
            rows.setdefault("gpudiag, first look", []).append(measure(first_look, env, tmp))
            if has_cache:
                env["GPUDIAG_CACHE_DIR"] = str(Path(tmp) / f"cache-{i}")
                rows.setdefault("gpudiag, filling the cache", []).append(measure(gd, env, tmp))
                rows.setdefault("gpudiag, second look (cached)", []).append(measure(gd, env, tmp))
            if hta is not None:
                rows.setdefault("HTA: load + temporal breakdown", []).append(
                    measure(hta, dict(os.environ), tmp)
                )
            print(f"  run {i + 1} done, load {loadavg()}", flush=True)
        # the peak PSS of each tree, from runs of their own (sampling costs the run CPU)
        pss["gpudiag, first look"] = measure(first_look, env, tmp, sample_pss=True)["pss"]
        if hta is not None:
            pss["HTA: load + temporal breakdown"] = measure(
                hta, dict(os.environ), tmp, sample_pss=True
            )["pss"]
    print(f"load average at end: {loadavg()}")
    files = rank_files(d)
    print(f"{'':34} {'wall s':>7} {'CPU s':>7} {'max RSS':>9} {'tree PSS':>9}  rc  ranks read")
    out = {k: best(v) for k, v in rows.items()}
    walls = {k: [r["wall_s"] for r in v] for k, v in rows.items()}
    for name, r in out.items():
        r["pss"] = pss.get(name, 0)
        tree = f"{r['pss'] / 1e6:7.0f}MB" if r["pss"] else "-"  # sampled for first looks only
        print(
            f"{name:34} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {r['maxrss'] / 1e6:7.0f}MB "
            f"{tree:>9}  {r['rc']}  {r['ranks']} of {files}"
        )
        print(f"{'':34} wall of each run: {', '.join(f'{x:.2f}' for x in walls[name])}")
    short = [n for n, r in out.items() if r["ranks"] != files]
    if short:  # a peer that read fewer ranks did less work: no ratio is honest then
        print(f"NOT COMPARABLE: {', '.join(short)} did not read all {files} rank files")
        return 1
    first = out["gpudiag, first look"]
    if "HTA: load + temporal breakdown" in out:
        h = out["HTA: load + temporal breakdown"]
        print(
            f"HTA / gpudiag: wall x{h['wall_s'] / first['wall_s']:.1f}, "
            f"CPU x{h['cpu_s'] / first['cpu_s']:.1f}, "
            f"tree PSS x{h['pss'] / max(first['pss'], 1):.1f}, "
            f"max RSS x{h['maxrss'] / first['maxrss']:.1f}"
        )
    if has_cache:
        c = out["gpudiag, second look (cached)"]
        print(
            f"cached / first: wall {c['wall_s'] / first['wall_s']:.0%}, "
            f"CPU {c['cpu_s'] / first['cpu_s']:.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
