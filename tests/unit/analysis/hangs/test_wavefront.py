"""The wavefront across process groups: one root (the collective, its group, who never entered).

Truth from outside gpudiag:
- ../shared/traces/flightrec/nvrx_gpu_error_2nd: a 16-rank MoE job with GPU errors injected
  on ranks 9 and 14 (its fault_injection.log); the reference analyser's summary
  (reference_output.txt) names all_to_all on EXPERT_MODEL_PARALLEL_GROUP (pg 72),
  missing ranks 9, 14. torch's own analyser (torch.distributed.flight_recorder) flags the
  same collective first.
- tests/data/flightrec/mg_skip, mg_stop: real 4-rank gloo jobs with two tensor and two data
  groups whose stuck collective is known by construction (make_multigroup_dumps.py); torch's
  analyser, given the groups' membership (gloo writes none), flags the same stalls.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import testpaths

from gpudiag.analysis.hangs.stuck import analyze_dumps
from gpudiag.traces.runfiles.flightrec import (
    loads_plain,
    parse_dump,
    rank_from_dump_name,
    read_dumps,
)

DATA = testpaths.DATA / "flightrec"
MG_GROUPS = {
    "0": ("default_pg", [0, 1, 2, 3]),
    "1": ("tp_a", [0, 1]),
    "2": ("tp_b", [2, 3]),
    "3": ("dp_a", [0, 2]),
    "4": ("dp_b", [1, 3]),
}
# by construction (make_multigroup_dumps.py): (group desc, op, seq, never entered)
MG_TRUTH = {"mg_skip": ("tp_a", "all_reduce", 6, (1,)), "mg_stop": ("tp_b", "all_reduce", 4, (2,))}


def _shared_set(shared_traces: Path) -> Path:
    d = shared_traces / "flightrec" / "nvrx_gpu_error_2nd"
    if not d.is_dir():
        pytest.skip("the shared flight-recorder set is not here")
    return d


def _reference(d: Path) -> tuple[str, str, str, tuple[int, ...]]:
    """(pg id, group desc, op, missing ranks) of reference_output.txt's row."""
    row = (d / "reference_output.txt").read_text().splitlines()[1]
    pgid, desc, op, _size, _dtype, missing = (c.strip() for c in row.split("|"))
    return pgid, desc.split(",")[0], op, tuple(int(r) for r in missing.split(","))


def test_shared_set_root_is_the_reference_answer(shared_traces: Path) -> None:
    d = _shared_set(shared_traces)
    pgid, desc, op, missing = _reference(d)
    faults = tuple(
        int(x) for x in re.findall(r"\d+", (d / "fault_injection.log").read_text().split("\n")[0])
    )
    assert missing == faults == (9, 14)
    a = analyze_dumps(read_dumps(sorted(d.glob("_dump_*"))))
    (root,) = a.roots
    assert (root.pg_name, root.pg_desc, f"{root.backend}:{root.op}") == (pgid, desc, op)
    assert root.never_entered == missing
    assert root.input_sizes == ((2048, 5120),) and root.input_dtypes == ("BFloat16",)
    assert [w.rank for w in root.stuck] == [8, 10, 11, 12, 13, 15]
    # everything else is an effect of it; uneven all_to_all splits are no mismatch
    assert all(s.explained_by == root.label for s in a.stalls if s is not root)
    assert not a.mismatches and not a.missing_dumps
    assert {r for r, _ in root.last_done} == {9, 14}


def test_shared_set_verdict_and_findings(shared_traces: Path) -> None:
    import gpudiag

    diag = gpudiag.analyze(_shared_set(shared_traces), jobs=1).to_json()
    head = diag["verdict"]["headline"]
    assert head.startswith("hang: all_to_all #44791 on EXPERT_MODEL_PARALLEL_GROUP (pg 72")
    assert "ranks 9, 14 never entered it" in head and "2048x5120 BFloat16" in head
    errors = [f for f in diag["findings"] if f["severity"] == "error"]
    assert 1 <= len(errors) <= 4
    assert not [f for f in diag["findings"] if f["kind"] == "collective_mismatch"]
    (hang,) = [f for f in diag["findings"] if f["kind"] == "hang"]
    assert hang["ranks"] == [9, 14] and hang["metrics"]["never_entered"] == [9, 14]
    waiting = {r for e in hang["metrics"]["effects"] for r in e["waiting_ranks"]}
    assert waiting | set(hang["metrics"]["waiting_ranks"]) == set(range(16)) - {9, 14}
    # one line for the 16 copied dumps' modification times, not sixteen
    assert sum("modification time" in n for n in diag["notes"]) == 1


def _torch_flags(tmp_path: Path, src: Path, groups: dict[str, Any] | None) -> list[tuple]:
    """(group desc, op, seq, missing ranks) of every collective torch's analyser flags, in order."""
    pytest.importorskip("torch")
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    out = tmp_path / f"torch_{src.name}"
    out.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        r = rank_from_dump_name(f)
        if r is None or f.suffix in (".json", ".txt", ".log"):
            continue
        obj = loads_plain(f.read_bytes(), f)
        if groups is not None:
            obj["pg_config"] = {
                k: {"name": k, "desc": desc, "ranks": json.dumps(ranks)}
                for k, (desc, ranks) in groups.items()
            }
        (out / f"rank_{r}").write_bytes(pickle.dumps(obj))
    args = JobConfig().parse_args([str(out), "--allow-incomplete-ranks", "-p", "rank_"])
    details, version = read_dir(args)
    db = build_db(details, args, version)
    return [
        (
            c.pg_desc.split(":", 1)[1],
            c.collective_name,
            c.collective_seq_id,
            tuple(sorted(c.missing_ranks or ())),
        )
        for c in db.collectives
        if c.missing_ranks
    ]


def test_shared_set_same_answer_as_torch(shared_traces: Path, tmp_path: Path) -> None:
    d = _shared_set(shared_traces)
    flags = _torch_flags(tmp_path, d, None)
    root = analyze_dumps(read_dumps(sorted(d.glob("_dump_*")))).roots[0]
    assert flags[0] == (root.pg_desc, f"nccl:{root.op}", root.seq, root.never_entered)


def _mg(tmp_path: Path, name: str) -> list:
    out = tmp_path / name
    shutil.copytree(DATA / name, out)
    stamps = json.loads((DATA / f"{name}.dumped_ns.json").read_text())
    for f in out.iterdir():
        t = stamps[str(rank_from_dump_name(f))]
        os.utime(f, ns=(t, t))
    return read_dumps(sorted(out.iterdir()))


@pytest.mark.parametrize("name", sorted(MG_TRUTH))
def test_multigroup_gloo_root_is_the_constructed_one(tmp_path: Path, name: str) -> None:
    a = analyze_dumps(_mg(tmp_path, name))
    (root,) = a.roots
    assert (root.pg_desc, root.op, root.seq, root.never_entered) == MG_TRUTH[name]
    assert len(root.stuck) == 1 and root.waited_ns is not None and root.waited_ns > 10**9
    assert all(s.explained_by == root.label for s in a.stalls if s is not root)


@pytest.mark.parametrize("name", sorted(MG_TRUTH))
def test_multigroup_gloo_same_answer_as_torch(tmp_path: Path, name: str) -> None:
    flags = _torch_flags(tmp_path, DATA / name, MG_GROUPS)
    a = analyze_dumps(_mg(tmp_path / "ours", name))
    ours = {(s.pg_desc, f"gloo:{s.op}", s.seq, s.never_entered) for s in a.stalls}
    assert set(flags) == ours
    desc, op, seq, missing = MG_TRUTH[name]
    assert (desc, f"gloo:{op}", seq, missing) in flags


# --- hand-built dumps: what must agree and what may differ -----------------------------

T0 = 1_796_000_000_000_000_000


def _dump(rank: int, entries: list[dict[str, Any]], members: list[int]) -> Any:
    raw = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(members)}},
        "pg_status": {},
        "entries": entries,
    }
    return parse_dump(raw, Path(f"rank_{rank}"), "pickle", T0 + 60 * 10**9, rank)


def _e(
    rid: int, seq: int, op: str, ins: list, outs: list, done: bool, dtype: str = "Float"
) -> dict:
    return {
        "record_id": rid,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": T0 + rid * 10**6,
        "input_sizes": ins,
        "output_sizes": outs,
        "input_dtypes": [dtype],
        "output_dtypes": [dtype],
        "state": "completed" if done else "scheduled",
        "retired": done,
        "is_p2p": False,
    }


def test_uneven_all_to_all_splits_are_not_a_mismatch() -> None:
    dumps = [
        _dump(r, [_e(1, 1, "all_to_all", [[2048, 64]], [[2000 + 30 * r, 64]], True)], [0, 1, 2])
        for r in range(3)
    ]
    a = analyze_dumps(dumps)
    assert not a.mismatches and not a.stalls


def test_all_reduce_size_and_dtype_must_agree() -> None:
    sizes = analyze_dumps(
        [
            _dump(r, [_e(1, 1, "all_reduce", [[1024 if r else 512]], [[1024]], True)], [0, 1, 2])
            for r in range(3)
        ]
    )
    (m,) = sizes.mismatches
    assert m.culprits == (0,) and m.mismatches[0].what == "input_sizes"
    dtypes = analyze_dumps(
        [
            _dump(
                r,
                [_e(1, 1, "all_to_all", [[8]], [[8]], True, "Half" if r == 2 else "Float")],
                [0, 1, 2],
            )
            for r in range(3)
        ]
    )
    (m,) = dtypes.mismatches
    assert m.culprits == (2,) and m.mismatches[0].what == "dtypes"


def test_another_op_at_the_same_seq_is_a_desync() -> None:
    dumps = [
        _dump(r, [_e(1, 1, "broadcast" if r == 1 else "all_reduce", [[8]], [[8]], False)], [0, 1])
        for r in range(2)
    ]
    (m,) = analyze_dumps(dumps).mismatches
    assert m.culprits == (1,) and m.mismatches[0].what == "op"


def test_missing_and_empty_dumps_are_named_not_guessed() -> None:
    entries = [
        _e(1, 1, "all_reduce", [[8]], [[8]], True),
        _e(2, 2, "all_reduce", [[8]], [[8]], False),
    ]
    dumps = [
        _dump(0, entries, [0, 1, 2, 3]),
        _dump(1, entries[:1], [0, 1, 2, 3]),
        _dump(2, [], [0, 1, 2, 3]),
    ]
    a = analyze_dumps(dumps)
    (st,) = a.stalls
    assert (st.op, st.seq, st.never_entered, st.unknown) == ("all_reduce", 2, (1,), (2, 3))
    assert a.missing_dumps == (3,)
    assert any(n.startswith("no dump from rank 3: whether they entered") for n in a.notes)
    assert any("rank 2 hold no entry" in n for n in a.notes)


def test_wrapped_buffer_is_past_the_op_not_absent() -> None:
    # rank 1's buffer no longer holds #1 … #3: it entered them (its later entries say so)
    r0 = [_e(i, i, "all_reduce", [[8]], [[8]], i < 3) for i in (1, 2, 3)]
    r1 = [_e(i, i, "all_reduce", [[8]], [[8]], False) for i in (4, 5)]
    r2 = [_e(1, 1, "all_reduce", [[8]], [[8]], True), _e(2, 2, "all_reduce", [[8]], [[8]], True)]
    (st,) = analyze_dumps(
        [_dump(0, r0, [0, 1, 2]), _dump(1, r1, [0, 1, 2]), _dump(2, r2, [0, 1, 2])]
    ).stalls
    assert (st.seq, st.never_entered, [w.rank for w in st.stuck], st.finished) == (
        3,
        (2,),
        [0],
        (1,),
    )


def test_shared_set_without_two_dumps_names_them(shared_traces: Path) -> None:
    d = _shared_set(shared_traces)
    dumps = read_dumps(
        sorted(p for p in d.glob("_dump_*") if p.name not in ("_dump_13", "_dump_15"))
    )
    a = analyze_dumps(dumps)
    (root,) = a.roots
    assert (root.pg_desc, root.op, root.never_entered) == (
        "EXPERT_MODEL_PARALLEL_GROUP",
        "all_to_all",
        (9, 14),
    )
    assert root.unknown == (13, 15) and a.missing_dumps == (13, 15)
    (note,) = [n for n in a.notes if n.startswith("no dump from ranks 13, 15: ")]
    assert "EXPERT_MODEL_PARALLEL_GROUP" in note and "cannot be ruled out" in note


def test_different_recorder_versions_are_noted() -> None:
    done = _e(1, 1, "all_reduce", [[8]], [[8]], True)
    old_entry = {k: v for k, v in done.items() if k not in ("is_p2p", "pg_id")}  # 2.3's fields
    old = parse_dump(
        {"version": "2.3", "pg_config": {}, "entries": [old_entry]}, Path("r_1"), "pickle", None, 1
    )
    a = analyze_dumps([_dump(0, [done, _e(2, 2, "all_reduce", [[8]], [[8]], False)], [0, 1]), old])
    (st,) = a.stalls
    assert (st.seq, st.never_entered) == (2, (1,))
    assert any(
        "different flight-recorder versions (2.10 on rank 0; 2.3 on rank 1)" in n for n in a.notes
    )
