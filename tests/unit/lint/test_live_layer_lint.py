"""live/'s ruff config: the monitor reads the run directory through traces and judges it with
analysis; importing collect (the writer), report, api or cli there fails lint."""

from __future__ import annotations

import subprocess

import pytest
from ruff_cli import ruff
from testpaths import ROOT


def _tid251(source: str) -> list[str]:
    out = subprocess.run(
        [
            *ruff(),
            "check",
            "--no-cache",
            "--select",
            "TID251",
            "--output-format",
            "concise",
            "--stdin-filename",
            "gpudiag/live/layer_probe.py",
            "-",
        ],
        input=f'"""Probe."""\n\n{source}\n',
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    return [line for line in out.stdout.splitlines() if "TID251" in line]


@pytest.mark.parametrize(
    "source",
    [
        "from gpudiag.collect import launcher",
        "import gpudiag.collect.samplers.conditions",
        "from gpudiag import report",
        "from gpudiag.api.load import load_run",
        "import gpudiag.cli.main",
        "import torch",
    ],
)
def test_a_writer_or_renderer_import_fails_lint_in_live(source: str) -> None:
    assert _tid251(source), f"ruff let {source!r} through in gpudiag/live/"


def test_the_readers_and_rules_stay_allowed_in_live() -> None:
    src = (
        "from gpudiag.analysis.run.online import LiveRules\n"
        "from gpudiag.traces.runfiles.telemetry import StepsFollower\nfrom gpudiag import rundir"
    )
    assert _tid251(src) == []
