"""Build a large multi-rank Kineto input by replicating the events of a real trace.

Each output rank file holds ``--copies`` back-to-back copies of the source trace's events.
Copy ``k`` is shifted in time by ``k`` times the source span, its ``ProfilerStep#N`` numbers
by ``k`` times the number of source steps, and its correlation / External id / flow ids by
``k`` times a stride above the largest source id, so steps, launches and correlations stay
consistent and unique. ``distributedInfo.rank`` and ``world_size`` are set per file.

Usage::

    python benchmarks/make_big_trace.py OUT_DIR [--ranks 8] [--copies 2]
        [--source /work/shared/traces/kineto/a100x8_r3/rank-3.json.gz]

OUT_DIR must lie outside the repository (it is refused otherwise). A hidden
``.bench-info.json`` records event counts and uncompressed sizes for bench_analyze.py.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

import msgspec

try:
    from isal import igzip as gz
except ImportError:  # pragma: no cover
    gz = gzip  # type: ignore[misc]

DEFAULT_SOURCE = "/work/shared/traces/kineto/a100x8_r3/rank-3.json.gz"
REPO = Path(__file__).resolve().parents[1]
_STEP = re.compile(r"^(ProfilerStep#)(\d+)$")
_ID_ARGS = ("correlation", "External id", "external id")


def _replicate(trace: dict[str, Any], copies: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = trace["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = int(t1 - t0) + 1000  # 1 ms gap between copies
    steps = {int(m.group(2)) for e in events if (m := _STEP.match(str(e.get("name", ""))))}
    step_stride = (max(steps) - min(steps) + 1) if steps else 0
    max_id = 0
    for e in events:
        a = e.get("args") or {}
        for k in _ID_ARGS:
            if isinstance(a.get(k), int):
                max_id = max(max_id, a[k])
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
    id_stride = 10 ** len(str(max_id))
    out: list[dict[str, Any]] = []
    for k in range(copies):
        if k == 0:
            out.extend(events)
            continue
        for e in events:
            if e.get("ph") == "M":  # metadata once is enough
                continue
            c = dict(e)
            if "ts" in c:
                c["ts"] = c["ts"] + k * span
            if isinstance(c.get("id"), int):
                c["id"] = c["id"] + k * id_stride
            m = _STEP.match(str(c.get("name", "")))
            if m:
                c["name"] = f"{m.group(1)}{int(m.group(2)) + k * step_stride}"
            a = c.get("args")
            if a:
                a = dict(a)
                for key in _ID_ARGS:
                    if isinstance(a.get(key), int) and a[key] >= 0:
                        a[key] = a[key] + k * id_stride
                c["args"] = a
            out.append(c)
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the rank files and the info file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--source", type=Path, default=Path(DEFAULT_SOURCE))
    ap.add_argument("--level", type=int, default=1, help="gzip level (isal: 0-3)")
    ns = ap.parse_args(argv)
    out: Path = ns.out.resolve()
    if out == REPO or REPO in out.parents:
        print(f"refusing to write into the repository ({out}); give a temp dir", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    raw = ns.source.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gz.decompress(raw)
    trace = msgspec.json.decode(raw)
    events = _replicate(trace, ns.copies)
    trace["traceEvents"] = events
    info: dict[str, Any] = {"source": str(ns.source), "copies": ns.copies, "files": {}}
    for r in range(ns.ranks):
        dist = dict(trace.get("distributedInfo") or {})
        dist.update(rank=r, world_size=ns.ranks)
        trace["distributedInfo"] = dist
        # as torch writes it: a space after each ':' and ',' ("rank": 3); HTA's rank regex
        # needs that space, and a compact file (msgspec's "rank":3) reads as rank 0 to it
        data = json.dumps(trace).encode()
        name = f"rank-{r}.json.gz"
        (out / name).write_bytes(gz.compress(data, ns.level))
        info["files"][name] = {"events": len(events), "json_bytes": len(data)}
        print(f"{out / name}: {len(events)} events, {len(data) / 1e6:.1f} MB JSON", file=sys.stderr)
    (out / ".bench-info.json").write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
