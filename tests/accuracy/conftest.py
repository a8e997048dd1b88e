"""Accuracy cases: the right answer is known without gpudiag (by construction or by reference)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def nsys_cases(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> Path:
    """Every hand-built Nsight export of make_nsys_cases.py, built once."""
    import make_nsys_cases

    out = tmp_path_factory.mktemp("nsys_cases")
    for case in make_nsys_cases.CASES.values():
        make_nsys_cases.build(case, out)
    return out
