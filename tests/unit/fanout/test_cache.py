"""Issue 23: the per-rank result cache (gpudiag/fanout/cache.py).

Real traces go through the real analysis; the cache's effect is observed by counting the
files the mapper behind it is given (a hit never reaches it) and by comparing the
Diagnosis JSON with and without the cache.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from testpaths import ROOT

import gpudiag
from gpudiag.api.load import diagnose
from gpudiag.config import LoaderRules, Thresholds
from gpudiag.fanout import cache
from gpudiag.fanout.pool import serial_map
from gpudiag.fanout.work import RankWork
from gpudiag.rundir import layout as rundir
from gpudiag.traces.core.common import LoadOptions
from gpudiag.traces.load import load_run

REPO = ROOT
A100 = "kineto/a100x8_r3/rank-3.json.gz"
SMALL = "kineto/sampled_2rank_a2a"


class Counting:
    """A serial mapper that counts the items it is given."""

    def __init__(self) -> None:
        self.items = 0

    def __call__(self, fn: Any, items: Any) -> list[Any]:
        self.items += len(items)
        return serial_map(fn, items)


def _analyse(
    paths: list[Path], home: Path, th: Thresholds | None = None, **kw: Any
) -> tuple[str, Counting, cache.CacheStats]:
    th = th or Thresholds()
    inner, stats = Counting(), cache.CacheStats()
    mapper = cache.cached_map(inner, user_dir=home, stats=stats, **kw)
    run = load_run(*paths, options=LoadOptions.from_thresholds(th))
    d = diagnose(run, th, map=mapper)
    return json.dumps(d.to_json(), sort_keys=True), inner, stats


def _plain(paths: list[Path]) -> str:
    run = load_run(*paths)
    return json.dumps(diagnose(run, Thresholds(), map=serial_map).to_json(), sort_keys=True)


@pytest.fixture
def traces(shared_traces: Path, tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    shutil.copytree(shared_traces / SMALL, d)
    return d


def _entries(d: Path) -> list[Path]:
    return sorted(d.glob(f"*{cache.SUFFIX}")) if d.is_dir() else []


def test_second_analysis_is_answered_by_the_cache(traces, tmp_path):
    home = tmp_path / "home"
    first, inner1, s1 = _analyse([traces], home)
    assert (inner1.items, s1.misses, s1.hits, s1.stored) == (2, 2, 0, 2)
    assert len(_entries(home)) == 2
    second, inner2, s2 = _analyse([traces], home)
    assert inner2.items == 0 and s2.hits == 2 and s2.stored == 0
    assert second == first == _plain([traces])


@pytest.mark.parametrize(
    "name",
    [
        "kineto/a100x8_r3",
        "kineto/mi300x_ddp8_r0_rccl",
        "kineto/edge_cpu_only",
        "kineto/edge_mi300x_triton_tiny",
        "kineto/rtx2080ti_dataloader_nostep",
        "nsys/nsys-ai/mock.sqlite",
        "nsys/jacobi-mpi/report1.sqlite",
    ],
)
def test_cached_results_give_the_same_diagnosis(shared_traces, tmp_path, name):
    path = shared_traces / name
    first, _, s1 = _analyse([path], tmp_path / "home")
    assert s1.stored >= 1
    second, inner, s2 = _analyse([path], tmp_path / "home")
    assert inner.items == 0 and s2.hits == s1.stored
    assert second == first == _plain([path])


def test_a_changed_file_misses(traces, tmp_path):
    home = tmp_path / "home"
    _analyse([traces], home)
    f = traces / "rank-1.json.gz"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # same bytes, newer mtime
    _, inner, s = _analyse([traces], home)
    assert (inner.items, s.hits, s.misses) == (1, 1, 1)
    # rewritten with other contents (a step ends later): a miss, and the new trace's result
    before = _plain([traces])
    doc = json.loads(gzip.decompress(f.read_bytes()))
    step = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    step["dur"] += 5_000
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    out, inner, s = _analyse([traces], home)
    assert inner.items == 1 and out == _plain([traces]) != before


@pytest.mark.parametrize(
    "change",
    [
        {"comm_op_re": r"^(nccl|gloo):"},
        {"truncated_step_ratio": 0.4},
        {"step_re": r"^ProfilerStep#(\d+)$"},
        {"data_re": r"^never$"},
        {"comm_kernel_re": r"^nccl"},
        {"comm_host_re": r"^never$"},
        {"loader": LoaderRules(user_step_min_ranges=4)},
        {"loader": LoaderRules(clock_late_ns=1)},
        {"loader": LoaderRules(launch_linked_min_ratio=0.9)},
    ],
)
def test_a_threshold_of_the_per_rank_work_misses(traces, tmp_path, change):
    home = tmp_path / "home"
    _analyse([traces], home)
    _, inner, s = _analyse([traces], home, Thresholds().replace(**change))
    assert inner.items == 2 and s.hits == 0


def test_launch_gap_threshold_misses_and_cross_rank_thresholds_hit(traces, tmp_path):
    home = tmp_path / "home"
    _analyse([traces], home)
    th = Thresholds()
    gap = th.replace(
        advice=dataclasses.replace(th.advice, launch_gap_ns=th.advice.launch_gap_ns * 2)
    )
    _, inner, _ = _analyse([traces], home, gap)
    assert inner.items == 2
    # the idle threshold and straggler rules are cross-rank: the per-rank results still hold
    other = th.replace(idle_ratio_max=0.05, stragglers=dataclasses.replace(th.stragglers))
    out, inner, s = _analyse([traces], home, other)
    assert inner.items == 0 and s.hits == 2
    run = load_run(traces)
    assert out == json.dumps(diagnose(run, other, map=serial_map).to_json(), sort_keys=True)


class Recorder:
    """Stands in for Thresholds and records every attribute path read from it."""

    def __init__(self, real: Any, seen: set[str], prefix: str = "") -> None:
        self._real, self._seen, self._prefix = real, seen, prefix

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        path = self._prefix + name
        if dataclasses.is_dataclass(value):
            return Recorder(value, self._seen, path + ".")
        self._seen.add(path)
        return value


@pytest.mark.parametrize(
    "name", ["kineto/a100x8_r3", "kineto/edge_cpu_only", "kineto/" + "sampled_2rank_a2a"]
)
def test_per_rank_work_reads_only_the_keyed_thresholds(shared_traces, name):
    # If the per-rank analysis starts reading another threshold, add it to RANK_THRESHOLDS
    seen: set[str] = set()
    for source in load_run(shared_traces / name).sources:
        RankWork(Recorder(Thresholds(), seen))(source)  # type: ignore[arg-type]
    assert seen and seen <= set(cache.RANK_THRESHOLDS)


def test_corrupt_entries_are_ignored_and_rewritten(traces, tmp_path):
    home = tmp_path / "home"
    expected, _, _ = _analyse([traces], home)
    a, b = _entries(home)
    good_b = b.read_bytes()
    a.write_bytes(a.read_bytes()[:-7])  # cut short
    raw = bytearray(good_b)
    raw[-3] ^= 0xFF  # one byte flipped in the payload: the checksum no longer matches
    b.write_bytes(bytes(raw))
    out, inner, s = _analyse([traces], home)
    assert (inner.items, s.hits, s.stored) == (2, 0, 2) and out == expected
    assert b.read_bytes() == good_b  # rewritten, whole
    for junk in (b"", b"not a cache entry", cache.MAGIC + b"\x00\x00\x00\x09" + bytes(40)):
        a.write_bytes(junk)
        out, inner, _ = _analyse([traces], home)
        assert inner.items == 1 and out == expected


def test_an_entry_answers_only_for_its_own_key(traces, tmp_path):
    home = tmp_path / "home"
    _analyse([traces], home)
    a, b = _entries(home)
    a.write_bytes(b.read_bytes())  # a valid entry, under another input's name
    out, inner, s = _analyse([traces], home)
    assert inner.items == 1 and s.hits == 1 and out == _plain([traces])


def _forged(key: dict[str, Any], data: Any) -> bytes:
    import hashlib

    import msgspec

    payload = msgspec.msgpack.encode([key, data])
    return (
        cache.MAGIC + cache.FORMAT.to_bytes(4, "big") + hashlib.sha256(payload).digest() + payload
    )


def test_entries_decode_into_known_classes_only(traces, tmp_path):
    home = tmp_path / "home"
    expected, _, _ = _analyse([traces], home)
    entry = _entries(home)[0]
    import msgspec

    blob = entry.read_bytes()
    key, _ = msgspec.msgpack.decode(blob[len(cache.MAGIC) + 36 :])
    for data in (
        ["L", ["C", "subprocess", "Popen", "args", ["L", "sh"]]],
        ["L", ["C", "gpudiag.analysis.diagnose", "np", "x", 1]],
        ["L", ["C", "gpudiag.analysis.rank.analyse", "source_results"]],
        ["L", ["E", "gpudiag.analysis.rank.analyse", "RankResult", 1]],
        ["X"],
        "just a string",
        ["L", ["A", "|O", [1], b"\0" * 8]],
    ):
        entry.write_bytes(_forged(key, data))  # a valid checksum over a forged payload
        out, inner, _ = _analyse([traces], home)
        assert inner.items == 1 and out == expected


def test_encode_round_trip_keeps_types():
    import numpy as np

    from gpudiag.analysis.model.diagnosis import Mode, StepBreakdown

    value = {
        "t": (1, "a"),
        3: [1.5, None, True],
        "a": np.arange(4, dtype=np.int32),
        "s": np.float64(0.25),
        "m": Mode.GPU,
        "b": StepBreakdown(0, 1, 2, 3, 1, 1, 1, 0, 0, None),
    }
    back = cache.decode(cache.encode(value))
    assert back.keys() == value.keys() and back["t"] == (1, "a") and back[3] == [1.5, None, True]
    assert back["a"].dtype == np.int32 and back["a"].tolist() == [0, 1, 2, 3]
    assert type(back["s"]) is np.float64 and back["m"] is Mode.GPU and back["b"] == value["b"]
    with pytest.raises(TypeError):
        cache.encode(object())


def _run_dir(tmp_path: Path, shared_traces: Path) -> Path:
    run = tmp_path / "run"
    (run / rundir.RANKS_DIR).mkdir(parents=True)
    for r in range(2):
        shutil.copyfile(
            shared_traces / SMALL / f"rank-{r}.json.gz",
            run / rundir.RANKS_DIR / f"rank-{r}.json.gz",
        )
    rundir.write_manifest(run, rundir.RunManifest(gpudiag_version=gpudiag.__version__))
    return run


def test_run_directories_keep_their_cache_inside(shared_traces, tmp_path):
    run, home = _run_dir(tmp_path, shared_traces), tmp_path / "home"
    first, _, s = _analyse([run], home)
    assert s.stored == 2 and len(_entries(run / cache.RUN_DIR_CACHE)) == 2
    assert not home.exists()
    second, inner, _ = _analyse([run], home)
    assert inner.items == 0 and second == first


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _read_only(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_read_only_run_directory_is_never_written(shared_traces, tmp_path):
    # No write bit: read-only, even for root (as CI's copy of the shared traces is laid out)
    run, home = _run_dir(tmp_path, shared_traces), tmp_path / "home"
    _read_only(run)
    try:
        before = _snapshot(run)
        first, _, s = _analyse([run], home)
        assert _snapshot(run) == before and not (run / cache.RUN_DIR_CACHE).exists()
        assert s.stored == 2 and len(_entries(home)) == 2  # the user cache dir instead
        second, inner, _ = _analyse([run], home)
        assert inner.items == 0 and second == first
        # nowhere to write at all: analysed as without a cache, quietly
        shutil.rmtree(home)
        home.mkdir()
        _read_only(home)
        out, inner, s = _analyse([run], home / "sub")
        assert out == first and inner.items == 2 and s.stored == 0 and s.uncacheable == 2
        assert not (home / "sub").exists() and _snapshot(run) == before
    finally:
        _writable(tmp_path)


def test_loose_traces_are_cached_in_the_user_directory_not_beside_them(traces, tmp_path):
    before = _snapshot(traces)
    _analyse([traces], tmp_path / "home")
    assert _snapshot(traces) == before


def test_lru_eviction_bounds_the_directory(traces, tmp_path):
    home = tmp_path / "home"
    _analyse([traces], home)
    a, b = _entries(home)
    size = a.stat().st_size
    os.utime(a, (1_000_000, 1_000_000))  # a: long unused
    (home / "dead-writer.tmp").write_bytes(b"x")
    os.utime(home / "dead-writer.tmp", (1_000_000, 1_000_000))
    assert cache.evict(home, max_bytes=b.stat().st_size + size // 2) == 1
    assert _entries(home) == [b] and not (home / "dead-writer.tmp").exists()
    # a hit refreshes its entry: after a run that stores, the entries just used are kept
    _analyse([traces], home)  # a stored again, b hit
    for p in (a, b):
        os.utime(p, (1_000_000, 1_000_000))
    _, inner, s = _analyse([traces / "rank-1.json.gz"], home)  # one of them hit
    assert inner.items == 0 and s.hits == 1
    used = max(_entries(home), key=lambda p: p.stat().st_mtime)
    assert used.stat().st_mtime > 1_000_000
    # new entries as large as the old (the same results, a key as long): room for 3 of 4
    room = a.stat().st_size + b.stat().st_size + used.stat().st_size
    _, inner, s = _analyse(
        [traces], home, Thresholds().replace(truncated_step_ratio=0.45), max_bytes=room
    )
    assert s.stored == 2  # two new entries, and room for only one of the two old ones
    assert used in _entries(home) and len(_entries(home)) == 3


def test_a_timeline_analysis_stores_for_the_next_look(traces, tmp_path, monkeypatch):
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    home = tmp_path / "home"
    d = gpudiag.analyze(traces, cache=home, timeline=tmp_path / "t.json", map=serial_map)
    assert len(_entries(home)) == 2
    second, inner, s = _analyse([traces], home)
    assert inner.items == 0 and s.hits == 2
    assert second == json.dumps(d.to_json(), sort_keys=True)


def _cli(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=str(REPO), GPUDIAG_CACHE_DIR=str(home), **env)
    if cache.NO_CACHE_ENV not in env:
        e.pop(cache.NO_CACHE_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", *args],
        env=e,
        cwd=home.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_commands_share_the_cache_and_no_cache_turns_it_off(traces, tmp_path):
    home = tmp_path / "home"  # (the test session sets GPUDIAG_NO_CACHE; _cli clears it)
    out = _cli(["analyze", str(traces), "-f", "json", "--no-cache"], home)
    assert out.returncode == 0 and not _entries(home)
    assert _cli(["analyze", str(traces), "-f", "json"], home, GPUDIAG_NO_CACHE="1").returncode == 0
    assert not _entries(home)
    first = _cli(["analyze", str(traces), "-f", "json"], home)
    assert first.returncode == 0 and len(_entries(home)) == 2
    mtimes = {p: p.stat().st_mtime_ns for p in _entries(home)}
    again = _cli(["analyze", str(traces), "-f", "json"], home)
    assert again.stdout == first.stdout == out.stdout
    report = _cli(["report", str(traces), "-o", str(tmp_path / "r.html")], home)
    diff = _cli(["diff", str(traces), str(traces), "-f", "json"], home)
    assert report.returncode == 0 and diff.returncode == 0
    assert set(_entries(home)) == set(mtimes)  # answered from the entries: none rewritten


_WORKER = r"""
import json, sys
from pathlib import Path
from gpudiag.fanout import cache
from gpudiag.api.load import diagnose
from gpudiag.config import Thresholds
from gpudiag.fanout.pool import serial_map
from gpudiag.traces.load import load_run
th = Thresholds()
for _ in range(3):
    d = diagnose(load_run(sys.argv[1]), th, map=cache.cached_map(serial_map, Path(sys.argv[2]),
                                                                   max_bytes=int(sys.argv[3])))
    print(json.dumps(d.to_json(), sort_keys=True))
"""


def test_concurrent_runs_share_one_directory_safely(traces, tmp_path):
    home = tmp_path / "home"
    expected = _plain([traces])
    # a bound that holds one entry of two: writers and evictions race each other too
    one = 0
    _analyse([traces], tmp_path / "probe")
    one = max(p.stat().st_size for p in _entries(tmp_path / "probe"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(cache.NO_CACHE_ENV, None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(traces), str(home), str(one + one // 2)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert out.splitlines() == [expected] * 3
    assert not list(home.glob("*.tmp"))
    for entry in _entries(home):  # every entry left is whole and valid
        assert entry.read_bytes().startswith(cache.MAGIC)
    out, _, _ = _analyse([traces], home)
    assert out == expected


def test_the_code_fingerprint_covers_every_layer_of_the_package():
    # a change to the analysis (not only to the fan-out) must miss the cache
    import gpudiag
    from gpudiag.fanout import cache

    assert Path(gpudiag.__file__).resolve().parent == cache.CODE_ROOT
    assert (cache.CODE_ROOT / "analysis" / "diagnose.py").is_file()
