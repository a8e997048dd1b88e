"""Merge per-rank Kineto traces into one file the way users' merge tools do.

The conventions of TraceLens' TraceFusion (written from its documented behaviour, not its
code), and the variants other tools and hand-written scripts produce:

* every event gets ``args.rank``;
* ``pid``, ``id`` and the linking key (``args.correlation``, else ``args["External id"]``)
  are offset by ``rank × 10^(digits of the largest value + 1)``, the original kept in
  ``args.<field>_raw`` — so the ranks' processes and flows never collide;
* the source files' ``process_name`` / ``process_sort_index`` / ``process_labels``
  metadata is dropped and one ``process_name`` per pid says ``RANK r - GPU`` or
  ``RANK r - CPU``;
* nothing but ``traceEvents`` is written: ``distributedInfo``, ``deviceProperties`` and
  ``baseTimeNanoseconds`` are lost.

``style`` picks what the file says about ranks: ``tracefusion`` (both), ``args`` (only
``args.rank``, TraceFusion ≤ 0.3), ``labels`` (only the process names), ``none`` (offset
pids and nothing else: a file whose ranks cannot be told apart).

    python tests/accuracy/make_merged.py OUT.json.gz rank-0.json.gz rank-1.json.gz [--style S]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path
from typing import Any

STYLES = ("tracefusion", "args", "labels", "none")
_PROCESS_META = {"process_name", "process_sort_index", "process_labels"}
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _read(path: Path) -> dict[str, Any]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _multiplier(values: list[int]) -> int:
    top = max(values, default=0)
    return int(10 ** (math.ceil(math.log10(top + 1)) + 1))


def merge(paths: list[Path], style: str = "tracefusion") -> dict[str, Any]:
    """The merged trace of ``paths`` (rank i = the i-th path)."""
    traces = [_read(p) for p in paths]
    first = traces[0]["traceEvents"]
    launch = next(
        (
            e
            for e in first
            if e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "launch" in e.get("name", "").lower()
        ),
        None,
    )
    link = (
        "correlation"
        if launch is None or "correlation" in launch.get("args", {})
        else ("External id")
    )
    links = [e.get("args", {}).get(link) for e in first]
    mult = {
        "pid": _multiplier([e["pid"] for e in first if isinstance(e.get("pid"), int)]),
        "id": _multiplier([e["id"] for e in first if isinstance(e.get("id"), int)]),
        link: _multiplier([v for v in links if isinstance(v, int)]),
    }
    out: list[dict[str, Any]] = []
    pid_rank: dict[int, int] = {}
    gpu_pids: set[int] = set()
    for rank, trace in enumerate(traces):
        for e in trace["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") in _PROCESS_META:
                continue
            if e.get("cat") == "Trace" or e.get("cat") == "python_function":
                continue
            e = dict(e)
            args = e["args"] = dict(e.get("args") or {})
            if style in ("tracefusion", "args"):
                args["rank"] = rank
            for field in ("pid", "id"):
                if isinstance(e.get(field), int):
                    args[f"{field}_raw"] = e[field]
                    e[field] += rank * mult[field]
            if isinstance(args.get(link), int):
                args[f"{link}_raw"] = args[link]
                args[link] += rank * mult[link]
            if isinstance(e.get("pid"), int) and e.get("ph") != "M":
                pid_rank.setdefault(e["pid"], rank)
                if e.get("cat") in _GPU_CATS:
                    gpu_pids.add(e["pid"])
            out.append(e)
    if style in ("tracefusion", "labels"):
        for pid, rank in sorted(pid_rank.items(), key=lambda kv: (kv[1], kv[0])):
            label = "GPU" if pid in gpu_pids else "CPU"
            out.append(
                {
                    "name": "process_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": 0,
                    "args": {"name": f"RANK {rank} - {label}"},
                }
            )
    return {"traceEvents": out}


def write(out: Path, paths: list[Path], style: str = "tracefusion") -> Path:
    """Write the merged trace of ``paths`` to ``out`` (gzip when it ends in .gz)."""
    data = json.dumps(merge(paths, style)).encode()
    out.write_bytes(gzip.compress(data, 6) if out.suffix == ".gz" else data)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("inputs", type=Path, nargs="+")
    p.add_argument("--style", choices=STYLES, default="tracefusion")
    a = p.parse_args()
    write(a.out, a.inputs, a.style)


if __name__ == "__main__":
    main()
