"""Issue 13: bad inputs through the CLI as a user runs it: exit 4 (or 3), exactly one
``gpudiag: error:`` line, no traceback, inputs unchanged; and mutants that analyse."""

from __future__ import annotations

from pathlib import Path

import pytest
from cases import CASES, Case, use_shared
from harness import run_cli_case
from mutate import load_bases, mutants

CLI_CASES = [c for c in CASES if c.cli]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_cli_case(case: Case, shared_traces: Path, tmp_path: Path) -> None:
    use_shared(shared_traces)
    paths = case.build(tmp_path)
    out = run_cli_case(case.name, tmp_path, ["analyze", *map(str, paths), "-f", "json"])
    assert out.ok, out.describe()
    if case.outcome == "error":
        assert out.kind == "error" and out.exit_code == case.exit_code, out.describe()
        assert case.expect in out.detail, out.describe()
    elif case.outcome == "diagnosis":
        assert out.kind == "diagnosis", out.describe()


def test_cli_mutants(kineto_sets: Path, tmp_path: Path) -> None:
    bases = load_bases(kineto_sets, ["sampled_2rank_a2a", "edge_cpu_only"])
    bad = []
    for m in mutants(bases, seed=1313, count=6):
        d = tmp_path / m.name
        d.mkdir()
        for name, data in m.files.items():
            (d / name).write_bytes(data)
        out = run_cli_case(m.name, d, ["analyze", str(d), "-f", "json"])
        if not out.ok:
            bad.append(f"{out.describe()} ({m.ops})")
    assert not bad, "\n".join(bad)
