"""Issue 23: the fixed cost of a command — only what it needs is imported, no pool for small inputs.

Each check runs a fresh interpreter (``sys.modules`` of this test process holds everything
the other tests imported) and reads its ``sys.modules`` after the command.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testpaths import ROOT

REPO = ROOT

TINY = {
    "distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"},
    "traceEvents": [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 1000,
            "dur": 1000,
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 1200,
            "dur": 600,
        },
    ],
}

_PROBE = r"""
import json, sys
{body}
print(json.dumps(sorted(sys.modules)))
"""


def _tiny_dir(tmp_path: Path, ranks: int = 1) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    for r in range(ranks):
        doc = json.loads(json.dumps(TINY))
        doc["distributedInfo"]["rank"] = r
        (d / f"rank-{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    return d


def _modules(body: str, tmp_path: Path, full: bool = False) -> set[str]:
    """The top-level packages (every module with ``full``) imported by ``body``."""
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUDIAG_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    return set(mods) if full else {m.split(".")[0] for m in mods}


def test_api_analyze_imports_no_pandas(tmp_path):
    d = _tiny_dir(tmp_path)
    mods = _modules(f"import gpudiag\nd = gpudiag.analyze({str(d)!r})\nassert d.steps", tmp_path)
    assert "numpy" in mods and "gpudiag" in mods  # the probe did analyse
    assert "pandas" not in mods
    assert "distributed" not in mods and "dask" not in mods


def test_cli_analyze_json_imports_only_what_it_needs(tmp_path):
    d = _tiny_dir(tmp_path, ranks=2)
    body = (
        "from gpudiag.cli.main import main\n"
        f"try:\n    main(['analyze', {str(d)!r}, '-f', 'json', '-o', {str(tmp_path / 'o.json')!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
    )
    mods = _modules(body, tmp_path)
    assert json.loads((tmp_path / "o.json").read_text())["ranks"]
    # no pandas (frames only), no Dask, no table renderer for JSON, no pydantic (typer's
    # coercion is replaced), and no process pool for two tiny files
    # and no typer: the quick path parses this command line (gpudiag.cli.quick)
    for heavy in ("pandas", "distributed", "dask", "rich", "pydantic", "concurrent", "typer"):
        assert heavy not in mods, heavy


def test_cli_analyze_tiny_imports_no_unused_modules(tmp_path):
    """The modules a tiny trace's analysis never runs stay unimported (each costs ms)."""
    d = _tiny_dir(tmp_path)
    body = (
        "from gpudiag.cli.main import main\n"
        f"try:\n    main(['analyze', {str(d)!r}, '-f', 'json', '--no-cache', "
        f"'-o', {str(tmp_path / 'o.json')!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
    )
    mods = _modules(body, tmp_path, full=True)
    assert json.loads((tmp_path / "o.json").read_text())["steps"]
    unused = {
        "numpy.ma",  # numpy's median of floats / percentile import it: gpudiag._support.nputil's don't
        "concurrent.futures",
        "multiprocessing",
        "pandas",
        "rich",
        # run directories and flight-recorder dumps only
        "gpudiag.traces.runfiles.flightrec",
        "gpudiag.analysis.hangs.stuck",
        "gpudiag.analysis.hangs.failure",
        "gpudiag.traces.runfiles.runend",
        "gpudiag.traces.runfiles.alerts",
        "gpudiag.traces.runfiles.jsonl",
        "gpudiag.traces.runfiles.telemetry",
        "gpudiag.api.saved",
        "gpudiag.fanout.cache",
        # other commands' and formats' modules
        "gpudiag.analysis.compare.gate",
        "gpudiag.analysis.compare.diff",
        "gpudiag.analysis.run.online",
        "gpudiag.report.console",
        "gpudiag.report.html_report",
        "gpudiag.report.frames",
    }
    assert not mods & unused, sorted(mods & unused)


def test_steps_frame_still_uses_pandas(tmp_path):
    d = _tiny_dir(tmp_path)
    body = (
        f"import gpudiag\nf = gpudiag.steps_frame(gpudiag.analyze({str(d)!r}))\nassert len(f) == 1"
    )
    assert "pandas" in _modules(body, tmp_path)


def test_version_and_help_import_no_analysis(tmp_path):
    body = (
        "from gpudiag.cli.main import main\n"
        "for a in (['--version'], ['--help'], ['analyze', '--help']):\n"
        "    try:\n        main(a)\n    except SystemExit as e:\n        assert not e.code\n"
    )
    mods = _modules(body, tmp_path)
    assert "numpy" not in mods and "pandas" not in mods and "pydantic" not in mods


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "abc"], "Invalid value for '--jobs' / '-j': Input should be a valid integer"),
        (["--idle-threshold", "x"], "Invalid value for '--idle-threshold': Input should"),
    ],
)
def test_bad_option_values_are_one_usage_error(tmp_path, args, message):
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUDIAG_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(tmp_path), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_plain_coercion_types():
    from gpudiag.cli.coerce import convert

    assert convert(int, " 12 ") == 12 and convert(float, "0.25") == 0.25
    assert convert(Path, "a/b") == Path("a/b") and convert(str, "x") == "x"
    assert convert(bool, "yes") is True and convert(bool, "0") is False
    with pytest.raises(ValueError, match="valid integer"):
        convert(int, "1.5")
    with pytest.raises(ValueError, match="valid boolean"):
        convert(bool, "maybe")


def test_small_inputs_run_in_this_process(tmp_path):
    from gpudiag.fanout.pool import SERIAL_BELOW_BYTES, _json_bytes, local_map

    d = _tiny_dir(tmp_path, ranks=3)
    items = [Item(p) for p in sorted(d.iterdir())]
    assert _json_bytes(items) < SERIAL_BELOW_BYTES
    assert local_map()(lambda _: os.getpid(), items) == [os.getpid()] * 3
    # jobs= is obeyed as given: a pool, in other processes
    pids = local_map(jobs=2)(_pid, items)
    assert os.getpid() not in pids
    # items without a file (timelines in memory) keep the pool
    assert _json_bytes([object()]) == float("inf")


class Item:
    def __init__(self, path: Path) -> None:
        self.path = path


def _pid(_: object) -> int:
    return os.getpid()


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "--help"],
        ["--debug", "gate", "--help"],
        ["report"],
        ["diff", "--bogus"],
        ["--no-color", "doctor", "--help"],
        ["run", "--help"],
    ],
)
def test_one_command_app_says_what_the_whole_app_says(argv, capsys, monkeypatch):
    """main() builds only the command it runs; its help and usage errors are the same."""
    from gpudiag.cli import main as cli

    def run() -> tuple[object, str, str]:
        code: object = None
        try:
            cli.main(argv)
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err

    one = run()
    assert len(cli._app_for(argv).registered_commands) in (0, 1)  # 0: "diff" is no command
    monkeypatch.setattr(cli, "_app_for", lambda _: cli.typer_app())
    assert one == run()


def test_app_for_picks_the_named_command_only():
    from gpudiag.cli import main as cli

    app = cli.typer_app()
    assert cli._app_for(["--help"]) is app and cli._app_for([]) is app
    assert cli._app_for(["--version", "analyze"]) is app
    assert cli._app_for(["anlyze", "x"]) is app  # a typo: the whole app suggests
    one = cli._app_for(["--debug", "analyze", "x", "--", "report"])
    assert [c.callback.__name__ for c in one.registered_commands] == ["analyze"]
    assert len(app.registered_commands) > 1  # the app itself is untouched


def test_gpudiag_run_starts_the_job_before_numpy_and_pandas(tmp_path):
    """The live monitor's rules and followers import numpy and pandas after the job started.

    Measured 2026-12-02 (load 2.2): `gpudiag run` to the job's first line 2.0-2.5 s with
    them imported before the launch, 0.85-1.19 s after.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "gpudiag",
            "run",
            "--out",
            str(tmp_path / "run"),
            "--no-analyze",
            "-q",
            "--",
            sys.executable,
            "-c",
            "import sys; print('JOB STARTED', file=sys.stderr)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    started = next(i for i, x in enumerate(lines) if "JOB STARTED" in x)
    heavy = [i for i, x in enumerate(lines) if x.rstrip().endswith(("| pandas", "|   pandas"))]
    assert all(i > started for i in heavy), (started, heavy)
    numpy = [i for i, x in enumerate(lines) if x.rstrip().split("|")[-1].strip() == "numpy"]
    assert numpy and all(i > started for i in numpy), (started, numpy)
