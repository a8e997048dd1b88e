"""A structured mutator over the shared Kineto traces: events dropped, duplicated, shuffled,
fields perturbed or retyped, arrays truncated, top-level keys damaged.

Each base trace is read once and cut to a coherent window of its first events (by time),
so that one case costs milliseconds to write and to analyse. A case is fully determined by
``(seed, index)``: the same seed always produces the same files, byte for byte.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Bases: one-rank sets and the one two-rank set (cross-rank analysis: stragglers,
# collective matching). Big traces are cut to a window of their first events.
BASES = {
    "sampled_2rank_a2a": ["rank-0.json.gz", "rank-1.json.gz"],
    "a100x2_r0_pgcfg": ["rank-0.json.gz"],
    "edge_amd_mi250": ["mi250.json.gz"],
    "edge_cpu_only": ["rank-34.json.gz"],
    "edge_distinfo_no_rank": ["a100.json.gz"],
    "edge_mi300x_triton_tiny": ["mi300x.json.gz"],
    "edge_h100_infer_1step": ["h100.json.gz"],
    "v100x2_r1": ["rank-1.json.gz"],
    "mi300x_ddp8_r0_rccl": ["rank-0.json.gz"],
}
WINDOW_EVENTS = 1500

# Values that break assumptions: extremes of every numeric range, non-numbers, markup.
NASTY: list[Any] = [
    -1e308,
    1e308,
    -1.0,
    -1,
    0,
    0.0,
    1e-300,
    2**31,
    3_000_000_000,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    2**70,
    -(2**63),
    -(2**70),
    10**30,
    1.5,
    "",
    "x",
    "123",
    "-1",
    "1e308",
    "<script>alert(1)</script>",
    None,
    True,
    False,
    [],
    {},
    [1, 2],
    {"a": 1},
    "ProfilerStep#1",
    "\u0000",
    "\ud7ff\uffff",
    "nccl:all_reduce",
]
FIELDS = ["ts", "dur", "pid", "tid", "name", "cat", "ph", "args", "id"]
ARG_FIELDS = [
    "correlation",
    "External id",
    "device",
    "stream",
    "bytes",
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Group size",
    "Seq",
    "Comms Id",
    "Process Group Name",
    "name",
    "labels",
]
TOP_FIELDS = [
    "distributedInfo",
    "deviceProperties",
    "baseTimeNanoseconds",
    "schemaVersion",
    "traceEvents",
    "displayTimeUnit",
]


@dataclass
class Base:
    """One shared trace set, cut to a window: the top-level keys and events of each rank."""

    name: str
    files: list[str]
    docs: list[dict[str, Any]]


@dataclass
class Mutant:
    """A generated case: files to write (name → bytes) and what was done."""

    name: str
    files: dict[str, bytes]
    ops: list[str] = field(default_factory=list)


def _window(doc: dict[str, Any], n: int) -> dict[str, Any]:
    """The metadata events and the first ``n`` timed events of a trace (by time)."""
    events = doc.get("traceEvents") or []
    meta = [e for e in events if e.get("ph") != "X"]
    timed = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e.get("ts", 0))
    out = dict(doc)
    out["traceEvents"] = meta[:200] + timed[:n]
    return out


def load_bases(kineto_dir: Path, names: list[str] | None = None) -> list[Base]:
    """Read the base traces once (each cut to :data:`WINDOW_EVENTS` timed events)."""
    out = []
    for name in names or list(BASES):
        files = BASES[name]
        docs = []
        for f in files:
            with gzip.open(kineto_dir / name / f, "rt", encoding="utf-8") as fh:
                docs.append(_window(json.load(fh), WINDOW_EVENTS))
        out.append(Base(name, files, docs))
    return out


# ---- mutations: each takes (rng, doc) and returns (doc, description); docs are never
# modified in place (events and args are copied where they change)


def _events(doc: dict[str, Any]) -> list[Any]:
    ev = doc.get("traceEvents")
    return list(ev) if isinstance(ev, list) else []


def _pick(rng: random.Random, events: list[Any], k_max: int = 20) -> list[int]:
    if not events:
        return []
    k = min(len(events), rng.choice([1, 1, 2, 5, k_max]))
    return rng.sample(range(len(events)), k)


def drop_events(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    if rng.random() < 0.5 and ev:
        a = rng.randrange(len(ev))
        b = min(len(ev), a + rng.randrange(1, max(2, len(ev) // 2)))
        kept = ev[:a] + ev[b:]
        what = f"drop events [{a}:{b}]"
    else:
        frac = rng.choice([0.01, 0.1, 0.5, 0.9, 1.0])
        kept = [e for e in ev if rng.random() >= frac]
        what = f"drop {frac:.0%} of events"
    return {**doc, "traceEvents": kept}, what


def duplicate_events(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    idx = _pick(rng, ev, 200)
    for i in idx:
        ev.insert(rng.randrange(len(ev) + 1), ev[i])
    return {**doc, "traceEvents": ev}, f"duplicate {len(idx)} events"


def shuffle_events(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    rng.shuffle(ev)
    return {**doc, "traceEvents": ev}, "shuffle events"


def _nasty(rng: random.Random, old: Any) -> Any:
    r = rng.random()
    if r < 0.15 and old is not None:  # retyped: the same value in another type
        return rng.choice([str(old), [old], {"v": old}, None, bool(old)])
    if r < 0.2 and isinstance(old, (int, float)) and not isinstance(old, bool):
        return old * rng.choice([-1, 1e6, 1e12, 1e-6]) + rng.choice([0, 1e18, -1e18])
    return rng.choice(NASTY)


def perturb_field(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    idx = _pick(rng, ev)
    key = rng.choice(FIELDS)
    for i in idx:
        e = ev[i]
        if not isinstance(e, dict):
            continue
        e = dict(e)
        if key == "args" and isinstance(e.get("args"), dict) and rng.random() < 0.7:
            a = dict(e["args"])
            ak = rng.choice(ARG_FIELDS)
            a[ak] = _nasty(rng, a.get(ak))
            e["args"] = a
        else:
            e[key] = _nasty(rng, e.get(key))
        ev[i] = e
    return {**doc, "traceEvents": ev}, f"perturb {key} of {len(idx)} events"


def delete_field(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    idx = _pick(rng, ev, 500)
    key = rng.choice(["ts", "dur", "name", "pid", "tid", "ph", "cat", "args"])
    for i in idx:
        if isinstance(ev[i], dict) and key in ev[i]:
            ev[i] = {k: v for k, v in ev[i].items() if k != key}
    return {**doc, "traceEvents": ev}, f"delete {key} from {len(idx)} events"


def replace_event(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    idx = _pick(rng, ev, 5)
    for i in idx:
        ev[i] = rng.choice([None, 1, "x", [], [ev[i]], {"ph": "X"}, {}])
    return {**doc, "traceEvents": ev}, f"replace {len(idx)} events by non-events"


def perturb_top(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    doc = dict(doc)
    key = rng.choice(
        [*TOP_FIELDS, "distributedInfo.rank", "distributedInfo.rank", "distributedInfo.world_size"]
    )
    if key.startswith("distributedInfo."):
        sub = key.split(".", 1)[1]
        info = dict(doc["distributedInfo"]) if isinstance(doc.get("distributedInfo"), dict) else {}
        info[sub] = _nasty(rng, info.get(sub))
        doc["distributedInfo"] = info
    elif key == "traceEvents" and rng.random() < 0.5:
        doc[key] = rng.choice([None, {}, "x", 1, {"a": doc.get(key)}])
    else:
        doc[key] = _nasty(rng, doc.get(key))
    return doc, f"perturb top-level {key}"


def step_numbers(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    big = rng.choice(
        [
            "3000000000",
            "2147483648",
            "9223372036854775808",
            str(2**70),
            "-5",
            "99999999999999999999999",
            "0",
            "00",
            "1e3",
            "",
        ]
    )
    hit = 0
    for i, e in enumerate(ev):
        step = isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")
        if step and (rng.random() < 0.5 or hit == 0):
            ev[i] = {**e, "name": f"ProfilerStep#{big}"}
            hit += 1
    return {**doc, "traceEvents": ev}, f"step numbers {big} ({hit} steps)"


def shift_times(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ev = _events(doc)
    scale = rng.choice([1.0, 1e3, 1e6, -1.0])
    offset = rng.choice([0.0, 1e15, 9.2e15, 1e17, -1e16])
    for i, e in enumerate(ev):
        if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
            ev[i] = {**e, "ts": e["ts"] * scale + offset}
    return {**doc, "traceEvents": ev}, f"times ×{scale:g} +{offset:g}"


def deep_nesting(rng: random.Random, doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    # Marked here and expanded in the text (json.dumps itself would recurse too deep).
    ev = _events(doc)
    where = rng.choice(["args", "unknown key", "top"])
    if where == "top":
        return {**doc, "zzDeep": "@@DEEP@@"}, "deep nesting at the top level"
    if ev:
        i = rng.randrange(len(ev))
        e = dict(ev[i]) if isinstance(ev[i], dict) else {}
        if where == "args":
            e["args"] = {**(e.get("args") or {}), "deep": "@@DEEP@@"}
        else:
            e["zzDeep"] = "@@DEEP@@"
        ev[i] = e
    return {**doc, "traceEvents": ev}, f"deep nesting in {where}"


MUTATIONS: list[tuple[Callable[..., tuple[dict[str, Any], str]], int]] = [
    (drop_events, 3),
    (duplicate_events, 2),
    (shuffle_events, 1),
    (perturb_field, 8),
    (delete_field, 3),
    (replace_event, 1),
    (perturb_top, 3),
    (step_numbers, 2),
    (shift_times, 2),
    (deep_nesting, 1),
]
DEEP = 100_000


def _dump(doc: dict[str, Any], rng: random.Random, damage: bool) -> bytes:
    text = json.dumps(doc, separators=(",", ":"), allow_nan=True)
    deep = "[" * DEEP + "]" * DEEP
    text = text.replace('"@@DEEP@@"', deep)
    r = rng.random() if damage else 1.0
    if r < 0.05:  # truncated: the writer was killed, or the copy cut short
        text = text[: rng.randrange(len(text))]
    elif r < 0.08 and '"traceEvents":' in text:  # a duplicate traceEvents key
        text = text.replace('"traceEvents":', '"traceEvents":[],"traceEvents":', 1)
    elif r < 0.10:  # a run of random bytes
        pos = rng.randrange(len(text))
        junk = "".join(rng.choice('{}[],:"\\x0 ') for _ in range(rng.randrange(1, 16)))
        text = text[:pos] + junk + text[pos + len(junk) :]
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.3:
        data = gzip.compress(data, compresslevel=1, mtime=0)
    return data


def _name(rng: random.Random, base: Base, i: int, gz: bool) -> str:
    ext = ".json.gz" if gz else ".json"
    if len(base.files) > 1 or rng.random() < 0.7:
        return base.files[i].split(".")[0] + ext
    return f"{base.name}{ext}"


def mutants(bases: list[Base], seed: int, count: int, start: int = 0) -> Iterator[Mutant]:
    """``count`` cases from ``seed`` (case ``start + k`` is the same whatever ``count``)."""
    ops, weights = zip(*MUTATIONS, strict=True)
    for k in range(start, start + count):
        rng = random.Random(f"{seed}:{k}")
        base = bases[k % len(bases)]
        files: dict[str, bytes] = {}
        done: list[str] = []
        targets = list(range(len(base.docs)))
        if len(targets) > 1 and rng.random() < 0.5:
            targets = [rng.choice(targets)]  # one rank damaged, the other intact
        for i, doc in enumerate(base.docs):
            if i in targets:
                for _ in range(rng.choice([1, 1, 1, 2, 3])):
                    op = rng.choices(ops, weights)[0]
                    doc, what = op(rng, doc)
                    done.append(f"r{i}: {what}")
            data = _dump(doc, rng, i in targets)
            files[_name(rng, base, i, data[:2] == b"\x1f\x8b")] = data
        yield Mutant(f"mutant-{seed}-{k}-{base.name}", files, done)


# ---- Nsight exports: SQL mutations of a copy, then damage to the file's bytes

NSYS_BASES = ["nsys-ai/healthy_1pct.sqlite", "nsys-ai/mfu_2gpu_before.sqlite"]
NSYS_TABLES = [
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "NVTX_EVENTS",
    "StringIds",
    "TARGET_INFO_GPU",
    "META_DATA_EXPORT",
]
SQL_NASTY = [
    "'x'",
    "''",
    "x'00ff'",
    "NULL",
    "-9223372036854775808",
    "9223372036854775807",
    "1.5",
    "-1",
    "0",
    "'²'",
    "'MPI Rank 3'",
    "1e300",
]


def _sql_ops(rng: random.Random, con: Any) -> list[str]:
    """1–3 random SQL changes to an open export; returns what was done."""
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    present = [t for t in NSYS_TABLES if t in tables] or tables
    done = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        t = rng.choice(present)
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
        if not cols:
            continue
        c = rng.choice(cols)
        op = rng.choices(
            ["set", "delete", "drop", "rename", "view", "insert"], [10, 2, 1, 2, 1, 2]
        )[0]
        frac = rng.choice([1, 2, 5, 50])
        stmt = {
            "set": f'UPDATE "{t}" SET "{c}" = {rng.choice(SQL_NASTY)} WHERE abs(random()) % {frac} = 0',
            "delete": f'DELETE FROM "{t}" WHERE abs(random()) % {frac} = 0',
            "drop": f'DROP TABLE "{t}"',
            "rename": f'ALTER TABLE "{t}" RENAME COLUMN "{c}" TO "{c}_renamed"',
            "view": f'ALTER TABLE "{t}" RENAME TO "{t}_T"; CREATE VIEW "{t}" AS SELECT * FROM "{t}_T"',
            "insert": f'INSERT INTO "{t}" ("{c}") VALUES ({rng.choice(SQL_NASTY)})',
        }[op]
        try:
            con.executescript(stmt)
            done.append(f"{op} {t}.{c}")
        except Exception as e:  # constraints (INTEGER PRIMARY KEY …): the file is as it was
            done.append(f"{op} {t}.{c} refused by SQLite ({type(e).__name__})")
    return done


def nsys_mutants(shared: Path, seed: int, count: int, start: int = 0) -> Iterator[Mutant]:
    """``count`` damaged copies of the shared exports (SQL changes, then byte damage)."""
    import sqlite3
    import tempfile

    for k in range(start, start + count):
        rng = random.Random(f"nsys:{seed}:{k}")
        base = NSYS_BASES[k % len(NSYS_BASES)]
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "x.sqlite"
            p.write_bytes((shared / "nsys" / base).read_bytes())
            con = sqlite3.connect(p)
            done = _sql_ops(rng, con)
            con.commit()
            con.close()
            data = bytearray(p.read_bytes())
        r = rng.random()
        if r < 0.08:  # zeroed pages
            page = int.from_bytes(data[16:18], "big") or 65536
            a = rng.randrange(1, max(2, len(data) // page)) * page
            n = min(len(data) - a, page * rng.choice([1, 4]))
            data[a : a + n] = bytes(n)
            done.append(f"zeroed {n} bytes from byte {a}")
        elif r < 0.12:
            data = data[: rng.randrange(100, len(data))]
            done.append("truncated")
        elif r < 0.16:
            for _ in range(rng.randrange(1, 50)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            done.append("bytes flipped")
        yield Mutant(f"nsys-{seed}-{k}-{base.split('/')[-1]}", {"report.sqlite": bytes(data)}, done)


# ---- run directories: damaged manifest, telemetry and NVML records


def _perturb_json(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """``obj`` with one value somewhere in it replaced, removed or retyped."""
    if isinstance(obj, dict) and obj and depth < 4 and rng.random() < 0.7:
        k = rng.choice(list(obj))
        out = dict(obj)
        if rng.random() < 0.15:
            del out[k]
        else:
            out[k] = _perturb_json(rng, obj[k], depth + 1)
        return out
    if isinstance(obj, list) and obj and depth < 4 and rng.random() < 0.7:
        out2 = list(obj)
        i = rng.randrange(len(out2))
        out2[i] = _perturb_json(rng, out2[i], depth + 1)
        return out2
    return _nasty(rng, obj)


def run_dir_mutants(run: Path, seed: int, count: int, start: int = 0) -> Iterator[Mutant]:
    """``count`` damaged copies of the run directory ``run`` (files relative to it)."""
    files = {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    jsonl = [n for n in files if n.endswith(".jsonl")]
    for k in range(start, start + count):
        rng = random.Random(f"run:{seed}:{k}")
        out = dict(files)
        done = []
        for _ in range(rng.choice([1, 1, 2])):
            target = rng.choice(["manifest.json", *jsonl, *jsonl])
            if target == "manifest.json":
                doc = json.loads(out[target])
                out[target] = json.dumps(_perturb_json(rng, doc), allow_nan=True).encode()
                done.append("manifest perturbed")
                continue
            lines = out[target].decode().splitlines()
            i = rng.randrange(len(lines))
            r = rng.random()
            if r < 0.6:
                try:
                    rec = json.loads(lines[i])
                except ValueError:  # already cut by an earlier change of this case
                    rec = {}
                lines[i] = json.dumps(_perturb_json(rng, rec), allow_nan=True)
                what = "perturbed"
            elif r < 0.75:
                lines.insert(i, lines[i])
                what = "duplicated"
            elif r < 0.9:
                del lines[i]
                what = "dropped"
            else:
                lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
                what = "truncated"
            out[target] = ("\n".join(lines) + ("\n" if rng.random() < 0.9 else "")).encode()
            done.append(f"{target} line {i + 1} {what}")
        yield Mutant(f"run-{seed}-{k}", {f"run/{n}": b for n, b in out.items()}, done)
