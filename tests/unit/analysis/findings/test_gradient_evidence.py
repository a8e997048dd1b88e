"""Trial item 12: gradient remedies need evidence of gradients; a collectives table's
lower bounds that round to nothing read n/a; the transfer column is a per-call median.

Truth from the raw events of edge_cpu_only: its only operators are ``aten::empty`` and its
collectives ``gloo:all_reduce`` ranges on threads other than the ProfilerStep thread — no
backward pass, no optimizer step, no DDP reducer.
"""

from __future__ import annotations

import gzip
import io
import json

import gpudiag
from gpudiag.report.console import render

GRADIENT_REMEDIES = {"comm-overlap", "grad-accumulation", "grad-compression", "fsdp-prefetch"}


def test_collectives_alone_get_no_gradient_advice(kineto_sets):
    path = kineto_sets / "edge_cpu_only"
    with gzip.open(next(path.glob("*.json.gz"))) as fh:
        ev = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    ops = {e["name"] for e in ev if e.get("cat") == "cpu_op"}
    step_tid = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#"))
    assert ops == {"aten::empty"}
    assert all(e["tid"] != step_tid for e in ev if e["name"].startswith("gloo:"))
    d = gpudiag.analyze(path, jobs=1)
    assert not {r.id for r in d.recommendations} & GRADIENT_REMEDIES
    buf = io.StringIO()
    render(d, buf, width=120, color=False)
    text = buf.getvalue()
    assert "≥0.0 GB/s" not in text and "≥0% of" not in text
    assert "median/call" in text


def test_a_ddp_trace_keeps_its_gradient_advice(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "mi300x_ddp8_r0_rccl", jobs=1)
    assert {"comm-overlap", "grad-accumulation"} <= {r.id for r in d.recommendations}
