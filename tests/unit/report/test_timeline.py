"""The annotated timeline parses back with the expected tracks, slices and flows.

Checked against the Trace Event Format (JSON), and against the Diagnosis it was drawn from:
the part slices of each rank cover exactly its parts when nothing was coalesced.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

import gpudiag
from gpudiag.errors import UsageError
from gpudiag.report.timeline import TRACKS

PHASES = {"M", "X", "C", "i", "s", "f"}


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, kineto_sets):
    out = tmp_path_factory.mktemp("tl") / "timeline.json.gz"
    d = gpudiag.analyze(kineto_sets / "sampled_2rank_a2a", jobs=1, timeline=out)
    return d, _load(out)


def test_every_event_is_trace_event_format(two_ranks):
    _, doc = two_ranks
    evs = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["tool"] == "gpudiag"
    for e in evs:
        assert e["ph"] in PHASES and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float) and "tid" in e
        if e["ph"] in ("s", "f"):
            assert isinstance(e["id"], int)


def test_one_process_per_rank_with_the_tracks(two_ranks):
    _, doc = two_ranks
    evs = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in evs if e.get("name") == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in evs if e.get("name") == "thread_name"}
    assert {(r, t) for r in (0, 1) for t in TRACKS} <= threads


def test_part_slices_add_up_to_the_diagnosis(two_ranks):
    d, doc = two_ranks
    res = doc["otherData"]["resolution_ns"]
    tids = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("name") == "thread_name"
    }
    total: Counter[tuple[int, str]] = Counter()
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "part":
            total[(e["pid"], tids[(e["pid"], e["tid"])])] += e["dur"] * 1000
    for r in d.ranks:
        steps = [s for s in d.steps if s.rank == r.rank]
        want = {
            "compute": sum(s.compute_ns for s in steps),
            "comm-wait": sum(s.comm_wait_ns for s in steps),
            "data-wait": sum(s.data_wait_ns for s in steps),
            "other": sum(s.other_ns for s in steps),
        }
        for part, ns in want.items():
            if res[str(r.rank)][part] == 0:  # exact when not coalesced
                assert total[(r.rank, part)] == pytest.approx(ns, abs=2_000), (r.rank, part)


def test_step_slices_and_counters(two_ranks):
    d, doc = two_ranks
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert sorted((e["pid"], e["name"]) for e in steps) == sorted(
        (s.rank, f"step {s.step}") for s in d.steps
    )
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(d.steps)
    for c in counters:
        assert sum(c["args"].values()) == pytest.approx(100, abs=0.01)


def test_flows_run_from_the_last_rank_to_the_ones_that_waited(two_ranks):
    d, doc = two_ranks
    evs = doc["traceEvents"]
    s = {e["id"]: e for e in evs if e["ph"] == "s"}
    f = {e["id"]: e for e in evs if e["ph"] == "f"}
    assert s and s.keys() == f.keys()
    for i, start in s.items():
        assert start["pid"] != f[i]["pid"]
    # every collective of the trace is a slice on its rank's collectives track
    colls = [e for e in evs if e.get("cat") == "collective"]
    assert len(colls) >= d.collectives.matched * 2


def test_findings_are_instant_events_with_their_message(two_ranks):
    d, doc = two_ranks
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert {e["args"]["message"] for e in inst} == {f.message for f in d.findings}


def test_full_adds_the_kernels_and_stays_small(tmp_path, kineto_sets):
    out = tmp_path / "full.json.gz"
    gpudiag.analyze(kineto_sets / "sampled_2rank_a2a", jobs=1, timeline=out, timeline_full=True)
    doc = _load(out)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert any(k["name"].startswith("ncclKernel") for k in kernels)
    assert out.stat().st_size < 1_000_000


def test_a_saved_diagnosis_has_no_timeline(tmp_path, kineto_sets):
    saved = tmp_path / "d.json"
    saved.write_text(json.dumps(gpudiag.analyze(kineto_sets / "edge_cpu_only", jobs=1).to_json()))
    with pytest.raises(UsageError):
        gpudiag.analyze(saved, timeline=tmp_path / "t.json")


def test_the_timeline_never_replaces_a_link_and_refuses_a_directory(tmp_path, kineto_sets):
    # the rules of -o (gpudiag/_support/fileio.py): a link is written through, a directory refused
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    gpudiag.analyze(kineto_sets / "edge_cpu_only", jobs=1, timeline=link)
    assert link.is_symlink() and json.loads(target.read_text())["otherData"]["tool"] == "gpudiag"
    with pytest.raises(UsageError):
        gpudiag.analyze(kineto_sets / "edge_cpu_only", jobs=1, timeline=tmp_path)
