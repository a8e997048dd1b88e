"""`gpudiag analyze` as a user runs it: formats, output files, exit codes and bad input."""

import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from cli_runner import run_cli
from testpaths import SCHEMA


def test_json_output_is_valid_against_the_schema(kineto_sets):
    jsonschema = pytest.importorskip("jsonschema")
    r = run_cli("analyze", str(kineto_sets / "sampled_2rank_a2a"), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout carries only the report
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert doc["schema_version"] == 1
    assert [x["rank"] for x in doc["ranks"]] == [0, 1]
    for s in doc["steps"]:
        parts = s["compute_ns"] + s["comm_wait_ns"] + s["data_wait_ns"] + s["other_ns"]
        assert parts == s["duration_ns"]
    shares = doc["run"]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)


def test_csv_is_the_step_table(kineto_sets):
    r = run_cli("analyze", str(kineto_sets / "a100x8_r3"), "-f", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 6
    assert rows[0]["rank"] == "3" and rows[0]["step"] == "1009"
    assert {
        "duration_ns",
        "compute_ns",
        "comm_wait_ns",
        "data_wait_ns",
        "other_ns",
        "idle_ratio",
    } <= set(rows[0])


def test_output_file_by_extension_is_written_whole(tmp_path, kineto_sets):
    out = tmp_path / "d.json"
    r = run_cli("analyze", str(kineto_sets / "edge_cpu_only"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["run"]["mode"] == "cpu"
    assert [p.name for p in tmp_path.iterdir()] == ["d.json"]  # no temporary left behind
    assert r.stdout == ""


def test_table_with_steps_and_threshold(kineto_sets):
    path = str(kineto_sets / "v100x2_r1")
    r = run_cli("analyze", path, "--steps")
    assert r.returncode == 0
    assert "rank" in r.stdout and "1014" in r.stdout
    loose = run_cli("analyze", path, "--idle-threshold", "0.9", "-f", "json")
    assert not [f for f in json.loads(loose.stdout)["findings"] if f["kind"] == "idle_ratio"]


def _bad(tmp_path: Path, name: str, content: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content)
    return p


# name, content, the problem its one line names (ids: the names, so that every pytest-xdist
# worker collects the same tests)
BAD_INPUTS = [
    ("notjson.json", b"hello world", "not JSON"),
    (
        "trunc.json.gz",
        gzip.compress(b'{"traceEvents": []}' * 100, mtime=0)[:40],
        "truncated or corrupt gzip",
    ),
    ("empty.json", b"", "empty file"),
    ("noevents.json", b'{"schemaVersion": 1}', "without `traceEvents`"),
    (
        "cut.json",
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1',
        "malformed or truncated JSON",
    ),
    ("wrong.json", b'{"traceEvents": {"a": 1}}', "does not look like a PyTorch Profiler trace"),
    ("noX.json", b'{"traceEvents": []}', "holds no events"),
    ("data.parquet", b"PAR1", "unknown file type"),
]


@pytest.mark.parametrize(("name", "content", "problem"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_with_hint_and_exit_4(tmp_path, name, content, problem):
    p = _bad(tmp_path, name, content)
    r = run_cli("analyze", str(p))
    assert r.returncode == 4
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"gpudiag: error: {p}: ") and problem in lines[0]
    assert lines[1].strip().startswith("hint: ")
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_input_traceback_only_with_debug(tmp_path):
    p = _bad(tmp_path, "x.json", b"nope")
    r = run_cli("--debug", "analyze", str(p))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_directory_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    r = run_cli("analyze", str(tmp_path))
    assert r.returncode == 4 and "directory holds no traces" in r.stderr


def test_missing_path_and_duplicate_ranks(tmp_path, kineto_sets):
    r = run_cli("analyze", str(tmp_path / "nope"))
    assert r.returncode == 4 and "no such file or directory" in r.stderr
    src = (kineto_sets / "edge_no_distinfo/a100.json.gz").read_bytes()
    _bad(tmp_path, "a.json.gz", src)
    _bad(tmp_path, "b.json.gz", src)
    r = run_cli("analyze", str(tmp_path))
    assert (
        r.returncode == 4
        and "no rank found" in r.stderr
        and "distributedInfo.rank" in r.stderr
        and "rename" in r.stderr
    )


def test_usage_errors_exit_2(kineto_sets):
    assert run_cli("analyze", str(kineto_sets / "edge_cpu_only"), "-f", "xml").returncode == 2
    assert run_cli("analyze", "--no-such-flag").returncode == 2
    r = run_cli("analyze", str(kineto_sets / "edge_cpu_only"), "--idle-threshold", "3")
    assert r.returncode == 2 and "not a ratio" in r.stderr


def test_python_api_steps_frame(kineto_sets):
    import gpudiag

    d = gpudiag.analyze(kineto_sets / "mi300x_ddp8_r0_rccl")
    df = gpudiag.steps_frame(d)
    assert list(df["step"]) == [15, 16, 17]
    # attributed by launch: ~19 ms steps, 6.4 ms compute, 11.4-12.0 ms exposed NCCL
    assert df["duration_ns"].between(18.5e6, 19.1e6).all()
    assert df["compute_ns"].between(6.3e6, 6.5e6).all()
    assert df["comm_wait_ns"].between(11.4e6, 12.0e6).all()


def test_bad_file_among_several_fails_cleanly_from_a_worker_process(tmp_path, kineto_sets):
    import pickle

    from gpudiag.errors import InputError

    e = pickle.loads(pickle.dumps(InputError("x.json", "empty file", "hint")))
    assert (e.path, e.problem, e.hint, e.exit_code, str(e)) == (
        "x.json",
        "empty file",
        "hint",
        4,
        "x.json: empty file",
    )
    (tmp_path / "rank-0.json.gz").write_bytes(
        (kineto_sets / "sampled_2rank_a2a/rank-0.json.gz").read_bytes()
    )
    (tmp_path / "rank-1.json").write_bytes(b"")
    r = run_cli("analyze", str(tmp_path), "--jobs", "2")
    assert r.returncode == 4
    assert "rank-1.json: empty file" in r.stderr and "Traceback" not in r.stderr
