"""Hand-built traces for shapes the shared sets lack, each with its answer known by construction.

Kineto traces (``<name>.json``; times in µs, one rank, ``ProfilerStep#N`` of 10 ms):

* ``deepep``: an expert-parallel step. Stream 7 computes a GEMM [0.5, 4.5) ms and a
  ``moe::dev::finalize::combineKernel`` [4.5, 5.0) ms (a *compute* kernel named "combine");
  stream 20 runs DeepEP's ``notify_dispatch`` [0.5, 0.7), ``dispatch`` [0.7, 2.7) and
  ``combine`` [4.0, 6.0). Per step: compute 4.5 ms, communication 4.2 ms of which 1.0 ms
  exposed ([5.0, 6.0)) and 3.2 ms overlapped, GPU idle 4.5 ms.
* ``multimem``: as b200x8_r0_infer: a GEMM [0.5, 6.5) and torch's
  ``multimem_all_reduce_kernel`` [6.5, 8.0) on the same stream 7. Per step: compute 6 ms,
  comm-wait 1.5 ms, GPU idle 2.5 ms.
* ``complete`` / ``sampled``: 4 steps of 400 operators (External ids 1, 2, 3 …), each
  launching one 10 µs kernel; ``sampled`` keeps every 20th operator and launch, as an
  event-sampling filter does.
* ``cpu_view``: ``deepep``'s host side only (8 GPUs in ``deviceProperties``, ``nccl:*``
  ranges, ``aten::_local_scalar_dense``), no GPU event.
* ``comm_only``: four steps whose GPU work is only NCCL kernels.
* ``short``: one 9.3 ms step with 14 kernels.
* ``bad_times``: ``multimem`` plus a kernel at ``ts`` −1e308 and one ending at INT64_MAX ns:
  2 events to drop, with their reason.

Nsight exports (``<name>.sqlite``; tables defined as in the shared ai-profiler export, MPI
table as in the jacobi-mpi one), 10 steps ``step i`` of 10 ms on one process:

* ``deepep_nsys``: per step a GEMM [0.5, 4.5) ms and a ``combineKernel`` [4.5, 5.0) on
  stream 7, DeepEP's ``combine`` [4.0, 6.0) on stream 20 — short names ``combine`` and
  ``combineKernel``, the namespace only in ``demangledName``. Per step: comm-wait 1.0 ms,
  overlapped 1.0 ms.
* ``mpi``: per step a 4 ms kernel, then an NVTX ``MPI`` range [5, 8) ms around Nsight MPI
  rows ``MPI_Sendrecv`` [5, 7) and ``MPI_Allreduce`` [7.2, 8); ``MPI_Init`` (2 s) before the
  first step. Per step: comm-wait 3 ms (MPI), compute 4 ms; MPI_Init is not communication.
* ``clock_plus`` / ``clock_minus``: per step a 4 ms kernel and a blocking ``cudaMemcpy``
  (DtoH, 1 ms, inside its call) — with every GPU row shifted by +325 ms / −129 ms (the GPU
  clock offset of old ``.qdrep`` exports). Corrected, they read like ``clock_none``.
* ``clock_drift``: the offset grows by 20 ms a step: no single offset fits, the split is
  refused.

``python tests/accuracy/make_evidence_cases.py OUT_DIR`` writes every case.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import make_nsys_cases as nc

STEP_US = 10_000
PID = TID = 4000
H800 = {
    "id": 0,
    "name": "NVIDIA H800",
    "totalGlobalMem": 85_000_000_000,
    "computeMajor": 9,
    "computeMinor": 0,
    "numSms": 132,
}
DEEPEP = {
    "notify": "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, "
    "int*, int, int, int, int, int const*, int*, int*, int, void**, int**, int)",
    "dispatch": "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, "
    "long*, float*, int*, int*, int4 const*, float const*, long const*, float const*, "
    "bool const*, int const*, int, int, int, int, int, int, int, void**, int, int, int)",
    "combine": "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(__nv_bfloat16*, "
    "float*, __nv_bfloat16 const*, float const*, __nv_bfloat16 const*, __nv_bfloat16 const*, "
    "int const*, int const*, int const*, int const*, int, int, int, int, void**, int, int, int)",
}
DECOY = "void moe::dev::finalize::combineKernel<float, 4>(moe::dev::finalize::KernelParams)"
MULTIMEM = (
    "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
    "(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)"
)
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"


class Kineto:
    """Events of one rank with running correlation and External ids."""

    def __init__(self) -> None:
        self.ev: list[dict[str, Any]] = [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": PID,
                "tid": TID,
                "args": {"name": "pt_main_thread"},
            },
        ]
        self.corr = 1
        self.ext = 1

    def x(
        self, cat: str, name: str, pid: Any, tid: Any, ts: float, dur: float, **args: Any
    ) -> None:
        e: dict[str, Any] = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": ts,
            "dur": dur,
        }
        if args:
            e["args"] = args
        self.ev.append(e)

    def op(self, name: str, ts: float, dur: float) -> int:
        ext = self.ext
        self.ext += 1
        self.x("cpu_op", name, PID, TID, ts, dur, **{"External id": ext})
        return ext

    def kernel(
        self, name: str, ts: float, dur: float, at: float, stream: int = 7, ext: int | None = None
    ) -> None:
        corr = self.corr
        self.corr += 1
        self.x("cuda_runtime", "cudaLaunchKernel", PID, TID, at, 5, correlation=corr)
        args: dict[str, Any] = {"correlation": corr, "device": 0, "stream": stream}
        if ext is not None:
            args["External id"] = ext
        self.x("kernel", name, 0, stream, ts, dur, **args)

    def step(self, n: int, ts: float) -> None:
        self.x("user_annotation", f"ProfilerStep#{n}", PID, TID, ts, STEP_US)

    def doc(self, devices: int = 1, backend: str = "nccl") -> dict[str, Any]:
        return {
            "schemaVersion": 1,
            "deviceProperties": [dict(H800, id=i) for i in range(devices)],
            "distributedInfo": {"backend": backend, "rank": 0, "world_size": 8},
            "traceEvents": self.ev,
        }


T0 = 1_700_000_000_000_000  # epoch µs


def deepep(gpu: bool = True) -> dict[str, Any]:
    k = Kineto()
    for i in range(4):
        t = T0 + i * STEP_US
        k.step(i + 1, t)
        k.x("user_annotation", "nccl:all_to_all", PID, TID, t + 100, 50)
        k.op("aten::_local_scalar_dense", t + 9_000, 200)
        if not gpu:
            k.op("aten::mm", t + 50, 300)
            continue
        k.kernel(GEMM, t + 500, 4_000, t + 50, 7, k.op("aten::mm", t + 50, 300))
        k.kernel(DECOY, t + 4_500, 500, t + 60, 7, k.op("moe::finalize", t + 400, 30))
        k.kernel(DEEPEP["notify"], t + 500, 200, t + 70, 20)
        k.kernel(DEEPEP["dispatch"], t + 700, 2_000, t + 80, 20)
        k.kernel(DEEPEP["combine"], t + 4_000, 2_000, t + 90, 20)
    return k.doc(devices=8)


def multimem() -> dict[str, Any]:
    k = Kineto()
    for i in range(4):
        t = T0 + i * STEP_US
        k.step(i + 1, t)
        k.kernel(GEMM, t + 500, 6_000, t + 50, 7, k.op("aten::mm", t + 50, 300))
        k.kernel(MULTIMEM, t + 6_500, 1_500, t + 400, 7, k.op("symm_mem::all_reduce", t + 400, 30))
    return k.doc()


def sampled(every: int = 1) -> dict[str, Any]:
    k = Kineto()
    n = 0
    for i in range(4):
        t = T0 + i * STEP_US
        k.step(i + 1, t)
        for j in range(400):
            at = t + 100 + j * 22
            n += 1
            ext = k.op("aten::add", at, 30)
            if n % every == 0:
                k.kernel("elementwise_kernel", at + 20, 10, at + 5, 7, ext)
    if every > 1:  # what an event-sampling filter keeps: every n-th operator and launch
        kept = []
        for e in k.ev:
            args = e.get("args") or {}
            x = args.get("External id")
            if e.get("cat") == "cpu_op" and isinstance(x, int) and x % every:
                continue
            kept.append(e)
        k.ev = kept
    return k.doc()


def comm_only() -> dict[str, Any]:
    k = Kineto()
    for i in range(4):
        t = T0 + i * STEP_US
        k.step(i + 1, t)
        k.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 1_000, 3_000, t + 50, 20)
    return k.doc()


def short() -> dict[str, Any]:
    k = Kineto()
    k.x("user_annotation", "ProfilerStep#1", PID, TID, T0, 9_300)
    for j in range(14):
        k.kernel(
            "Cijk_Ailk_Bljk_SB_MT64x64x16",
            T0 + 200 + j * 600,
            60,
            T0 + 100 + j * 600,
            0,
            k.op("aten::mm", T0 + 100 + j * 600, 50),
        )
    return k.doc()


def bad_times() -> dict[str, Any]:
    d = multimem()
    d["traceEvents"].append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": GEMM,
            "pid": 0,
            "tid": 7,
            "ts": -1e308,
            "dur": 10,
            "args": {"device": 0, "stream": 7},
        }
    )
    end_us = (2**63 - 1) / 1000
    d["traceEvents"].append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": GEMM,
            "pid": 0,
            "tid": 7,
            "ts": T0 + 100,
            "dur": end_us - (T0 + 100),
            "args": {"device": 0, "stream": 7},
        }
    )
    return d


KINETO = {
    "deepep": deepep,
    "multimem": multimem,
    "complete": sampled,
    "sampled": lambda: sampled(20),
    "cpu_view": lambda: deepep(gpu=False),
    "comm_only": comm_only,
    "short": short,
    "bad_times": bad_times,
}


# ---- Nsight exports ---------------------------------------------------------------------

MS, US = nc.MS, nc.US
JACOBI = Path(nc.SHARED) / "jacobi-mpi" / "report1.sqlite"


class Writer(nc.Writer):
    """make_nsys_cases' writer plus blocking copies and Nsight's MPI trace table."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        src = sqlite3.connect(f"file:{JACOBI}?mode=ro", uri=True)
        (sql,) = src.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'MPI_OTHER_EVENTS'"
        ).fetchone()
        src.close()
        self.con.execute(sql)

    def signed_kernel(
        self, start: int, dur: int, launch_at: int, stream: int, short: str, signature: str
    ) -> None:
        """A kernel whose short name (``dispatch``) differs from its demangled signature."""
        self.kernel(start, dur, launch_at, nc.MAIN, stream, short)
        self.con.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = ? WHERE correlationId = ?",
            (self.sid(signature), self.corr),
        )

    def mpi(self, call: str, start: int, end: int) -> None:
        self.con.execute(
            'INSERT INTO MPI_OTHER_EVENTS (start, "end", globalTid, textId) VALUES (?, ?, ?, ?)',
            (start, end, nc.gtid(nc.MAIN), self.sid(call)),
        )

    def sync_copy(self, start: int, dur: int, call_start: int, call_end: int) -> None:
        self.corr += 1
        self._insert(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            start=call_start,
            end=call_end,
            globalTid=nc.gtid(nc.MAIN),
            correlationId=self.corr,
            nameId=self.sid("cudaMemcpy_v3020"),
        )
        self.con.execute(
            'INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, "end", deviceId, contextId, '
            "streamId, correlationId, globalPid, bytes, copyKind, srcKind, dstKind) "
            "VALUES (?, ?, 0, 1, 7, ?, ?, 4096, 2, 2, 0)",
            (start, start + dur, self.corr, nc.PID << 24),
        )

    def shift_gpu(self, shift: Any) -> None:
        """Move every GPU row by ``shift(start)`` ns: a GPU clock offset from the host's."""
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
            rows = self.con.execute(f'SELECT rowid, start, "end" FROM {t}').fetchall()
            for rowid, s, e in rows:
                d = shift(s)
                self.con.execute(
                    f'UPDATE {t} SET start = ?, "end" = ? WHERE rowid = ?', (s + d, e + d, rowid)
                )


def nsys_mpi(out: Path) -> Path:
    path = out / "mpi.sqlite"
    w = Writer(path)
    t = nc.BASE
    w.mpi("MPI_Init", t - 2_500 * MS, t - 500 * MS)
    for i in range(10):
        w.nvtx(f"step {i}", t, t + 10 * MS)
        w.kernel(t + MS // 2, 4 * MS, t + 50 * US, nc.MAIN, 7)
        w.nvtx("MPI", t + 5 * MS, t + 8 * MS)
        w.mpi("MPI_Sendrecv", t + 5 * MS, t + 7 * MS)
        w.mpi("MPI_Allreduce", t + 7 * MS + 200 * US, t + 8 * MS)
        t += 10 * MS
    w.mpi("MPI_Finalize", t + 100 * MS, t + 900 * MS)
    w.close()
    return path


def nsys_clock(out: Path, name: str, offset_ms: float, drift_ms: float = 0.0) -> Path:
    path = out / f"{name}.sqlite"
    w = Writer(path)
    t = nc.BASE
    for i in range(10):
        w.nvtx(f"step {i}", t, t + 10 * MS)
        w.kernel(t + MS // 2, 4 * MS, t + 50 * US, nc.MAIN, 7)
        # the copy waits for the kernel on stream 7, then runs 1 ms inside its blocking call
        w.sync_copy(t + 4_510 * US, MS, t + 100 * US, t + 5_530 * US)
        t += 10 * MS

    def shift(start: int) -> int:
        return int(offset_ms * MS + drift_ms * MS * ((start - nc.BASE) // (10 * MS)))

    if offset_ms or drift_ms:
        w.shift_gpu(shift)
    w.close()
    return path


def nsys_deepep(out: Path) -> Path:
    path = out / "deepep_nsys.sqlite"
    w = Writer(path)
    t = nc.BASE
    for i in range(10):
        w.nvtx(f"step {i}", t, t + 10 * MS)
        w.signed_kernel(t + MS // 2, 4 * MS, t + 50 * US, 7, "gemm", GEMM)
        w.signed_kernel(t + 4_500 * US, MS // 2, t + 60 * US, 7, "combineKernel", DECOY)
        w.signed_kernel(t + 4 * MS, 2 * MS, t + 70 * US, 20, "combine", DEEPEP["combine"])
        t += 10 * MS
    w.close()
    return path


NSYS = {
    "deepep_nsys": nsys_deepep,
    "mpi": nsys_mpi,
    "clock_none": lambda out: nsys_clock(out, "clock_none", 0.0),
    "clock_plus": lambda out: nsys_clock(out, "clock_plus", 325.0),
    "clock_minus": lambda out: nsys_clock(out, "clock_minus", -129.0),
    "clock_drift": lambda out: nsys_clock(out, "clock_drift", 0.0, 20.0),
}


# ---- Multi-rank Kineto: a warm-up step's skew -------------------------------------------

ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


@dataclass(frozen=True)
class Skew:
    """Two ranks, ``steps`` ProfilerSteps, each one compute kernel then one all_reduce.

    Rank r's compute kernel (``compute_us``; ``warm_compute_us`` in step 0, the warm-up
    step) starts ``late_us(r, step)`` after the rank's step offset; its all_reduce kernel is
    launched when that kernel ends and ends ``transfer_us`` after the last rank entered it
    (NCCL's kernel spins until every rank is in). Step 0 lasts ``warm_step_us``; every
    later step ``compute_us + max late + transfer_us + tail_us``.
    """

    warm_late_us: float  # rank 1's delay in step 0
    late_us_by_step: tuple[float, ...]  # rank 1's delay in steps 1 …; rank 0 is never late
    steps: int = 6
    compute_us: float = 10_000.0
    warm_compute_us: float = 600_000.0
    warm_step_us: float = 1_000_000.0
    transfer_us: float = 5_000.0
    tail_us: float = 4_500.0
    lead_us: float = 500.0

    def late(self, rank: int, step: int) -> float:
        """Rank ``rank``'s delay before its compute kernel in ``step``."""
        if rank == 0:
            return 0.0
        return self.warm_late_us if step == 0 else self.late_us_by_step[step - 1]

    def step_us(self, step: int) -> float:
        """Step ``step``'s length (the same on both ranks)."""
        if step == 0:
            return self.warm_step_us
        return self.lead_us + self.compute_us + self.late(1, step) + self.transfer_us + self.tail_us

    def sync_wait_us(self, step: int) -> float:
        """Rank 0's wait for rank 1 inside the step's all_reduce (rank 1 waits for nobody)."""
        return self.late(1, step)

    def comm_us(self, rank: int, step: int) -> float:
        """Rank ``rank``'s all_reduce kernel: the others' lateness over its own, plus transfer."""
        return self.late(1, step) - self.late(rank, step) + self.transfer_us


#: ``warm_straggler``: rank 1 150 ms late into step 0's all_reduce only (a 1 s warm-up
#: step, 50× the 20 ms steps after it); steps 1–5 within 0.5 ms (rank 1 later by 0.1–0.5).
#: ``every_straggler``: the same warm-up, and rank 1 150 ms late in every step (170 ms
#: steps: the 1 s step is still warm-up, 5.9×). ``warm_imbalance``: rank 1 300 ms late in
#: step 0 only; steps 1–5 with rank 1 later by 0.2–0.4 ms into a 5 ms transfer.
SKEW = {
    "warm_straggler": Skew(150_000.0, (100.0, 300.0, 500.0, 200.0, 400.0)),
    "every_straggler": Skew(150_000.0, (150_000.0,) * 5),
    "warm_imbalance": Skew(300_000.0, (200.0, 300.0, 400.0, 300.0, 200.0)),
}


def skew_rank(c: Skew, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s trace of case ``c``."""
    k = Kineto()
    t = float(T0)
    for n in range(c.steps):
        k.x("user_annotation", f"ProfilerStep#{n}", PID, TID, t, c.step_us(n))
        start = t + c.lead_us + c.late(rank, n)
        comp = c.warm_compute_us if n == 0 else c.compute_us
        k.kernel(GEMM, start, comp, start - 50, 7, k.op("aten::mm", start - 60, 20))
        enter = start + comp
        ext = k.op("nccl:all_reduce", enter - 40, 20)
        k.kernel(ALLREDUCE, enter, c.comm_us(rank, n), enter - 30, 20, ext)
        t += c.step_us(n)
    doc = k.doc(devices=2)
    doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return doc


def skew_case(out: Path, name: str) -> Path:
    """Write case ``name`` of ``SKEW`` as out/name/rank-<r>.json; the folder."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        (folder / f"rank-{r}.json").write_text(json.dumps(skew_rank(SKEW[name], r)))
    return folder


def build_all(out: Path) -> dict[str, Path]:
    """Write every case into ``out``; name → path."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, make in KINETO.items():
        p = out / f"{name}.json"
        p.write_text(json.dumps(make()))
        paths[name] = p
    for name, build in NSYS.items():
        paths[name] = build(out)
    for name in SKEW:
        paths[name] = skew_case(out, name)
    return paths


def main() -> None:
    for p in build_all(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")).values():
        print(p)


if __name__ == "__main__":
    main()
