"""The layer rules are enforced by lint: an import that breaks a layer fails ``ruff check``.

Each case lints one line of source as if it were a new module in a layer's directory
(``--stdin-filename``), so the per-directory ruff.toml of that layer applies exactly as it
does to the real files; nothing is written into the package.
"""

from __future__ import annotations

import subprocess

import pytest
from ruff_cli import ruff
from testpaths import ROOT


def lint(path: str, source: str) -> subprocess.CompletedProcess[str]:
    """``ruff check`` of ``source`` as the file ``path`` (relative to the repository)."""
    return subprocess.run(
        [
            *ruff(),
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "--stdin-filename",
            str(ROOT / path),
            "-",
        ],
        input=source + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


BREAKING = [
    # analysis bans report, api, cli and collect
    ("gpudiag/analysis/probe.py", "from gpudiag.report.markdown import render", "gpudiag.report"),
    ("gpudiag/analysis/probe.py", "from gpudiag import report", "gpudiag.report"),
    ("gpudiag/analysis/probe.py", "import gpudiag.api.load", "gpudiag.api"),
    ("gpudiag/analysis/probe.py", "from gpudiag.cli.main import main", "gpudiag.cli"),
    (
        "gpudiag/analysis/probe.py",
        "from gpudiag.collect.rank.hook import RankHook",
        "gpudiag.collect",
    ),
    # a relative import is resolved and caught too
    ("gpudiag/analysis/probe.py", "from ..report import console", "gpudiag.report"),
    ("gpudiag/analysis/probe.py", "from .. import api", "gpudiag.api"),
    # traces bans analysis, report, api, cli and collect
    (
        "gpudiag/traces/probe.py",
        "from gpudiag.analysis.compare.gate import evaluate",
        "gpudiag.analysis",
    ),
    ("gpudiag/traces/probe.py", "from gpudiag.report import render", "gpudiag.report"),
    ("gpudiag/traces/probe.py", "from gpudiag.api.load import analyze", "gpudiag.api"),
    ("gpudiag/traces/probe.py", "import gpudiag.cli.main", "gpudiag.cli"),
    ("gpudiag/traces/nsys/probe.py", "from ...analysis import model", "gpudiag.analysis"),
    ("gpudiag/traces/nsys/probe.py", "from gpudiag.collect import nvml", "gpudiag.collect"),
    # report bans traces, api, cli and collect
    ("gpudiag/report/probe.py", "from gpudiag.traces.load import load_run", "gpudiag.traces"),
    ("gpudiag/report/probe.py", "from gpudiag.api.load import analyze", "gpudiag.api"),
    ("gpudiag/report/probe.py", "from gpudiag import cli", "gpudiag.cli"),
]


@pytest.mark.parametrize(("path", "source", "banned"), BREAKING)
def test_an_import_that_breaks_a_layer_fails_lint(path: str, source: str, banned: str) -> None:
    res = lint(path, source)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"TID251 `{banned}` is banned" in res.stdout, res.stdout


ALLOWED = [
    ("gpudiag/analysis/probe.py", "from gpudiag.traces.schema import RunTimeline"),
    ("gpudiag/analysis/probe.py", "from gpudiag.config import Thresholds"),
    ("gpudiag/traces/probe.py", "from gpudiag import rundir"),
    ("gpudiag/report/probe.py", "from gpudiag.analysis.model.diagnosis import Diagnosis"),
    ("gpudiag/probe.py", "from gpudiag.report import render"),  # api and cli sit above all
]


@pytest.mark.parametrize(("path", "source"), ALLOWED)
def test_imports_down_the_layers_pass(path: str, source: str) -> None:
    res = lint(path, f'"""A probe."""\n\n{source}\n\n__all__ = [{source.split()[-1]!r}]')
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_package_keeps_its_layers() -> None:
    res = subprocess.run(
        [*ruff(), "check", "--no-cache", "--select", "TID", "gpudiag"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
