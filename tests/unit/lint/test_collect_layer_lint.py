"""collect/'s ruff config: an import of a later layer fails lint, absolute or relative,
while torch, pynvml and nvtx stay allowed there (the training job's packages).
"""

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
            "gpudiag/collect/layer_probe.py",
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
        "from gpudiag.analysis import gate",
        "import gpudiag.traces.load",
        "from gpudiag import report",
        "from gpudiag.api.load import load_run",
        "import gpudiag.cli.main",
        "from ..analysis import gate",
        "from ..traces.load import load_run",
        "from .. import api",
        "from ..cli import main",
    ],
)
def test_a_later_layer_import_fails_lint_in_collect(source: str) -> None:
    assert _tid251(source), f"ruff let {source!r} through in gpudiag/collect/"


def test_the_training_job_packages_stay_allowed_in_collect() -> None:
    assert _tid251("import nvtx\nimport pynvml\nimport torch\n\nfrom gpudiag import rundir") == []
