"""nsys SQLite export (stdlib sqlite3) → Intervals; maps CUDA/NCCL/NVTX tables to kinds.

One export may hold several profiled processes (``nsys profile torchrun …``): each process
with GPU activity becomes one :class:`~gpudiag.traces.schema.RankTimeline`. The SQL lives
in :mod:`.sql`, reports and ``nsys export`` in :mod:`.export`; this module maps rows to
columns (Python only looks at the *distinct* names and a few metadata rows) and hands each
process to the loader core (:func:`gpudiag.traces.core.rank_builder.build_rank`), which applies the
naming, training-thread and step rules shared with the Kineto loader.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np

from gpudiag.errors import InputError
from gpudiag.traces.core.common import (
    LoadOptions,
    NamePatterns,
    RawColumns,
    check_rank,
    rank_from_filename,
)
from gpudiag.traces.core.rank_builder import build_rank
from gpudiag.traces.nsys.database import (
    I64A,
    RANK_VARS,
    SIZE_VARS,
    Export,
    check_schema,
    corrupt,
    resolve_tables,
)
from gpudiag.traces.nsys.export import (
    HEADER_MAGIC,
    REPORT_SUFFIXES,
    export_report,
    find_nsys,
    report_version,
    resolve_report,
)
from gpudiag.traces.nsys.holds import range_timelines
from gpudiag.traces.nsys.sql import (
    gpu_metrics,
    gpu_names,
    gpu_props,
    gpu_rows,
    nvtx_rows,
    osrt_rows,
    pieces,
    runtime_rows,
    strings,
    thread_ranks,
)
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

MEMCPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}
# CUPTI memory kinds (srcKind, dstKind), named as Kineto does: "Memcpy HtoD (Pinned -> Device)"
MEM_KINDS = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device",
    6: "Managed",
    7: "Unknown",
}


def memcpy_name(code: int) -> str:
    """``Memcpy HtoD`` from a copy kind; with its memory kinds (sql.py packs them above 255)."""
    kind = MEMCPY_KINDS.get(code & 255 if code >= 256 else code, str(code & 255))
    if code < 256:
        return f"Memcpy {kind}"
    src, dst = MEM_KINDS.get((code >> 8) & 15, "Unknown"), MEM_KINDS.get(code >> 12, "Unknown")
    return f"Memcpy {kind} ({src} -> {dst})"


NO_NVTX_HINT = (
    "the export has no NVTX ranges: capture with `nsys profile -t cuda,nvtx` and "
    "mark steps with torch.cuda.nvtx.range or `gpudiag run`"
)
_EMPTY = np.zeros(0, np.int64)

__all__ = [
    "HEADER_MAGIC",
    "REPORT_SUFFIXES",
    "export_report",
    "find_nsys",
    "load_nsys",
    "report_version",
    "resolve_report",
    "resolve_tables",
]


def load_nsys(
    path: Path, *, options: LoadOptions | None = None, source: str | None = None
) -> list[RankTimeline]:
    """Load an nsys SQLite export: one RankTimeline per profiled process with GPU work.

    ``source`` names the input in reports (the ``.nsys-rep`` an export was made from).
    """
    path = Path(path)
    ex = Export(path)
    try:
        return _load(ex, NamePatterns(options or LoadOptions()), source or str(path))
    except (sqlite3.Error, UnicodeDecodeError) as e:
        # DatabaseError (malformed pages), OperationalError, …; and an error message that
        # quotes a damaged schema in bytes that are not UTF-8 fails to decode itself.
        raise corrupt(path, e) from e
    finally:
        ex.close()


class _Rows:
    """The export's rows on one clock, and one deduplicated name list for the file."""

    def __init__(self, ex: Export, notes: list[str], patterns: NamePatterns) -> None:
        by_pid = "globalPid" in ex.cols("CUPTI_ACTIVITY_KIND_KERNEL")
        self.gpu = gpu_rows(ex)
        if not len(self.gpu):
            raise InputError(
                ex.path,
                "export holds no GPU kernels, copies or memsets",
                "was the capture window empty? profile with `nsys profile -t cuda,nvtx …`",
            )
        self.rt = runtime_rows(ex, by_pid)
        self.nv, nv_names = nvtx_rows(ex, by_pid)
        self.os = osrt_rows(ex, by_pid)
        self._shift(notes)
        self._name(ex, nv_names)
        self._comm_by_signature(ex, patterns)

    def _comm_by_signature(self, ex: Export, patterns: NamePatterns) -> None:
        """Kernels whose demangled signature is communication (DeepEP by namespace)."""
        kern = np.flatnonzero((self.gkind == Kind.COMPUTE) & (self.gpu[:, 9] >= 0))
        if not kern.size:
            return
        found = strings(ex, np.unique(self.gpu[kern, 9]))
        rx = patterns.rx[NamePatterns.COMM_KERNEL]
        comm = [k for k, v in found.items() if rx.search(v)]
        if comm:
            hit = kern[np.isin(self.gpu[kern, 9], comm)]
            self.gkind[hit] = Kind.COMM

    def _shift(self, notes: list[str]) -> None:
        """Launch times of -1 mean "unknown" downstream: keep real times non-negative."""
        gpu, rt, nv, os_ = self.gpu, self.rt, self.nv, self.os
        lo = min([int(a[:, 2].min()) for a in (rt, nv, os_) if len(a)] + [int(gpu[:, 4].min())])
        if lo < 0:
            gpu[:, [4, 5]] -= lo
            gpu[gpu[:, 8] != -1, 8] -= lo
            rt[:, [2, 3]] -= lo
            nv[:, [2, 3]] -= lo
            os_[:, [2, 3]] -= lo
            notes.append(f"times shifted by {-lo} ns: the export has negative timestamps")

    def _name(self, ex: Export, nv_names: list[str]) -> None:
        gpu, rt, nv = self.gpu, self.rt, self.nv
        kern = gpu[:, 0] == Kind.COMPUTE
        found = strings(ex, np.concatenate([gpu[kern, 6], rt[:, 4], self.os[:, 4]]))
        sid_keys = np.array(sorted(found), dtype=np.int64)
        copy_kinds = sorted(set(gpu[gpu[:, 0] == Kind.MEMCPY, 6].tolist()))
        raw_names = (
            [found[k] for k in sid_keys.tolist()]
            + [re.sub(r"_v\d+$", "", found[k]) for k in sid_keys.tolist()]
            + [memcpy_name(k) for k in copy_kinds]
            + ["Memset", "(unnamed)"]
            + nv_names
        )
        uniq, inv = np.unique(np.array(raw_names, dtype=object), return_inverse=True)
        inv = inv.reshape(-1).astype(np.int64)
        self.names = [str(x) for x in uniq]
        n_sid = len(sid_keys)
        off_cp = 2 * n_sid
        off_ms = off_cp + len(copy_kinds)
        unnamed = int(inv[off_ms + 1])

        def sid_index(col: I64A, offset: int) -> I64A:
            pos = np.searchsorted(sid_keys, col)
            pos_c = np.minimum(pos, max(n_sid - 1, 0))
            hit = (sid_keys[pos_c] == col) if n_sid else np.zeros(len(col), bool)
            out = np.full(len(col), unnamed, np.int64)
            out[hit] = inv[offset + pos_c[hit]]
            return out

        self.gname = np.full(len(gpu), unnamed, np.int64)
        self.gname[kern] = sid_index(gpu[kern, 6], 0)
        cp = gpu[:, 0] == Kind.MEMCPY
        if copy_kinds:
            self.gname[cp] = inv[off_cp + np.searchsorted(np.array(copy_kinds), gpu[cp, 6])]
        self.gname[gpu[:, 0] == Kind.MEMSET] = inv[off_ms]
        self.rname = sid_index(rt[:, 4], n_sid)
        self.oname = sid_index(self.os[:, 4], 0)
        self.nname = inv[off_ms + 2 + nv[:, 4]] if len(nv) else np.zeros(0, np.int64)
        # coarse kinds: copies are copies (peer-to-peer ones too: a copy engine moves the
        # data, as in Kineto's ``Memcpy PtoP``); NCCL/MPI domain ranges and MPI calls comm
        self.gkind = gpu[:, 0].copy()
        self.nkind = np.where(nv[:, 5] != 0, int(Kind.COMM), int(Kind.ANNOTATION))

    def process(self, gi: I64A, ri: I64A, ni: I64A, oi: I64A) -> RawColumns:
        """Columns of one process: GPU lanes ``gpu:<dev>:<stream>``, host lanes ``cpu:<tid>``."""
        gpu, rt, nv, os_ = self.gpu[gi], self.rt[ri], self.nv[ni], self.os[oi]
        gkey = (gpu[:, 2] << 32) | (gpu[:, 3] & 0xFFFFFFFF)
        gl, glane = np.unique(gkey, return_inverse=True)
        hl, hlane = np.unique(np.concatenate([rt[:, 1], nv[:, 1], os_[:, 1]]), return_inverse=True)
        lanes = [f"gpu:{int(k) >> 32}:{int(k) & 0xFFFFFFFF}" for k in gl.tolist()]
        lanes += [f"cpu:{int(t)}" for t in hl.tolist()]
        ng, nr, no = len(gpu), len(rt), len(os_)
        used, name_local = np.unique(
            np.concatenate([self.gname[gi], self.rname[ri], self.nname[ni], self.oname[oi]]),
            return_inverse=True,
        )
        gkind = self.gkind[gi]
        launch = np.full(ng + nr + len(nv) + no, -1, np.int64)
        launch[:ng] = gpu[:, 8]
        nbytes = np.full(len(launch), -1, np.int64)
        nbytes[:ng] = np.where(gkind == Kind.COMPUTE, -1, gpu[:, 7])
        kinds = [
            gkind,
            np.full(nr, int(Kind.RUNTIME), np.int64),
            self.nkind[ni],
            np.full(no, int(Kind.OS_WAIT), np.int64),
        ]
        return RawColumns(
            start_ns=np.concatenate([gpu[:, 4], rt[:, 2], nv[:, 2], os_[:, 2]]),
            end_ns=np.concatenate([gpu[:, 5], rt[:, 3], nv[:, 3], os_[:, 3]]),
            kind=np.concatenate(kinds),
            lane=np.concatenate([glane.reshape(-1), len(gl) + hlane.reshape(-1)]),
            name=name_local.reshape(-1).astype(np.int64),
            lanes=lanes,
            names=[self.names[i] for i in used.tolist()],
            launch_ns=launch,
            nbytes=nbytes,
        )


def _load(ex: Export, patterns: NamePatterns, source: str) -> list[RankTimeline]:
    era, notes = check_schema(ex, ex.meta())
    if not ex.table("CUPTI_ACTIVITY_KIND_KERNEL"):  # NVTX ranges only (check_schema)
        return range_timelines(ex, patterns, source, era, notes + ex.notes)
    rows = _Rows(ex, notes, patterns)
    notes += ex.notes
    gp, rp, npc = pieces(rows.gpu, 1), pieces(rows.rt, 0), pieces(rows.nv, 0)
    opc = pieces(rows.os, 0)
    pids = sorted(gp, key=lambda p: (int(gp[p][:, 2].min()), p))
    env = ex.env()
    threads = thread_ranks(ex)
    file_rank = rank_from_filename(Path(source))
    if file_rank is not None:
        file_rank = check_rank(
            file_rank, source, "the rank in the file name", "rename the file with a rank below 2^31"
        )
    capture = ex.install_version() or env.get("NSIGHT_SYSTEMS_VERSION")
    names_of = gpu_names(ex, sorted(set(rows.gpu[:, 2].tolist())))
    props_of = gpu_props(ex, sorted(set(rows.gpu[:, 2].tolist())))
    metrics = gpu_metrics(ex)
    others = len((set(rp) | set(npc)) - set(gp)) if len(pids) > 1 else 0
    out: list[RankTimeline] = []
    for order, pid in enumerate(pids):
        meta = RankMeta(
            source=source, fmt="nsys", era=era, notes=list(notes), pid=pid, capture_version=capture
        )
        meta.dropped = dict(ex.dropped_rows)
        rank, meta.rank_from = _rank(order, pid, len(pids), env, threads, file_rank, ex.path)
        if len(pids) == 1:
            size = next((env[v] for v in SIZE_VARS if v in env), None)
            meta.world_size = _env_int(size, ex.path, "world size", 1)
        gi = np.flatnonzero(rows.gpu[:, 1] == pid)
        ri = np.flatnonzero(rows.rt[:, 0] == pid) if pid in rp else _EMPTY
        ni = np.flatnonzero(rows.nv[:, 0] == pid) if pid in npc else _EMPTY
        oi = np.flatnonzero(rows.os[:, 0] == pid) if pid in opc else _EMPTY
        devs = sorted(set(rows.gpu[gi, 2].tolist()))
        meta.cuda_devices = devs
        meta.devices = [names_of[d] for d in devs if d in names_of]
        meta.compute_capability = [props_of[d][0] for d in devs if d in names_of and d in props_of]
        meta.multiprocessors = [props_of[d][1] for d in devs if d in names_of and d in props_of]
        mine = {m: tv for d in devs for m, tv in metrics.get(d, {}).items()}
        if not mine and len(pids) == 1 and len(metrics) == 1:
            mine = next(iter(metrics.values()))  # one process, one sampled GPU
        meta.gpu_metrics = mine
        meta.has_gpu = True
        if others:
            meta.notes.append(f"{others} other process(es) in the report ran no GPU work")
        hint = "" if len(ni) else NO_NVTX_HINT
        out.append(
            build_rank(
                rank,
                rows.process(gi, ri, ni, oi),
                meta,
                patterns,
                ex.path,
                range_label="NVTX range",
                no_ranges_hint=hint,
            )
        )
    return out


def _env_int(value: str | None, path: Path, what: str, low: int = 0) -> int | None:
    """A rank or size from a captured environment variable (None when it holds no number)."""
    if value is None or not _DIGITS.fullmatch(value):
        return None
    return check_rank(int(value), path, what, "the export is damaged or edited", low=low)


_DIGITS = re.compile(r"[0-9]{1,30}")


def _rank(
    order: int,
    pid: int,
    nproc: int,
    env: dict[str, str],
    threads: dict[int, int],
    file_rank: int | None,
    path: Path,
) -> tuple[int, str]:
    """A process's rank and where it came from (docs/formats.md, "Rank")."""
    if pid in threads:
        return threads[pid], "nvtx thread name"
    if nproc == 1:
        for v in RANK_VARS:
            rank = _env_int(env.get(v), path, f"the captured environment's {v}")
            if rank is not None:
                return rank, f"environment {v}"
        if file_rank is not None:
            return file_rank, "file name"
        return 0, "default"
    # One report per node: the captured environment is the launcher's; ranks in the
    # order of their CUDA device, then PID.
    return order, "process order"
