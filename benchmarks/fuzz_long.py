"""The long fuzz run of issue 13: ≥ 10 000 bad inputs through gpudiag, counted.

Cases come from the fuzz suite (``tests/fuzz``): every hand-made case once, then mutants
of the shared Kineto traces, Nsight exports and a run directory in the proportions below,
each from ``(seed, index)``. Every case goes through ``gpudiag.analyze`` in this process
(one case = one timing, its peak RSS measured after resetting VmHWM); one case in
``--cli-every`` also goes through ``python -m gpudiag analyze`` as a subprocess. The
property is the suite's (tests/fuzz/harness.py): a Diagnosis or a GpudiagError with exit
4/3, within 30 s and 1.5 GB, input files byte-identical. Anything else is listed.

Usage::

    python benchmarks/fuzz_long.py [--cases 10000] [--seed 1] [--cli-every 100]
        [--shared ../shared/traces] [--json summary.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fuzz"))

from cases import CASES, run_dir, use_shared  # noqa: E402
from harness import Outcome, run_case, run_cli_case  # noqa: E402
from mutate import load_bases, mutants, nsys_mutants, run_dir_mutants  # noqa: E402

SHARE = {"kineto": 0.70, "nsys": 0.15, "run": 0.15}  # of the mutants


def _restore_modes(root: Path) -> None:
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o755)


def _write(d: Path, files: dict[str, bytes]) -> list[Path]:
    tops = set()
    for name, data in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
        tops.add(d / name.split("/")[0])
    return sorted(tops)


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cli-every", type=int, default=100)
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "traces")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary here")
    ns = ap.parse_args(argv)
    use_shared(ns.shared)
    mutant_count = max(0, ns.cases - len(CASES))
    counts = {k: round(mutant_count * v) for k, v in SHARE.items()}
    counts["kineto"] = mutant_count - counts["nsys"] - counts["run"]
    kinds: collections.Counter[str] = collections.Counter()
    by_source: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    others: list[str] = []
    slowest: list[tuple[float, str]] = []
    peak = 0
    cli = collections.Counter[str]()
    t0 = time.perf_counter()
    n = 0

    def record(source: str, out: Outcome, ops: Any = "") -> None:
        nonlocal peak
        kinds[out.kind if out.ok else "other"] += 1
        by_source[source][out.kind if out.ok else "other"] += 1
        slowest.append((out.wall_s, out.name))
        slowest.sort(reverse=True)
        del slowest[5:]
        peak = max(peak, out.peak_rss or 0)
        if not out.ok:
            others.append(f"{out.describe()} {ops}")
            print(f"  ANYTHING ELSE: {others[-1]}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="gpudiag-fuzz-") as tmp_s:
        tmp = Path(tmp_s)
        for c in CASES:
            d = tmp / c.name
            d.mkdir()
            paths = c.build(d)
            out = run_case(c.name, d, paths)
            record("hand-made", out)
            if c.cli or n % ns.cli_every == 0:
                cli[_cli(d, paths, c.name, others)] += 1
            _restore_modes(d)
            shutil.rmtree(d)
            n += 1
        bases = load_bases(ns.shared / "kineto")
        base_run = run_dir(tmp / "base")
        streams = [
            ("kineto", mutants(bases, ns.seed, counts["kineto"])),
            ("nsys", nsys_mutants(ns.shared, ns.seed, counts["nsys"])),
            ("run", run_dir_mutants(base_run, ns.seed, counts["run"])),
        ]
        for source, stream in streams:
            for m in stream:
                d = tmp / m.name
                d.mkdir()
                paths = _write(d, m.files)
                out = run_case(m.name, d, paths)
                record(source, out, m.ops)
                if n % ns.cli_every == 0:
                    cli[_cli(d, paths, m.name, others)] += 1
                _restore_modes(d)
                shutil.rmtree(d)
                n += 1
                if n % 1000 == 0:
                    print(
                        f"  {n} cases, {time.perf_counter() - t0:.0f} s, {dict(kinds)}",
                        file=sys.stderr,
                        flush=True,
                    )
    wall = time.perf_counter() - t0
    summary = {
        "cases": n,
        "seed": ns.seed,
        "wall_s": round(wall, 1),
        "diagnoses": kinds["diagnosis"],
        "clean_errors": kinds["error"],
        "anything_else": kinds["other"],
        "by_source": {k: dict(v) for k, v in by_source.items()},
        "cli_cases": dict(cli),
        "peak_rss_mb": round(peak / 1e6),
        "slowest": [(round(s, 2), name) for s, name in slowest],
        "failures": others[:50],
    }
    print(json.dumps(summary, indent=2))
    if ns.json:
        ns.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if others else 0


def _cli(d: Path, paths: list[Path], name: str, others: list[str]) -> str:
    out = run_cli_case(name, d, ["analyze", *map(str, paths), "-f", "json"])
    if not out.ok:
        others.append("CLI " + out.describe())
        return "other"
    return out.kind


if __name__ == "__main__":
    sys.exit(main())
