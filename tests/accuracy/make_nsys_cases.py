"""Hand-built Nsight Systems exports whose right answer is known by construction.

The tables' definitions (columns, types, NOT NULL constraints) and the export metadata are
copied from a real shared export (``ai-profiler/baseline_nvtx.sqlite``, schema 3.7.2); the
rows are written here with exact timings, so that what gpudiag should say follows from
arithmetic on the timeline below, not from gpudiag.

Every case is a single-GPU training loop of ``steps`` iterations on one process (pid
1000, training thread 1000). An iteration:

* an NVTX range ``step i`` of 10 ms on the training thread, with nested ``forward`` and
  ``backward`` ranges; inside it 8 kernels of 1 ms on stream 7, launched at its start;
* then a gap until the next range opens (``gap_ms``), in which the training thread is
  blocked in ``pthread_cond_timedwait`` (OS runtime trace) — a ``for batch in loader:``
  loop waiting for its DataLoader.

Variants: ``dali`` — a decoding thread (1001) runs kernels on stream 9 for all but the
first and last 0.5 ms of each gap (the GPU is busy: not data-wait); ``warmup`` — step 0's
kernels take 24 ms each (autotuning); ``epochs`` — the iterations are wrapped in
``epoch N`` ranges of several steps each; ``launch_bound`` — no gap, and the 8 kernels of
1 ms become 400 kernels of 10 µs each launched every 25 µs (the GPU idles 15 µs between
them while the host launches).

``python tests/accuracy/make_nsys_cases.py OUT_DIR`` writes every case; the tests build
them in a temporary directory.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testpaths import SHARED_TRACES

SHARED = SHARED_TRACES / "nsys"
TEMPLATE = SHARED / "ai-profiler" / "baseline_nvtx.sqlite"
TABLES = (
    "StringIds",
    "META_DATA_EXPORT",
    "TARGET_INFO_GPU",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "NVTX_EVENTS",
    "OSRT_API",
)
MS = 1_000_000
US = 1_000
PID, MAIN, DECODER = 1000, 1000, 1001
BASE = 10_000 * MS


@dataclass(frozen=True)
class Case:
    """One hand-built export and the numbers it is built to show."""

    name: str
    steps: int = 20
    gap_ms: float = 15.0
    dali: bool = False
    warmup: bool = False
    epochs: int = 0
    launch_bound: bool = False


CASES = {
    c.name: c
    for c in (
        Case("user_steps_loader"),
        Case("user_steps_dali", dali=True),
        Case("user_steps_warmup", warmup=True),
        Case("user_steps_epochs", steps=21, epochs=3),
        Case("launch_bound", gap_ms=0.0, launch_bound=True),
    )
}


def gtid(tid: int) -> int:
    """Nsight's globalTid: the process id above bit 24, the thread id below."""
    return (PID << 24) | tid


class Writer:
    """Rows into a new export whose tables are defined as in the template."""

    def __init__(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self.con = sqlite3.connect(path)
        src = sqlite3.connect(f"file:{TEMPLATE}?mode=ro", uri=True)
        for t in TABLES:
            (sql,) = src.execute("SELECT sql FROM sqlite_master WHERE name = ?", (t,)).fetchone()
            self.con.execute(sql)
        for t in ("META_DATA_EXPORT", "TARGET_INFO_GPU"):
            rows = src.execute(f"SELECT * FROM {t}").fetchall()
            marks = ",".join("?" * len(rows[0]))
            self.con.executemany(f"INSERT INTO {t} VALUES ({marks})", rows)
        self.template = {
            t: dict(
                zip(
                    [c[1] for c in src.execute(f"PRAGMA table_info({t})")],
                    src.execute(f"SELECT * FROM {t} LIMIT 1").fetchone(),
                    strict=True,
                )
            )
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API")
        }
        src.close()
        self.strings: dict[str, int] = {}
        self.corr = 0

    def sid(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
            self.con.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[text], text))
        return self.strings[text]

    def _insert(self, table: str, **values: object) -> None:
        row = {**self.template.get(table, {}), **values}
        cols = ", ".join(f'"{c}"' for c in row)
        self.con.execute(
            f"INSERT INTO {table} ({cols}) VALUES ({','.join('?' * len(row))})", list(row.values())
        )

    def kernel(
        self,
        start: int,
        dur: int,
        launch_at: int,
        tid: int,
        stream: int,
        name: str = "volta_sgemm_128x64_nn",
    ) -> None:
        self.corr += 1
        self._insert(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            start=launch_at,
            end=launch_at + 5 * US,
            globalTid=gtid(tid),
            correlationId=self.corr,
            nameId=self.sid("cudaLaunchKernel_v7000"),
        )
        n = self.sid(name)
        self._insert(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            start=start,
            end=start + dur,
            deviceId=0,
            streamId=stream,
            correlationId=self.corr,
            globalPid=PID << 24,
            demangledName=n,
            shortName=n,
            mangledName=None,
        )

    def nvtx(self, text: str, start: int, end: int, tid: int = MAIN) -> None:
        self.con.execute(
            'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId) '
            "VALUES (?, ?, 59, ?, ?, 0)",
            (start, end, text, gtid(tid)),
        )

    def blocked(self, call: str, start: int, end: int, tid: int = MAIN) -> None:
        self._insert("OSRT_API", start=start, end=end, globalTid=gtid(tid), nameId=self.sid(call))

    def close(self) -> None:
        self.con.commit()
        self.con.close()


def build(case: Case, out: Path) -> Path:
    """Write one case's export to ``out/<name>.sqlite``."""
    path = out / f"{case.name}.sqlite"
    w = Writer(path)
    t = BASE
    per_epoch = case.steps // case.epochs if case.epochs else 0
    for i in range(case.steps):
        busy = 24 * MS if case.warmup and i == 0 else 1 * MS
        n_k, k_dur, k_gap = (400, 10 * US, 25 * US) if case.launch_bound else (8, busy, busy)
        length = max(10 * MS, n_k * k_gap + MS)
        if case.epochs and i % per_epoch == 0:
            w.nvtx(f"epoch {i // per_epoch}", t, t + per_epoch * int((10 + case.gap_ms) * MS) - 1)
        w.nvtx(f"step {i}", t, t + length)
        w.nvtx("forward", t, t + length // 2)
        w.nvtx("backward", t + length // 2, t + length - MS // 2)
        for k in range(n_k):
            launch = t + k * (k_gap if case.launch_bound else 50 * US)
            w.kernel(t + MS // 2 + k * k_gap, k_dur, launch, MAIN, 7)
        t += length
        gap = int(case.gap_ms * MS)
        if gap:
            w.blocked("pthread_cond_timedwait", t + 50 * US, t + gap - 50 * US)
            if case.dali:
                for k in range(int(case.gap_ms) - 1):
                    w.kernel(t + MS // 2 + k * MS, MS, t + k * MS, DECODER, 9, "dali_decode")
            t += gap
    w.close()
    return path


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    out.mkdir(parents=True, exist_ok=True)
    for case in CASES.values():
        print(build(case, out))


if __name__ == "__main__":
    main()
