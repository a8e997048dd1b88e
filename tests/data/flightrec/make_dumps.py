"""Hand-built flight-recorder dumps for NCCL/xccl shapes and older schema versions.

Field lists follow PyTorch's flight recorder source:
- schema 2.4: torch/csrc/distributed/c10d/FlightRecorder.hpp at pytorch commit 00f0e2f6
  (version_val "2.4": pg_status, is_p2p, timeout_ms, duration_ms, retired,
  time_discovered_*; "nccl_version"; pg_config ranks written as a string by ranks_str()).
- schema 2.10: FlightRecorderDetail.hpp at pytorch commit 1189309e (getCollectiveTrace:
  thread_name, thread_id, frames {name, filename, line}; record_accelerator_version →
  "comm_lib_version") and what torch 2.13 itself writes (tests/data/flightrec/gloo_*).
- 2.3 drops what 2.4 added (no pg_status, is_p2p, timeout_ms); 2.7/2.8 are written as the
  JSON variant (process_group a list, pg_status counters as strings, 0 for a time not
  discovered), 2.8 with comm_lib_version (the rename's exact version is not pinned by
  the sources above: gpudiag reads either key in any version).
Run: python tests/data/flightrec/make_dumps.py  (rewrites the directories below).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
T0 = 1_796_000_000_000_000_000  # epoch ns
DUMP_AT = T0 + 120 * 10**9  # the files' mtime: when each rank dumped
FRAMES = [
    {"name": "all_reduce", "filename": "/opt/torch/distributed/distributed_c10d.py", "line": 3245},
    {"name": "train_step", "filename": "/job/train.py", "line": 57},
    {"name": "main", "filename": "/job/train.py", "line": 88},
]


def entry(
    version: str,
    backend: str,
    rid: int,
    pg: tuple[str, str],
    seq: int,
    op: str,
    size: int = 1024,
    state: str = "completed",
    t: int = 0,
    p2p_seq: int = 0,
    dtype: str = "Float",
    op_id: int | None = None,
    json_fmt: bool = False,
) -> dict[str, Any]:
    minor = int(version.split(".")[1])
    created = T0 + t * 10**9
    started = created + 1000 if state in ("started", "completed") else None
    completed = created + 5000 if state == "completed" else None
    name = op.split(" ")[0]
    p2p = name in ("send", "recv")
    e: dict[str, Any] = {
        "record_id": rid,
        "pg_id": int(pg[0]) if pg[0].isdigit() else 0,
        "process_group": list(pg) if json_fmt else pg,
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": p2p_seq,
        "op_id": rid + 1 if op_id is None else op_id,
        "profiling_name": f"{backend}:{op}",
        "time_created_ns": created,
        "input_sizes": [[size]] if name != "coalesced" else [],
        "input_dtypes": [dtype] if name != "coalesced" else [],
        "output_sizes": [[size * 2 if name == "all_gather" else size]]
        if name != "coalesced"
        else [],
        "output_dtypes": [dtype] if name != "coalesced" else [],
        "state": state,
        "time_discovered_started_ns": started if not json_fmt else (started or 0),
        "time_discovered_completed_ns": completed if not json_fmt else (completed or 0),
        "retired": state == "completed",
        "frames": FRAMES,
    }
    if minor >= 4:
        e["timeout_ms"] = 600000
        e["is_p2p"] = p2p
        if state == "completed":
            e["duration_ms"] = 0.8
    if minor >= 10:
        e["thread_name"] = "pt_main_thread"
        e["thread_id"] = "140000000000000"
    return e


def dump(
    version: str,
    groups: dict[str, tuple[str, list[int]]],
    entries: list[dict[str, Any]],
    json_fmt: bool = False,
    status_str: bool = False,
) -> dict[str, Any]:
    minor = int(version.split(".")[1])
    d: dict[str, Any] = {
        "version": version,
        "pg_config": {
            k: {"name": k, "desc": desc, "ranks": str(ranks)} for k, (desc, ranks) in groups.items()
        },
        "entries": entries,
    }
    if minor >= 8:
        d["comm_lib_version"] = "2.21.5"
    else:
        d["nccl_version"] = "2.18.1"
    if minor >= 4:
        status: dict[str, dict[str, Any]] = {}
        for k in groups:
            seqs = [e["collective_seq_id"] for e in entries if e["process_group"][0] == k]
            done = [
                e["collective_seq_id"]
                for e in entries
                if e["process_group"][0] == k and e["state"] == "completed"
            ]
            c = {
                "last_enqueued_collective": max(seqs, default=-1),
                "last_started_collective": max(seqs, default=-1),
                "last_completed_collective": max(done, default=-1),
            }
            status[k] = {a: str(b) for a, b in c.items()} if status_str else c
        d["pg_status"] = status
    if json_fmt:
        d["nccl_comm_state"] = {}
    return d


def write(directory: str, files: dict[str, dict[str, Any]], json_fmt: bool = False) -> None:
    out = HERE / directory
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name, d in files.items():
        p = out / name
        if json_fmt:
            p.write_text(json.dumps(d, indent=None))
        else:
            p.write_bytes(pickle.dumps(d, protocol=2))
        os.utime(p, ns=(DUMP_AT, DUMP_AT))


def missing_rank() -> dict[str, dict[str, Any]]:
    """4 ranks; rank 3 never enters all_reduce #12 of the default group; 0-2 wait in it."""
    v, pg = "2.10", ("0", "default_pg")
    files = {}
    for r in range(4):
        es = [entry(v, "nccl", i, pg, i + 1, "all_reduce", t=i) for i in range(11)]
        if r != 3:
            es.append(entry(v, "nccl", 11, pg, 12, "all_reduce", state="started", t=20 + r))
        files[f"nccl_trace_rank_node{r // 2:02d}_{r}"] = dump(
            v, {"0": ("default_pg", [0, 1, 2, 3])}, es
        )
    return files


def nested_groups() -> dict[str, dict[str, Any]]:
    """xccl, 4 ranks (all_gathers over 2 ranks: output = 2 × input); default [0-3], tp0 [0,1], tp1 [2,3]. Rank 3 never enters tp1's
    all_gather #5 (rank 2 waits in it); ranks 0 and 1 wait in the default all_reduce #9,
    which ranks 2 and 3 never enter: the tp1 stall explains the default group's."""
    v = "2.8"
    dflt = ("0", "default_pg")
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("tp0", [0, 1]), "2": ("tp1", [2, 3])}
    files = {}
    for r in range(4):
        tp = ("1", "tp0") if r < 2 else ("2", "tp1")
        es, rid = [], 0
        for step in range(4):
            es.append(
                entry(v, "xccl", rid, tp, step + 1, "all_gather", size=256, t=rid, json_fmt=True)
            )
            rid += 1
            es.append(entry(v, "xccl", rid, dflt, 2 * step + 1, "all_reduce", t=rid, json_fmt=True))
            rid += 1
            es.append(entry(v, "xccl", rid, dflt, 2 * step + 2, "broadcast", t=rid, json_fmt=True))
            rid += 1
        if r < 2:
            es.append(entry(v, "xccl", rid, tp, 5, "all_gather", size=256, t=rid, json_fmt=True))
            rid += 1
            es.append(
                entry(
                    v, "xccl", rid, dflt, 9, "all_reduce", state="started", t=30 + r, json_fmt=True
                )
            )
        elif r == 2:
            es.append(
                entry(
                    v,
                    "xccl",
                    rid,
                    tp,
                    5,
                    "all_gather",
                    size=256,
                    state="started",
                    t=25,
                    json_fmt=True,
                )
            )
        files[f"xccl_dump_{r}.json"] = dump(
            v,
            {k: g for k, g in groups.items() if k == "0" or r in g[1]},
            es,
            json_fmt=True,
            status_str=True,
        )
    return files


def size_mismatch() -> dict[str, dict[str, Any]]:
    """2 ranks, schema 2.4: all_reduce #3 with 1024 elements on rank 0 and 512 on rank 1."""
    v, pg = "2.4", ("0", "default_pg")
    files = {}
    for r in range(2):
        es = [entry(v, "nccl", i, pg, i + 1, "all_reduce", t=i) for i in range(2)]
        es.append(
            entry(
                v,
                "nccl",
                2,
                pg,
                3,
                "all_reduce",
                size=1024 if r == 0 else 512,
                state="started",
                t=10,
            )
        )
        files[f"rank_{r}"] = dump(v, {"0": ("default_pg", [0, 1])}, es)
    return files


def dtype_mismatch_v2_3() -> dict[str, dict[str, Any]]:
    """2 ranks, schema 2.3 (no pg_status, is_p2p, timeout): broadcast #7 in BFloat16 on
    rank 1 and Float on rank 0; then rank 1 never enters all_reduce #8."""
    v, pg = "2.3", ("0", "default_pg")
    files = {}
    for r in range(2):
        es = [entry(v, "nccl", i, pg, i + 1, "all_reduce", t=i) for i in range(6)]
        es.append(entry(v, "nccl", 6, pg, 7, "broadcast", dtype="BFloat16" if r else "Float", t=7))
        if r == 0:
            es.append(entry(v, "nccl", 7, pg, 8, "all_reduce", state="scheduled", t=9))
        files[f"nccl_trace_rank_{r}"] = dump(v, {"0": ("default_pg", [0, 1])}, es)
    return files


def p2p_coalesced() -> dict[str, dict[str, Any]]:
    """2 ranks, schema 2.7 JSON: a coalesced pair of all_reduces (#4) completes on both;
    then rank 0's send 0->1 waits: rank 1 never posts the matching recv."""
    v, pg = "2.7", ("0", "default_pg")
    files = {}
    for r in range(2):
        es = [entry(v, "nccl", i, pg, i + 1, "all_reduce", t=i, json_fmt=True) for i in range(3)]
        es.append(entry(v, "nccl", 3, pg, 4, "all_reduce", t=4, op_id=4, json_fmt=True))
        es.append(entry(v, "nccl", 4, pg, 4, "all_reduce", t=4, op_id=5, json_fmt=True))
        es.append(entry(v, "nccl", 5, pg, 4, "coalesced", t=4, op_id=6, json_fmt=True))
        es.append(
            entry(
                v,
                "nccl",
                6,
                pg,
                0,
                "send 0->1" if r == 0 else "recv 1<-0",
                p2p_seq=1,
                t=5,
                json_fmt=True,
            )
        )
        if r == 0:
            es.append(
                entry(
                    v, "nccl", 7, pg, 0, "send 0->1", p2p_seq=2, state="started", t=8, json_fmt=True
                )
            )
        files[f"trace_{r}.json"] = dump(
            v, {"0": ("default_pg", [0, 1])}, es, json_fmt=True, status_str=True
        )
    return files


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {HERE / 'PWNED'}",))


def bad_files() -> None:
    out = HERE / "bad"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    (out / "evil_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Evil()]}))
    good = pickle.dumps(
        dump(
            "2.10",
            {"0": ("default_pg", [0])},
            [entry("2.10", "nccl", 0, ("0", "default_pg"), 1, "all_reduce")],
        )
    )
    (out / "truncated_0").write_bytes(good[: len(good) // 2])
    (out / "empty_0").write_bytes(b"")
    (out / "future_0").write_bytes(pickle.dumps({"version": "3.0", "entries": [], "pg_config": {}}))
    (out / "notadump_0").write_bytes(pickle.dumps([1, 2, 3]))


def main() -> None:
    write("nccl_missing_rank", missing_rank())
    partial = missing_rank()
    del partial["nccl_trace_rank_node01_3"]
    write("nccl_missing_dump", partial)
    write("xccl_nested_groups", nested_groups(), json_fmt=True)
    write("nccl_size_mismatch", size_mismatch())
    write("nccl_v2_3_dtype", dtype_mismatch_v2_3())
    write("nccl_p2p_coalesced", p2p_coalesced(), json_fmt=True)
    bad_files()


if __name__ == "__main__":
    main()
