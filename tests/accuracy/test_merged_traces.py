"""Issue 11: merged multi-rank files are split into their ranks, or refused — never mixed.

make_merged.py builds the files the way TraceLens' TraceFusion and similar tools do, from
the shared per-rank traces of one run (sampled_2rank_a2a). The truth is the per-rank files
themselves, computed by the independent reference implementation (reference.py).
"""

from __future__ import annotations

import make_merged
import pytest
import reference

import gpudiag
from gpudiag.config import SteadyRules
from gpudiag.errors import InputError
from gpudiag.traces.kineto import load_kineto, load_kineto_ranks

EVERY_STEP = gpudiag.Thresholds(steady=SteadyRules(include_warmup=True))


@pytest.fixture(scope="module")
def per_rank(kineto_sets):
    return [kineto_sets / "sampled_2rank_a2a" / f"rank-{r}.json.gz" for r in (0, 1)]


@pytest.mark.parametrize("style", ["tracefusion", "args", "labels"])
def test_each_rank_of_a_merged_file_matches_the_reference(style, per_rank, tmp_path):
    merged = make_merged.write(tmp_path / "merged_all_events.json.gz", per_rank, style)
    d = gpudiag.analyze(merged, jobs=1, thresholds=EVERY_STEP)
    assert [r.rank for r in d.ranks] == [0, 1]
    for rank, path in enumerate(per_rank):
        got = [s for s in d.steps if s.rank == rank]
        ref = reference.kineto(path)
        assert [s.step for s in got] == [s.step for s in ref]
        for g, r in zip(got, ref, strict=True):
            assert (g.start_ns, g.duration_ns) == (r.start, r.duration)
            assert g.compute_ns == pytest.approx(r.compute, abs=1_000)
            assert g.comm_wait_ns == pytest.approx(r.comm_wait, abs=1_000)
            assert g.data_wait_ns == pytest.approx(r.data_wait, abs=1_000)
    # the collectives of the two ranks are matched as across two files
    separate = gpudiag.analyze(*per_rank, jobs=1, thresholds=EVERY_STEP)
    assert d.collectives.matched == separate.collectives.matched > 0


def test_an_unlabelled_merge_is_refused_in_one_line(per_rank, tmp_path):
    merged = make_merged.write(tmp_path / "merged.json.gz", per_rank, "none")
    with pytest.raises(InputError) as e:
        gpudiag.analyze(merged, jobs=1)
    msg = str(e.value)
    assert "holds 2 processes" in msg and "which rank" in msg and "\n" not in e.value.problem


def test_load_kineto_on_a_merged_file_says_how_to_split_it(per_rank, tmp_path):
    merged = make_merged.write(tmp_path / "merged.json.gz", per_rank)
    with pytest.raises(InputError, match="holds 2 ranks"):
        load_kineto(merged)
    assert [t.rank for t in load_kineto_ranks(merged)] == [0, 1]


def test_a_merged_file_beside_per_rank_files_claims_the_same_ranks(per_rank, tmp_path):
    merged = make_merged.write(tmp_path / "merged.json.gz", per_rank)
    with pytest.raises(InputError, match="claims rank 0"):
        gpudiag.analyze(merged, *per_rank, jobs=1)
