"""Issue 13: structured mutators with fixed seeds: Kineto traces, Nsight exports, run directories.

Every mutant (events dropped, duplicated, shuffled, fields perturbed or retyped, arrays
truncated, top-level keys damaged; SQL cells retyped, tables dropped or made views,
columns renamed, pages zeroed; manifest, telemetry and NVML records perturbed, dropped,
duplicated or cut) ends in a Diagnosis that passes its own JSON schema or in a clean
GpudiagError, within the time and memory bounds, its files unchanged.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from cases import run_dir, use_shared
from harness import run_case
from mutate import Mutant, load_bases, mutants, nsys_mutants, run_dir_mutants

SEED = 13


@pytest.fixture(scope="module")
def bases(kineto_sets: Path) -> list[Any]:
    return load_bases(kineto_sets)


def checked_analysis(paths: list[Path]) -> Any:
    """The Diagnosis, after the checks a saved one goes through on load."""
    import gpudiag
    from gpudiag.api.saved import diagnosis_from_json, schema_problem

    d = gpudiag.analyze(*paths, jobs=1)
    problem = schema_problem(d.to_json())
    assert problem is None, problem
    diagnosis_from_json(d.to_json())
    return d


def run_all(cases: Iterable[Mutant], root: Path) -> tuple[collections.Counter[str], list[str]]:
    """Write and analyse every mutant; (outcome counts, failures)."""
    kinds: collections.Counter[str] = collections.Counter()
    bad = []
    for m in cases:
        d = root / m.name
        paths = set()
        for name, data in m.files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
            paths.add(d / name.split("/")[0])
        out = run_case(m.name, d, sorted(paths), checked_analysis)
        kinds[out.kind] += 1
        if not out.ok:
            bad.append(f"{out.describe()}\n    mutations: {m.ops}")
    return kinds, bad


def test_kineto_mutants(bases: list[Any], tmp_path: Path) -> None:
    n = 240
    kinds, bad = run_all(mutants(bases, SEED, n), tmp_path)
    assert not bad, f"{len(bad)} of {n} mutants broke the property:\n" + "\n".join(bad[:20])
    # the mutator must exercise both ends: far from all-errors or all-diagnoses
    assert kinds["diagnosis"] > n // 5 and kinds["error"] > n // 5, kinds


def test_nsys_mutants(shared_traces: Path, tmp_path: Path) -> None:
    n = 30
    kinds, bad = run_all(nsys_mutants(shared_traces, SEED, n), tmp_path)
    assert not bad, "\n".join(bad[:20])
    assert kinds["diagnosis"] and kinds["error"], kinds


def test_run_dir_mutants(shared_traces: Path, tmp_path: Path) -> None:
    use_shared(shared_traces)
    n = 30
    kinds, bad = run_all(run_dir_mutants(run_dir(tmp_path / "base"), SEED, n), tmp_path)
    assert not bad, "\n".join(bad[:20])
    assert kinds["diagnosis"] and kinds["error"], kinds
