"""The metamorphic suite on Nsight (issue 29): every shared export under known transformations.

Each shared ``.sqlite`` export is cut to its first 1,000 kernels (every event table at the
same time, so the runs stay seconds long) and transformed with SQL (nsys_metamorph.py): a
GPU clock offset of +0.6 s and −0.3 s (the same figures where the raw rows bound the clock,
else withheld, as on Kineto), a 3 s start-up call prepended (steady figures unchanged,
start-up named, dominant exactly when it is half the new window), idle padding at both
edges (same figures and verdict, the edges left out), kernels launched inside collective
ranges renamed (same verdict and figures), kernels under 10 µs dropped (a filtered trace:
withheld, no gains), every event table's rows shuffled, every thread renumbered, StringIds
renumbered with their references, NVTX ranges of an unrelated name where nothing runs (all
four: same verdict and figures), every time ×2 (same shares, each step ×2 within 1 µs).
A transformation that does not apply is skipped with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nsys_metamorph as nm
import pytest

import gpudiag
from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.config import ReadingRules

NSYS = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "nsys"
SETS = sorted(f"{p.parent.name}/{p.name}" for p in NSYS.glob("*/*.sqlite")) if NSYS.is_dir() else []
SHARE_TOL = 0.02
STEP_TOL = 0.02
LAUNCH_BOUND_NS = 1_000_000
STEP_SCALED_TOL_NS = 1000  # a step ×2 within 1 µs


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Diagnosis]]:
    """Each set's windowed export and its analysis, made once (filled as the tests ask)."""
    return {}


def _base(name: str, bases: dict[str, tuple[Path, Diagnosis]], tmp: Path) -> tuple[Path, Diagnosis]:
    if name not in bases:
        path = nm.window(NSYS / name, tmp / name.replace("/", "_"))
        bases[name] = (path, gpudiag.analyze(path, jobs=1))
    return bases[name]


def _figures(d: Diagnosis) -> dict[int, tuple[Any, ...]]:
    return {
        r.rank: (
            r.step_time_ns_median,
            r.shares.compute,
            r.shares.comm_wait,
            r.shares.data_wait,
            r.shares.other,
        )
        for r in d.ranks
    }


def _same_figures(a: Diagnosis, b: Diagnosis, scale: float = 1.0) -> None:
    fa, fb = _figures(a), _figures(b)
    assert fa.keys() == fb.keys()
    for rank in fa:
        x, y = fa[rank], fb[rank]
        assert y[0] == pytest.approx(x[0] * scale, rel=STEP_TOL, abs=2000), (rank, x, y)
        for i in range(1, 5):
            assert y[i] == pytest.approx(x[i], abs=SHARE_TOL), (rank, i, x, y)


def _steps(d: Diagnosis) -> tuple[Any, ...]:
    return (
        d.run.steps,
        [(s.rank, s.duration_ns, s.compute_ns, s.comm_wait_ns, s.data_wait_ns) for s in d.steps],
        d.run.shares.as_dict(),
    )


def _withheld(d: Diagnosis) -> bool:
    assert d.verdict is not None
    return d.verdict.bottleneck == "unknown"


CASES = [(s, t) for s in SETS for t in nm.TRANSFORMS]


@pytest.mark.parametrize(("name", "t"), CASES, ids=[f"{s}-{t.name}" for s, t in CASES])
def test_nsys_transformation_keeps_its_relation(name, t, bases, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nsys_mm")
    src, base = _base(name, bases, tmp_path_factory.getbasetemp())
    out_path = tmp / "t.sqlite"
    why = nm.edit(src, out_path, t.apply)
    if why is not None:
        pytest.skip(f"{t.name} does not apply to {name}: {why}")
    out = gpudiag.analyze(out_path, jobs=1)
    assert out.verdict is not None and base.verdict is not None
    if t.expect == "same":
        assert out.verdict.bottleneck == base.verdict.bottleneck, out.verdict.headline
        _same_figures(base, out)
    elif t.expect in ("clock+", "clock-"):
        import sqlite3

        con = sqlite3.connect(src)
        least, bound = nm.clock_evidence(con)
        con.close()
        if least >= nm.NO_LINK:
            pytest.skip(f"{name}: no GPU work linked to a launch call: an offset is unseen")
        if bound or (t.expect == "clock-" and least < LAUNCH_BOUND_NS):
            assert out.verdict.bottleneck == base.verdict.bottleneck, out.verdict.headline
            _same_figures(base, out)
        elif t.expect == "clock+":
            assert _withheld(out) or _withheld(base), out.verdict.headline
        else:
            pytest.skip(f"{name}: least launch latency {least / 1e6:.1f} ms, no bounding wait")
    elif t.expect == "scaled":
        # every time ×2 about the first: the same shares, each step twice as long (the
        # times are whole nanoseconds, ×2 exactly; a step's edges may round by a few ns)
        _same_figures(base, out, scale=2.0)
        assert out.run.steps == base.run.steps
        was = [(s.rank, s.duration_ns) for s in base.steps]
        now = [(s.rank, s.duration_ns) for s in out.steps]
        assert [r for r, _ in now] == [r for r, _ in was]
        for (rank, a), (_, b) in zip(was, now, strict=True):
            assert abs(b - 2 * a) <= STEP_SCALED_TOL_NS, (rank, a, b)
    elif t.expect == "filtered":
        assert _withheld(out), out.verdict.headline
        assert any("filtered" in s for s in out.verdict.limits or []), out.verdict.limits
        assert not [r for r in out.recommendations if r.estimated_gain_ns]
    elif t.expect == "startup":
        assert _steps(out) == _steps(base)
        r = out.reading
        assert r is not None and r.startup_calls[nm.STARTUP_CALL] == round(nm.STARTUP_S * 1e9)
        assert f"{nm.STARTUP_CALL} {nm.STARTUP_S:.1f} s" in r.line
        # the call (3 s) and its 1 ms gap widen the rank's window and add to its start-up
        was = next(x for x in base.ranks if x.rank == r.rank).evidence.reading
        # (within the GPU clock offset the loader corrects, under a millisecond here)
        assert was is not None
        widened = was.window_ns + round(nm.STARTUP_S * 1e9) + 1_000_000
        assert r.window_ns == pytest.approx(widened, abs=1_000_000)
        assert r.startup_ns == was.startup_ns + round(nm.STARTUP_S * 1e9)
        ratio = ReadingRules().startup_dominant_ratio
        assert r.startup_dominant == (r.startup_ns >= ratio * r.window_ns)
        if not r.startup_dominant:
            assert out.verdict.headline == base.verdict.headline
        else:
            assert out.verdict.headline.startswith(base.verdict.headline + " — this window is ")
    elif t.expect == "padded":
        assert _steps(out) == _steps(base)
        assert out.verdict.headline == base.verdict.headline
        r = out.reading
        # (less the GPU clock offset the loader corrects, ≤ its tolerance on these sets)
        assert r is not None and r.idle_head_ns >= 199_000_000 and r.idle_tail_ns >= 499_000_000
        assert "left out" in r.line
    else:  # pragma: no cover
        raise AssertionError(t.expect)
