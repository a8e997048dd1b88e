"""Issue 20 item 9: under a withheld split the renderers show no shares, idle ratios or
waits for the last rank; the JSON keeps its numbers (its documented contract).

Truth from outside gpudiag: ``sampled_2rank_a2a``'s host operators' External ids, read by a
plain loop over its raw events, leave holes after most ids (the trace is sampled), so the
gaps between its kept events are unseen time.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
from pathlib import Path

import pytest
from testpaths import nonempty

import gpudiag
from gpudiag.report import console, html_report, markdown


@pytest.fixture(scope="module")
def sampled(kineto_sets: Path) -> gpudiag.Diagnosis:
    return gpudiag.analyze(kineto_sets / "sampled_2rank_a2a", jobs=1, cache=False)


def test_the_trace_is_sampled(kineto_sets: Path) -> None:
    for f in nonempty((kineto_sets / "sampled_2rank_a2a").glob("*.json.gz"), "sampled ranks"):
        with gzip.open(f) as fh:
            ev = json.load(fh)["traceEvents"]
        ids = sorted(
            {
                e["args"]["External id"]
                for e in ev
                if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})
            }
        )
        holes = sum(1 for a, b in itertools.pairwise(ids) if b - a > 1)
        assert len(ids) >= 50 and holes / len(ids) > 0.2


def _texts(d: gpudiag.Diagnosis) -> dict[str, str]:
    out = {}
    for name, mod in (("console", console), ("markdown", markdown), ("html", html_report)):
        buf = io.StringIO()
        if mod is console:
            console.render(d, buf, show_steps=True, width=160, color=False)
        else:
            mod.render(d, buf)
        text = buf.getvalue()
        out[name] = text.split('<script type="application/json"')[0]  # the page, not its JSON
    return out


def test_renderers_show_no_split_figures(sampled: gpudiag.Diagnosis) -> None:
    assert sampled.verdict is not None and sampled.verdict.bottleneck == "unknown"
    pc = lambda x: f"{x * 100:.1f}%"  # noqa: E731
    figures = {
        pc(sampled.run.gpu_idle_ratio or 0),
        pc(sampled.run.idle_ratio),
        pc(sampled.run.shares.other),
        pc(sampled.run.shares.comm_wait),
    }
    for r in sampled.ranks:
        figures |= {pc(r.shares.compute), pc(r.shares.other), pc(r.idle_ratio)}
    for name, text in _texts(sampled).items():
        assert "not measured" in text, name
        assert "waiting for the last rank" not in text, name
        shown = {f for f in figures if f in text}
        assert not shown, (name, shown)
        assert "615.4 ms" in text or "615.1 ms" in text, name  # step times were measured


def test_json_keeps_its_numbers(sampled: gpudiag.Diagnosis) -> None:
    j = sampled.to_json()
    assert j["ranks"][0]["shares"]["other"] > 0 and j["run"]["gpu_idle_ratio"] is not None
    assert j["collectives"]["per_rank"]
