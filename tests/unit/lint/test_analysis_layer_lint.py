"""Analysis imports neither renderers nor the API: lint refuses such an import (issue 19)."""

from __future__ import annotations

import subprocess

import pytest
from ruff_cli import ruff
from testpaths import ROOT


def _lint_as(path: str, source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ruff(), "check", "--no-cache", "--select", "TID251", "--stdin-filename", path, "-"],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    "module",
    [
        "gpudiag.report.markdown",
        "gpudiag.api.load",
        "gpudiag.cli.main",
        "gpudiag.report.frames",
        "gpudiag.api.saved",
    ],
)
def test_an_analysis_module_may_not_import_the_layers_above(module):
    r = _lint_as("gpudiag/analysis/probe.py", f"import {module}\n")
    assert r.returncode == 1 and "TID251" in r.stdout, r.stdout + r.stderr


def test_the_api_layer_may():
    r = _lint_as("gpudiag/probe.py", "import gpudiag.report.markdown\nimport gpudiag.api.saved\n")
    assert r.returncode == 0, r.stdout + r.stderr
