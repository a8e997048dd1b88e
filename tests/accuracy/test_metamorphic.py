"""The metamorphic suite (issue 29): every shared trace set under transformations with a known effect.

Each transformation (tests/accuracy/metamorph.py) is made on the raw JSON; the relation it
must keep (same figures, a filtered-trace warning, a withheld verdict, no straggler among
the kept ranks, precision advice for the new GPU) is decided there from the raw events.
A transformation that does not apply to a set (no GPU events to strip, one rank) is
skipped with its reason.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import metamorph as mm
import pytest

import gpudiag
from gpudiag.analysis.model.diagnosis import Diagnosis

KINETO = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "kineto"
SETS = sorted(p.name for p in KINETO.iterdir() if p.is_dir()) if KINETO.is_dir() else []
SHARE_TOL = 0.02  # absolute, per part of the step
STEP_TOL = 0.02  # relative, on the median step
LAUNCH_BOUND_US = 1000.0  # a least launch latency under this: the launch bound is tight


@cache
def _raw(name: str) -> tuple[list[str], list[mm.Doc]]:
    files, docs = mm.read_set(KINETO / name)
    return files, mm.window(docs)


_BASES: dict[str, Diagnosis] = {}


def _base(name: str, tmp: Path) -> Diagnosis:
    if name not in _BASES:
        files, docs = _raw(name)
        _BASES[name] = gpudiag.analyze(mm.write_set(tmp / "base", files, docs), jobs=1)
    return _BASES[name]


def _figures(d: Diagnosis) -> dict[str, Any]:
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
    for rank, (x, y) in ((k, (fa[k], fb[k])) for k in fa):
        assert y[0] == pytest.approx(x[0] * scale, rel=STEP_TOL, abs=2000), (rank, x, y)
        for i in range(1, 5):
            assert y[i] == pytest.approx(x[i], abs=SHARE_TOL), (rank, i, x, y)


def _withheld(d: Diagnosis) -> bool:
    assert d.verdict is not None
    return d.verdict.bottleneck == "unknown"


def _gains(d: Diagnosis) -> list[int]:
    return [r.estimated_gain_ns for r in d.recommendations if r.estimated_gain_ns]


def _precision(d: Diagnosis) -> str:
    r = next((r for r in d.recommendations if r.id == "reduced-precision"), None)
    return "" if r is None else (r.title + " " + r.detail)


def _gains_within_step(d: Diagnosis) -> None:
    """No time is promised twice: the gains of remedies that do not overlap fit in the step.

    The step is the gains' base: the what-if's mean step where there is one (uneven steps
    make it longer than the median), else the slowest rank's median.
    """
    step = max((r.step_time_ns_median for r in d.ranks), default=0)
    if d.what_if is not None:
        step = max(step, d.what_if.step_time_ns)
    recs = [r for r in d.recommendations if r.estimated_gain_ns]
    for r in recs:
        assert r.estimated_gain_ns <= step, (r.id, r.estimated_gain_ns, step)
    apart = [r for r in recs if not set(r.overlaps_with) & {x.id for x in recs}]
    assert sum(r.estimated_gain_ns or 0 for r in apart) <= step, [
        (r.id, r.estimated_gain_ns) for r in apart
    ]


CASES = [(s, t) for s in SETS for t in mm.TRANSFORMS]


@pytest.mark.parametrize(("name", "t"), CASES, ids=[f"{s}-{t.name}" for s, t in CASES])
def test_transformation_keeps_its_relation(name: str, t: mm.Transform, tmp_path: Path) -> None:
    files, docs = _raw(name)
    new = t.apply(docs)
    if isinstance(new, str):
        pytest.skip(f"{t.name} does not apply to {name}: {new}")
    base = _base(name, tmp_path)
    out = gpudiag.analyze(mm.write_set(tmp_path / name, files[: len(new)], new), jobs=1)
    assert out.verdict is not None and base.verdict is not None
    _gains_within_step(base)
    _gains_within_step(out)
    if t.expect == "same":
        assert out.verdict.bottleneck == base.verdict.bottleneck, out.verdict.headline
        _same_figures(base, out)
    elif t.expect in ("clock+", "clock-"):
        # read raw: with a wait that bounds the clock, or (ahead of the host) a least
        # launch latency under a millisecond, the offset is undone: the same figures; a
        # GPU clock behind the host with nothing to tell it from a GPU running behind: the
        # split is withheld
        least_us, bound = mm.clock_evidence(docs)
        if bound or (t.expect == "clock-" and least_us < LAUNCH_BOUND_US):
            assert out.verdict.bottleneck == base.verdict.bottleneck, out.verdict.headline
            _same_figures(base, out)
        elif t.expect == "clock+":
            assert _withheld(out) or _withheld(base), out.verdict.headline
        else:
            pytest.skip(
                f"{name}: every GPU op starts ≥ {least_us / 1e3:.1f} ms after its "
                "launch and no wait bounds the clock: an offset is a guess"
            )
    elif t.expect == "same_shares":
        _same_figures(base, out)
    elif t.expect == "scaled":
        _same_figures(base, out, scale=2.0)
    elif t.expect == "filtered":
        assert _withheld(out), out.verdict.headline
        assert any("filtered" in s for s in out.verdict.limits or []), out.verdict.limits
        assert not _gains(out)
    elif t.expect == "withheld":
        assert _withheld(out), out.verdict.headline
        assert not _gains(out)
    elif t.expect == "no_straggler":
        assert not [f for f in out.findings if f.kind == "straggler"]
    elif t.expect.startswith("precision:"):
        gen = t.expect.split(":")[1]
        text = _precision(out)
        if not _precision(base):
            assert not text
            return
        if gen == "volta":  # no bf16 tensor cores before Ampere: fp16 with a loss scaler
            assert "fp16" in text and "GradScaler" in text and "bf16" not in text.split(".")[0]
        else:
            assert "bf16" in text
    else:  # pragma: no cover
        raise AssertionError(t.expect)
