"""The Kineto loader on real traces of every era and on the hand-built fixtures."""

from pathlib import Path

import numpy as np
import pytest
from testpaths import DATA

from gpudiag.errors import InputError
from gpudiag.traces.kineto import load_kineto, rank_from_filename
from gpudiag.traces.load import load_run
from gpudiag.traces.schema import Kind


def _count(tl, kind: Kind, gpu: bool | None = None) -> int:
    m = tl.kind == kind
    if gpu is not None:
        m &= tl.gpu_lane_mask()[tl.lane] == gpu
    return int(m.sum())


@pytest.mark.parametrize(
    ("rel", "rank", "rank_from", "nccl_kernels"),
    [
        ("sampled_2rank_a2a/rank-1.json.gz", 1, "distributedInfo", 10),
        ("a100x8_r3/rank-3.json.gz", 3, "distributedInfo", 60),
        ("a100x2_r0_pgcfg/rank-0.json.gz", 0, "distributedInfo", 21),
        ("mi300x_ddp8_r0_rccl/rank-0.json.gz", 0, "distributedInfo", 17),
        # 1 NCCL all-gather and 73 NVLS multimem all-reduce kernels (issue 24: one
        # classification of communication)
        ("b200x8_r0_infer/rank-0.json.gz", 0, "distributedInfo", 74),
        ("edge_amd_mi250/mi250.json.gz", 0, "default", 0),
        ("edge_distinfo_no_rank/a100.json.gz", 0, "default", 0),
    ],
)
def test_real_traces_load_with_rank_and_nccl_kernels(
    kineto_sets, rel, rank, rank_from, nccl_kernels
):
    tl = load_kineto(kineto_sets / rel)
    assert tl.rank == rank
    assert tl.meta.rank_from == rank_from
    assert _count(tl, Kind.COMM, gpu=True) == nccl_kernels
    tl.validate()


def test_legacy_epoch_microseconds_keep_nanosecond_precision(kineto_sets):
    tl = load_kineto(kineto_sets / "a100x8_r3/rank-3.json.gz")
    steps = np.flatnonzero(tl.kind == Kind.STEP)
    # integer epoch-µs timestamps convert exactly (no float rounding at 1.6e18 ns)
    assert (tl.start_ns[steps] % 1000 == 0).all()
    assert tl.start_ns.min() > 1_600_000_000_000_000_000


def test_gpu_work_is_linked_to_its_launch(kineto_sets):
    tl = load_kineto(kineto_sets / "a100x2_r0_pgcfg/rank-0.json.gz")
    gpu = tl.gpu_lane_mask()[tl.lane] & np.isin(
        tl.kind, [Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET]
    )
    linked = tl.launch_ns[gpu] >= 0
    assert linked.mean() > 0.95
    assert (tl.launch_ns[gpu][linked] <= tl.start_ns[gpu][linked]).all()


def test_collective_bytes_from_args(kineto_sets):
    tl = load_kineto(kineto_sets / "a100x2_r0_pgcfg/rank-0.json.gz")
    comm = (tl.kind == Kind.COMM) & tl.gpu_lane_mask()[tl.lane]
    assert (tl.nbytes[comm] > 0).all()


def test_legacy_2021_layout():
    tl = load_kineto(DATA / "legacy_2021/trainer_worker0.pt.trace.json")
    assert tl.meta.era == "kineto-2021"
    assert _count(tl, Kind.STEP) == 2  # ProfilerStep# as an Operator
    assert _count(tl, Kind.COMM, gpu=True) == 2
    assert "gpu:0:7" in tl.lanes and "gpu:0:21" in tl.lanes  # "stream 7" string tids
    assert (tl.launch_ns[tl.gpu_lane_mask()[tl.lane]] >= 0).all()


def test_nccl_219_and_symmetric_kernel_names_are_communication():
    tl = load_kineto(DATA / "nccl219_data/host_1000.pt.trace.json.gz")
    names = {tl.names[i] for i in tl.name[(tl.kind == Kind.COMM) & tl.gpu_lane_mask()[tl.lane]]}
    assert any(n.startswith("ncclDevKernel_") for n in names)
    assert any(n.startswith("ncclSymDevKernel_") for n in names)


def test_cpu_only_gloo_trace(kineto_sets):
    tl = load_kineto(kineto_sets / "edge_cpu_only/rank-34.json.gz")
    assert tl.rank == 34 and not tl.meta.has_gpu
    assert _count(tl, Kind.COMM) == 10  # gloo:all_reduce ranges


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.json.gz", 3),
        ("rank3.pt.trace.json", 3),
        ("worker_12.json", 12),
        ("host_1234.1700000.pt.trace.json", None),
        ("trainer.json", None),
    ],
)
def test_rank_from_file_name(name, rank):
    assert rank_from_filename(Path(name)) == rank


def test_file_name_rank_used_when_trace_has_none(tmp_path, kineto_sets):
    src = kineto_sets / "edge_no_distinfo/a100.json.gz"
    (tmp_path / "worker5.json.gz").write_bytes(src.read_bytes())
    tl = load_kineto(tmp_path / "worker5.json.gz")
    assert (tl.rank, tl.meta.rank_from) == (5, "file name")


def test_two_files_with_the_same_rank_fail(tmp_path, kineto_sets):
    src = (kineto_sets / "sampled_2rank_a2a/rank-0.json.gz").read_bytes()
    (tmp_path / "a.json.gz").write_bytes(src)
    (tmp_path / "b.json.gz").write_bytes(src)
    with pytest.raises(InputError, match="claims rank 0"):
        load_run(tmp_path).ranks  # noqa: B018  (loading checks the ranks)


def test_load_run_orders_ranks(kineto_sets):
    run = load_run(kineto_sets / "sampled_2rank_a2a")
    assert [r.rank for r in run.ranks] == [0, 1]
    df = run.ranks[1].to_frame()
    assert {"lane", "kind", "name", "start_ns", "end_ns", "step"} <= set(df.columns)


@pytest.mark.parametrize("slice_len", [1, 997])
def test_event_columns_do_not_depend_on_slicing(kineto_sets, slice_len):
    """The per-slice records (EventColumns) join into the same columns, in event order and
    with the record's dtypes, however the event list was cut."""
    from gpudiag.traces.core.common import LoadOptions, NamePatterns
    from gpudiag.traces.kineto import decode, read_bytes
    from gpudiag.traces.kineto.columns import GET_PH, Columns, EventColumns

    p = kineto_sets / "sampled_2rank_a2a/rank-0.json.gz"
    events = decode(p, read_bytes(p)).traceEvents
    whole, sliced = Columns(NamePatterns(LoadOptions())), Columns(NamePatterns(LoadOptions()))
    whole.add(events, map(GET_PH, events))
    for i in range(0, len(events), slice_len):
        sliced.add(events[i : i + slice_len], map(GET_PH, events[i : i + slice_len]))
    a, b = whole.columns(), sliced.columns()
    assert len(a.ts_us) > 1000
    for field, x, y, empty in zip(EventColumns._fields, a, b, EventColumns.empty(0), strict=True):
        assert x.dtype == y.dtype == empty.dtype, field
        if field not in ("name", "coll_name", "lane_key"):  # ids: compared as what they name
            assert np.array_equal(x, y), field
    assert [whole.lanes[k] for k in a.lane_key.tolist()] == [
        sliced.lanes[k] for k in b.lane_key.tolist()
    ]
    names_a, names_b = list(whole.names), list(sliced.names)
    assert [names_a[i] for i in a.name] == [names_b[i] for i in b.name]
    assert [names_a[i] if i >= 0 else None for i in a.coll_name] == [
        names_b[i] if i >= 0 else None for i in b.coll_name
    ]
    assert whole.columns().ts_us.size == 0  # the slices were handed over, not kept


def test_gunzip_is_isal_and_the_standard_gzip_reads_the_same(monkeypatch, kineto_sets):
    """isal (a dependency) gunzips files past SMALL_GZIP_BYTES; the standard library's gzip,
    used below it and where isal cannot be imported, gives the same timeline."""
    import gzip

    from gpudiag.traces.kineto import whole

    pytest.importorskip("isal")
    # 1.8 MB (124 KB gzipped): two streaming blocks
    p = kineto_sets / "sampled_2rank_a2a/rank-0.json.gz"
    assert p.stat().st_size >= whole.SMALL_GZIP_BYTES
    assert whole._gzip_for(p.stat().st_size).__name__ == "isal.igzip"
    assert whole._gzip_for(whole.SMALL_GZIP_BYTES - 1) is gzip
    fast = load_kineto(p).to_frame()
    monkeypatch.setattr(whole, "SMALL_GZIP_BYTES", 1 << 40)  # every file through gzip
    slow = load_kineto(p).to_frame()
    assert len(fast) > 1000
    assert fast.equals(slow)


def test_without_isal_the_standard_gzip_is_used():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['isal'] = None\n"  # an environment where isal cannot import
        "import gzip\n"
        "from gpudiag.traces.kineto import whole\n"
        "assert whole._gzip_for(1 << 30) is gzip, whole._gzip_for(1 << 30)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_last_boundary_is_the_whole_reversed_blocks_answer():
    """The tail-first search finds the boundary reversing the whole block finds, wherever
    it lies: inside the first tail, across its edge, far before it, or nowhere."""
    import random

    from gpudiag.traces.kineto import stream

    def whole(block: bytes):
        cut = stream._BOUNDARY_REVERSED.search(block[::-1])
        return None if cut is None else (len(block) - cut.end() + 1, len(block) - 1 - cut.start())

    rng = random.Random(7)
    tail = stream._TAIL
    blocks = [b"", b"x" * 10, b'{"a": 1}, {"b"', b"}, {" + b"y" * (3 * tail)]
    for where in (tail - 1, tail, tail + 1, tail + 2, 9 * tail, 70 * tail):
        for sep in (b"},{", b"},\n  {", b"}   ,{"):
            n = where + len(sep) + rng.randrange(3)
            body = bytearray(b"z" * n)
            body[n - where - len(sep) : n - where] = sep  # the boundary ends `where` before the end
            blocks.append(bytes(body))
    for _ in range(200):
        parts = [rng.choice([b"a", b"}", b"{", b",", b" ", b"\n", b"xyz" * 50]) for _ in range(400)]
        blocks.append(b"".join(parts))
    for b in blocks:
        assert stream._last_boundary(b) == whole(b)
