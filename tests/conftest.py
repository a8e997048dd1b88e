"""Shared fixtures: the real traces (../shared/traces or tests/fetch_shared.py's copy), golden files."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from testpaths import SHARED_TRACES

_CACHE_DIR = tempfile.mkdtemp(prefix="gpudiag-test-cache-")


def pytest_configure(config: pytest.Config) -> None:
    # gpudiag's per-rank cache (gpudiag/fanout/cache.py) is off for the CLIs the tests start: a
    # test that analyses the same traces twice (progress, Dask workers, faults) means to
    # read them twice. tests/unit/fanout/test_cache.py turns it on where it is the subject;
    # anything cached goes to a scratch directory of this session, never the user's.
    os.environ["GPUDIAG_NO_CACHE"] = "1"
    os.environ["GPUDIAG_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/* from current output"
    )


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(
            f"real traces not found at {SHARED_TRACES} (CI provides ../shared; "
            "or run python tests/fetch_shared.py)"
        )
    return SHARED_TRACES


@pytest.fixture(scope="session")
def kineto_sets(shared_traces: Path) -> Path:
    return shared_traces / "kineto"
