"""Issue 13: a structured mutator over the shared Kineto traces, with a fixed seed.

Every mutant (events dropped, duplicated, shuffled, fields perturbed or retyped, arrays
truncated, top-level keys damaged) ends in a Diagnosis that passes its own JSON schema or
in a clean GpudiagError, within the time and memory bounds, its files unchanged.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from harness import run_case
from mutate import load_bases, mutants

SEED = 13
COUNT = 300


@pytest.fixture(scope="module")
def bases(kineto_sets: Path) -> list:
    return load_bases(kineto_sets)


def _check(d: object) -> object:
    """The Diagnosis of a mutant must pass the checks a saved one goes through on load."""
    from gpudiag.analysis.model import Diagnosis, schema_problem

    problem = schema_problem(d.to_json())  # type: ignore[attr-defined]
    assert problem is None, problem
    Diagnosis.from_json(d.to_json())  # type: ignore[attr-defined]
    return d


def test_mutants_end_in_a_diagnosis_or_a_clean_error(bases: list, tmp_path: Path) -> None:
    import gpudiag

    def call(paths: list[Path]) -> object:
        return _check(gpudiag.analyze(*paths, jobs=1))

    kinds: collections.Counter[str] = collections.Counter()
    bad = []
    for m in mutants(bases, SEED, COUNT):
        d = tmp_path / m.name
        d.mkdir()
        paths = []
        for name, data in m.files.items():
            (d / name).write_bytes(data)
            paths.append(d / name)
        out = run_case(m.name, d, paths, call)
        kinds[out.kind] += 1
        if not out.ok:
            bad.append(f"{out.describe()}\n    mutations: {m.ops}")
    assert not bad, f"{len(bad)} of {COUNT} mutants broke the property:\n" + "\n".join(bad[:20])
    # the mutator must exercise both ends: far from all-errors or all-diagnoses
    assert kinds["diagnosis"] > COUNT // 5 and kinds["error"] > COUNT // 5, kinds
