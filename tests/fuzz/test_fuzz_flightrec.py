"""Structured mutants of flight-recorder dumps: no dump input of any shape is an internal error.

Bases: the real 16-rank NCCL dumps of ../shared/traces/flightrec/nvrx_gpu_error_2nd and
the real gloo dumps torch wrote here (tests/data/flightrec/gloo_hang). Each mutant
decodes the dumps, then drops ranks' dumps, empties or cuts entry lists (a wrapped
buffer), duplicates, shuffles or retypes entries and fields, rewrites the version (every
known one and unknown ones), damages pg_config and pg_status, renames profiling names,
or damages the pickle's bytes; then ``gpudiag.analyze`` must end in a Diagnosis that
passes its schema or a clean GpudiagError, within the harness's time and memory bounds.
"""

from __future__ import annotations

import collections
import copy
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from harness import run_case
from test_fuzz_mutants import checked_analysis

from gpudiag.traces.runfiles.flightrec import loads_plain

SEED = 31
DATA = Path(__file__).resolve().parents[1] / "data" / "flightrec"
NASTY: list[Any] = [
    None,
    "",
    "x",
    -1,
    0,
    2**70,
    -(2**70),
    10**400,
    2**63,
    1.5,
    float("nan"),
    float("inf"),
    [],
    {},
    [[]],
    [[-1, 2**70]],
    "[0, 1, 1e99]",
    "[" * 50,
    "[" * 5000,
    True,
    ("a", "b", "c"),
    {"a": {"b": []}},
]
FIELDS = [
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
    "state",
    "retired",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "timeout_ms",
    "is_p2p",
    "duration_ms",
    "frames",
    "thread_name",
]
NAMES = [
    "nccl:send 0->",
    "nccl:recv 3<-x",
    "nccl:send 99->0",
    "nccl:recv 0<-99",
    "gloo:",
    ":all_reduce",
    "nccl:coalesced",
    "nccl:all_to_all extra words",
    "NCCL:ALL_REDUCE",
]


def _bases(shared: Path) -> list[dict[str, Any]]:
    """Each base: file name → decoded dump."""
    out = []
    for d in (shared / "flightrec" / "nvrx_gpu_error_2nd", DATA / "gloo_hang"):
        files = sorted(p for p in d.iterdir() if p.name.startswith(("_dump_", "gloo_trace_")))
        out.append({p.name: loads_plain(p.read_bytes(), p) for p in files})
    return out


def _entry_op(rng: random.Random, dump: dict[str, Any]) -> str:
    entries = dump.get("entries")
    if not isinstance(entries, list) or not entries:
        dump["entries"] = []
        return "entries already empty"
    i = rng.randrange(len(entries))
    e = entries[i]
    r = rng.random()
    if r < 0.15:
        dump["entries"] = entries[: rng.randrange(len(entries))]
        return "entries cut (wrapped buffer)"
    if r < 0.25:
        dump["entries"] = entries[rng.randrange(len(entries)) :]
        return "oldest entries lost"
    if r < 0.35:
        entries.insert(i, copy.deepcopy(e))
        return "entry duplicated"
    if r < 0.45:
        rng.shuffle(entries)
        return "entries shuffled"
    if r < 0.5:
        entries[i] = rng.choice(NASTY)
        return "entry replaced"
    if not isinstance(e, dict):
        return "entry not a dict"
    key = rng.choice(FIELDS)
    if r < 0.6:
        e.pop(key, None)
        return f"{key} deleted"
    if r < 0.7 and key == "profiling_name":
        e[key] = rng.choice(NAMES)
        return "profiling_name rewritten"
    if r < 0.8 and isinstance(e.get(key), int) and not isinstance(e.get(key), bool):
        e[key] += rng.choice([-1, 1, 10**6, -(10**6)])
        return f"{key} shifted"
    e[key] = rng.choice(NASTY)
    return f"{key} retyped"


def _dump_op(rng: random.Random, dump: dict[str, Any]) -> str:
    r = rng.random()
    if r < 0.2:
        dump["version"] = rng.choice(["2.2", "2.3", "2.4", "2.7", "2.10", "2.11", "3.0", 2.9, None])
        return f"version {dump['version']!r}"
    if r < 0.35:
        dump["entries"] = []
        return "empty entry list"
    if r < 0.5:
        dump["pg_config"] = rng.choice(NASTY)
        return "pg_config damaged"
    if r < 0.6 and isinstance(dump.get("pg_config"), dict) and dump["pg_config"]:
        k = rng.choice(sorted(dump["pg_config"]))
        dump["pg_config"][k] = {"name": k, "desc": "x", "ranks": rng.choice(NASTY)}
        return "a group's ranks damaged"
    if r < 0.75:
        dump["pg_status"] = rng.choice(NASTY)
        return "pg_status damaged"
    if r < 0.85 and isinstance(dump.get("pg_status"), dict) and dump["pg_status"]:
        k = rng.choice(sorted(dump["pg_status"]))
        dump["pg_status"][k] = {"last_enqueued_collective": rng.choice(NASTY)}
        return "a group's status damaged"
    return _entry_op(rng, dump)


def _mutant(rng: random.Random, base: dict[str, Any]) -> tuple[dict[str, bytes], list[str]]:
    dumps = copy.deepcopy(base)
    ops: list[str] = []
    names = sorted(dumps)
    if len(names) > 1 and rng.random() < 0.3:
        for n in rng.sample(names, rng.randrange(1, len(names))):
            del dumps[n]
        ops.append(f"dumps kept: {sorted(dumps)}")
    for _ in range(rng.randrange(1, 6)):
        name = rng.choice(sorted(dumps))
        ops.append(f"{name}: {_dump_op(rng, dumps[name])}")
    files = {n: pickle.dumps(d) for n, d in dumps.items()}
    if rng.random() < 0.1:
        n = rng.choice(sorted(files))
        files[n] = files[n][: rng.randrange(len(files[n]))]
        ops.append(f"{n}: pickle cut")
    return files, ops


@pytest.mark.parametrize("which", [0, 1])
def test_flightrec_mutants(shared_traces: Path, tmp_path: Path, which: int) -> None:
    base = _bases(shared_traces)[which]
    rng = random.Random(SEED + which)
    n = 120 if which == 0 else 60
    kinds: collections.Counter[str] = collections.Counter()
    bad = []
    for i in range(n):
        files, ops = _mutant(rng, base)
        d = tmp_path / f"m{i}"
        d.mkdir()
        for name, data in files.items():
            (d / name).write_bytes(data)
        out = run_case(f"m{i}", d, [d], checked_analysis)
        kinds[out.kind] += 1
        if not out.ok:
            bad.append(f"{out.describe()}\n    mutations: {ops}")
    assert not bad, f"{len(bad)} of {n} mutants broke the property:\n" + "\n".join(bad[:10])
    assert kinds["diagnosis"] > n // 4 and kinds["error"], kinds
