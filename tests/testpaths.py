"""Where the tests find the repository, their data and the shared traces, from any folder."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PACKAGE = ROOT / "gpudiag"
DATA = TESTS / "data"
GOLDEN = TESTS / "golden"
ACCURACY = TESTS / "accuracy"
SCHEMA = PACKAGE / "schema" / "diagnosis.schema.json"
# the real traces: ../shared/traces beside the clone (CI), or where tests/fetch_shared.py put them
SHARED_TRACES = Path(
    os.environ.get("GPUDIAG_SHARED_TRACES")
    or (
        ROOT.parent / "shared" / "traces"
        if (ROOT.parent / "shared" / "traces").is_dir()
        else TESTS / "shared" / "traces"
    )
)


def nonempty(items: Iterable[T], what: str) -> list[T]:
    """``items`` as a sorted list; fails (at collection, for a parametrize) when there are none.

    A test that loops over a glob passes vacuously when the glob matches nothing (a moved
    folder, a renamed file): such a test must fail instead.
    """
    out = sorted(items)  # type: ignore[type-var]
    if not out:
        raise AssertionError(f"no {what}: the glob matched nothing")
    return out
