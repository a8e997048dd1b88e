"""Issue 13: every hand-made bad input ends in a Diagnosis or a clean GpudiagError (exit 4/3),
in bounded time and memory, with its files left byte-identical (tests/fuzz/cases.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cases import CASES, Case, use_shared
from harness import run_case


def _restore_modes(root: Path) -> None:
    """Give back what a case took away (chmod 0), so pytest can clean the directory."""
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o755)


def test_there_are_at_least_60_cases() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_handmade_case(case: Case, shared_traces: Path, tmp_path: Path) -> None:
    use_shared(shared_traces)
    paths = case.build(tmp_path)
    try:
        out = run_case(case.name, tmp_path, paths)
    finally:
        _restore_modes(tmp_path)
    assert out.ok, out.describe()
    if case.outcome != "either":
        assert out.kind == case.outcome, out.describe()
    if out.kind == "error":
        assert out.exit_code == case.exit_code, out.describe()
        assert case.expect in out.detail, f"{out.describe()}\n  expected: {case.expect!r}"
    elif case.expect and case.outcome == "diagnosis":
        import gpudiag

        d = gpudiag.analyze(*paths, jobs=1)
        notes = [*d.notes, *(n for r in d.ranks for n in r.notes)]
        assert any(case.expect in n for n in notes), (case.expect, notes)
