"""Issue 21: flight-recorder dumps → stuck and mismatched collectives.

Truth by construction: the hand-built dumps (tests/data/flightrec/make_dumps.py) and the
real gloo dumps torch 2.13 wrote here (make_gloo_dumps.py) each encode who never arrived.
Where torch's own matcher (torch.distributed.flight_recorder) runs on the same dumps, its
answer must equal ours.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import testpaths

from gpudiag.analysis.hangs.stuck import analyze_dumps
from gpudiag.errors import InputError
from gpudiag.traces.runfiles.flightrec import (
    PlainUnpickler,
    loads_plain,
    rank_from_dump_name,
    read_dump,
    read_dumps,
)

DATA = testpaths.DATA / "flightrec"
DUMP_AT = 1_796_000_000_000_000_000 + 120 * 10**9  # make_dumps.py's dump time


def _load(tmp_path: Path, name: str, at_ns: dict[int, int] | None = None) -> list:
    """Copy a fixture (git does not keep mtimes) and stamp each file with its dump time."""
    out = tmp_path / name
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DATA / name, out)
    for f in out.iterdir():
        r = rank_from_dump_name(f)
        t = at_ns[r] if at_ns and r is not None else DUMP_AT
        os.utime(f, ns=(t, t))
    return read_dumps(sorted(out.iterdir()))


def test_missing_rank_names_rank_3_and_the_waiters(tmp_path: Path) -> None:
    a = analyze_dumps(_load(tmp_path, "nccl_missing_rank"))
    assert not a.incomplete
    (st,) = a.stalls
    assert (st.op, st.seq, st.pg_desc, st.backend) == ("all_reduce", 12, "default_pg", "nccl")
    assert st.never_entered == (3,)
    assert st.culprits == (3,)
    # Entries created at T0+20/21/22 s, dumped at T0+120 s.
    assert [(w.rank, w.waited_ns) for w in st.stuck] == [
        (0, 100 * 10**9),
        (1, 99 * 10**9),
        (2, 98 * 10**9),
    ]
    assert st.members == (0, 1, 2, 3) and not st.members_inferred
    assert st.input_sizes == ((1024,),) and st.input_dtypes == ("Float",)


def test_a_removed_dump_is_named_never_guessed(tmp_path: Path) -> None:
    a = analyze_dumps(_load(tmp_path, "nccl_missing_dump"))
    assert a.incomplete and a.missing_dumps == (3,)
    (st,) = a.stalls
    assert st.never_entered == () and st.unknown == (3,)
    assert st.culprits == ()


def test_nested_groups_root_is_the_tp_stall(tmp_path: Path) -> None:
    a = analyze_dumps(_load(tmp_path, "xccl_nested_groups"))
    root, other = a.stalls
    assert (root.op, root.seq, root.pg_desc, root.backend) == ("all_gather", 5, "tp1", "xccl")
    assert root.never_entered == (3,) and [w.rank for w in root.stuck] == [2]
    assert root.explained_by is None
    assert (other.op, other.seq, other.pg_desc) == ("all_reduce", 9, "default_pg")
    assert other.never_entered == (2, 3)
    assert other.explained_by == "all_gather #5 (tp1, pg 2)"
    assert other.blocked_in == ((2, "all_gather #5 (tp1, pg 2)"),)
    assert a.roots == (root,)


def test_size_mismatch_culprit(tmp_path: Path) -> None:
    a = analyze_dumps(_load(tmp_path, "nccl_size_mismatch"))
    (m,) = a.mismatches
    assert (m.op, m.seq) == ("all_reduce", 3)
    (mm,) = m.mismatches
    assert (mm.rank, mm.what) == (1, "input_sizes")
    assert "1024" in mm.expected and "512" in mm.found
    assert m.culprits == (1,)


def test_schema_2_3_dtype_mismatch_then_missing_rank(tmp_path: Path) -> None:
    dumps = _load(tmp_path, "nccl_v2_3_dtype")
    assert {d.version for d in dumps} == {"2.3"}
    assert all(not d.pg_status for d in dumps)
    a = analyze_dumps(dumps)
    (m,) = a.mismatches
    assert (m.op, m.seq, m.mismatches[0].rank, m.mismatches[0].what) == (
        "broadcast",
        7,
        1,
        "dtypes",
    )
    (st,) = a.stalls
    assert (st.op, st.seq, st.never_entered) == ("all_reduce", 8, (1,))


def test_p2p_after_coalesced(tmp_path: Path) -> None:
    dumps = _load(tmp_path, "nccl_p2p_coalesced")
    assert {d.fmt for d in dumps} == {"json"}
    assert dumps[0].pg_status["0"]["last_completed_collective"] == 4  # strings in JSON
    a = analyze_dumps(dumps)
    (st,) = a.stalls
    assert st.p2p and st.op == "send 0->1" and st.seq == 2
    assert st.never_entered == (1,) and [w.rank for w in st.stuck] == [0]
    assert not a.mismatches  # the coalesced unit matched on both ranks


def test_rank_from_names_with_hosts() -> None:
    assert rank_from_dump_name(Path("nccl_trace_rank_node07_40")) == 40
    assert rank_from_dump_name(Path("gloo_trace_rank_1.json")) == 1
    assert rank_from_dump_name(Path("trace")) is None


def _real_gloo(tmp_path: Path, name: str) -> list:
    stamps = json.loads((DATA / "gloo_hang.dumped_ns.json").read_text())
    return _load(tmp_path, name, {int(k): v for k, v in stamps.items()})


@pytest.mark.parametrize("name", ["gloo_hang", "gloo_hang_json"])
def test_real_gloo_dumps(tmp_path: Path, name: str) -> None:
    dumps = _real_gloo(tmp_path, name)
    assert {d.version for d in dumps} == {"2.10"}
    a = analyze_dumps(dumps)
    (st,) = a.stalls
    assert (st.op, st.seq, st.pg_desc, st.backend) == ("all_reduce", 6, "default_pg", "gloo")
    assert st.never_entered == (1,) and [w.rank for w in st.stuck] == [0]
    # make_gloo_dumps.py dumped 3 s after start; rank 0 entered #6 at once.
    assert 1 * 10**9 < st.stuck[0].waited_ns < 4 * 10**9
    # gloo writes an empty pg_config: the members are inferred, and said so.
    assert st.members == (0, 1) and st.members_inferred
    assert any("empty pg_config" in n for n in a.notes)


def test_pickle_and_json_of_the_same_dump_agree(tmp_path: Path) -> None:
    p = read_dumps(sorted((DATA / "gloo_hang").iterdir()))
    j = read_dumps(sorted((DATA / "gloo_hang_json").iterdir()))
    for a, b in zip(p, j, strict=True):
        ka = [(e.seq, e.op, e.done, e.input_sizes, e.created_ns) for e in a.entries]
        kb = [(e.seq, e.op, e.done, e.input_sizes, e.created_ns) for e in b.entries]
        assert ka == kb


# --- bad inputs: one line each, nothing runs ---------------------------------------


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {tmp_path / 'PWNED'}",))

    f = tmp_path / "evil_0"
    f.write_bytes(pickle.dumps({"version": "2.10", "entries": [Evil()]}))
    with pytest.raises(InputError) as e:
        read_dump(f)
    assert "refused" in str(e.value) and "system" in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "PWNED").exists()
    # The committed copy too.
    with pytest.raises(InputError, match="refused"):
        read_dump(DATA / "bad" / "evil_0")
    assert not (DATA / "PWNED").exists()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("truncated_0", "truncated"),
        ("empty_0", "empty file"),
        ("future_0", "version '3.0' not supported"),
        ("notadump_0", "not a flight-recorder dump"),
    ],
)
def test_bad_files_one_line(name: str, words: str) -> None:
    with pytest.raises(InputError) as e:
        read_dump(DATA / "bad" / name)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_unpickler_refuses_every_global() -> None:
    import io

    for obj in (set(), frozenset({1}), bytearray(b"x"), complex(1, 2)):
        with pytest.raises(InputError, match="refused"):
            loads_plain(pickle.dumps(obj, protocol=2), "x")
    assert PlainUnpickler(io.BytesIO(pickle.dumps({"a": (1, [2.0, None, "s"])}))).load() == {
        "a": (1, [2.0, None, "s"])
    }


def test_two_dumps_for_one_rank(tmp_path: Path) -> None:
    for n in ("a_0", "b_0"):
        shutil.copy(DATA / "nccl_size_mismatch" / "rank_0", tmp_path / n)
    with pytest.raises(InputError, match="second flight-recorder dump for rank 0"):
        read_dumps(sorted(tmp_path.iterdir()))


# --- torch's own matcher on the same dumps -----------------------------------------


def _torch_answer(tmp_path: Path, name: str, fill_pg_config: bool = False) -> list[tuple]:
    """(group desc, op, seq, missing ranks, mismatching ranks) of every flagged collective."""
    pytest.importorskip("torch")
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    # torch cannot infer a prefix from names that carry host names (pytorch#140879) and
    # reads pickles only: give it rank_<R> pickles of the same content.
    out = tmp_path / f"torch_{name}"
    out.mkdir(parents=True)
    for f in (DATA / name).iterdir():
        raw = f.read_bytes()
        obj = json.loads(raw) if raw[:1] == b"{" else loads_plain(raw, f)
        if fill_pg_config:
            obj["pg_config"] = {
                "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"},
            }
        (out / f"rank_{rank_from_dump_name(f)}").write_bytes(pickle.dumps(obj))
    args = JobConfig().parse_args([str(out), "--allow-incomplete-ranks", "-p", "rank_"])
    details, version = read_dir(args)
    db = build_db(details, args, version)
    flagged = []
    for c in db.collectives:
        if not c.pass_check or c.missing_ranks:
            op = c.collective_name.split(":", 1)[1]
            seq = c.p2p_seq_id if op.split(" ")[0] in ("send", "recv") else c.collective_seq_id
            bad = tuple(sorted(c.mismatch_collectives or {}))
            flagged.append(
                (c.pg_desc.split(":", 1)[1], op, seq, tuple(sorted(c.missing_ranks or ())), bad)
            )
    return flagged


def _our_answer(tmp_path: Path, name: str) -> list[tuple]:
    a = analyze_dumps(_load(tmp_path, name))
    out = [
        (s.pg_desc, s.op, s.seq, s.never_entered, tuple(m.rank for m in s.mismatches))
        for s in (*a.stalls, *a.mismatches)
    ]
    return sorted(set(out))


@pytest.mark.parametrize(
    "name", ["nccl_missing_rank", "xccl_nested_groups", "nccl_p2p_coalesced", "nccl_size_mismatch"]
)
def test_equal_to_torch_matcher(tmp_path: Path, name: str) -> None:
    assert _our_answer(tmp_path, name) == sorted(set(_torch_answer(tmp_path, name)))


def test_torch_matcher_says_nothing_without_the_dump(tmp_path: Path) -> None:
    # With rank 3's dump gone torch flags nothing; gpudiag names the dump as missing.
    assert _torch_answer(tmp_path, "nccl_missing_dump") == []
    a = analyze_dumps(_load(tmp_path / "ours", "nccl_missing_dump"))
    assert a.missing_dumps == (3,)


def test_torch_matcher_on_real_gloo_needs_a_pg_config(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # torch 2.13's gloo writes pg_config {"": {... "ranks": "[]"}}: torch's own matcher
    # fails on it (KeyError ('0', 0)); given the real membership it agrees with gpudiag.
    with pytest.raises(KeyError):
        _torch_answer(tmp_path / "a", "gloo_hang")
    theirs = _torch_answer(tmp_path / "b", "gloo_hang", fill_pg_config=True)
    assert theirs == [("default_pg", "all_reduce", 6, (1,), ())]
    ours = _real_gloo(tmp_path / "c", "gloo_hang")
    (st,) = analyze_dumps(ours).stalls
    assert (st.pg_desc, st.op, st.seq, st.never_entered) == theirs[0][:4]
