"""Where the tests find the repository, their data and the shared traces, from any folder."""

from __future__ import annotations

import os
from pathlib import Path

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
