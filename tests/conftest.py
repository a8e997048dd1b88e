"""Shared fixtures: the real traces (../shared/traces or tests/fetch_shared.py's copy), golden
files; and the order the suite runs in, alone or spread over pytest-xdist workers (``-n N``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from testpaths import SHARED_TRACES

_CACHE_DIR = tempfile.mkdtemp(prefix="gpudiag-test-cache-")


def _compile_bytecode() -> None:
    """gpudiag's bytecode, written once before the suite starts its thousand processes.

    An editable install has none, and where ``PYTHONDONTWRITEBYTECODE`` is set (as on this
    project's machines) no process ever writes it: every CLI run and every rank of every
    job compiled gpudiag again (~0.2 CPU-s each, a tiny ``analyze`` 0.50 CPU-s instead of
    0.31). compileall writes it whatever the variable says; stale files are recompiled.
    """
    import compileall

    compileall.compile_dir(Path(__file__).resolve().parents[1] / "gpudiag", quiet=1)


def _sigint_as_on_a_terminal() -> None:
    """Ctrl-C's signal handled in this process, so the jobs the tests start can act on it.

    A process started with SIGINT ignored (``cmd &`` from a script, nohup, some CI agents)
    hands that down through fork and exec: each job then ignores SIGINT as it would without
    gpudiag, and the tests of what SIGINT does (forwarding, ``--on-hang kill``, an exit
    handler that saves a window) fail for a reason of the launching shell's. Seen: beside a
    CPU hog started with the suite in the background, ``test_sigint_is_forwarded`` and
    ``test_sigint_first_lets_exit_handlers_run`` failed twice. A handled signal is reset to
    its default in the children, as on a terminal.
    """
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    _sigint_as_on_a_terminal()  # in the main process and in each xdist worker
    if not hasattr(config, "workerinput"):  # once, in the main process (not per xdist worker)
        _compile_bytecode()
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


# The suite's folders, the slowest first: the integration tests start real torchrun jobs
# (much of their time is a job's start-up or a hang's timeout, which another worker's tests
# can use), so on several workers they start first and the quick unit tests fill the gaps.
_FOLDER_ORDER = ("integration", "accuracy", "fuzz", "unit")


def _folder_rank(item: pytest.Item) -> int:
    parts = Path(str(item.path)).relative_to(Path(__file__).parent).parts
    return (
        _FOLDER_ORDER.index(parts[0]) if parts and parts[0] in _FOLDER_ORDER else len(_FOLDER_ORDER)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_folder_rank)  # stable: a module's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``-n N`` (xdist's default ``--dist load``): whole modules to a worker, in the order above.

    A module's module-scoped fixtures (one real job shared by its tests) then run once, not
    once per worker that got one of its tests; xdist's own reordering of modules (most tests
    first) would start the few-test, slow integration modules last.
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False
    return LoadScopeScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """``GPUDIAG_TEST_CPU_LOG=FILE``: one JSON line per test, its wall and CPU seconds.

    CPU is this worker's own plus that of the children it waited for (the real jobs a test
    starts), so the suite's cost can be read per test; fixtures count with the test that
    set them up. Off unless the variable is set.
    """
    log = os.environ.get("GPUDIAG_TEST_CPU_LOG")
    if not log:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    t0, c0 = time.monotonic(), cpu()
    yield
    rec = {"test": item.nodeid, "wall_s": time.monotonic() - t0, "cpu_s": cpu() - c0}
    with open(log, "a") as f:
        f.write(json.dumps(rec) + "\n")
