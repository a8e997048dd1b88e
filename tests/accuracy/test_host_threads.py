"""Issue 20 §2: host time inside operators (any host thread) versus Python between them.

Truth from outside gpudiag: the construction of make_host_causes.py's ``eager_autograd``,
``python_gaps`` and ``sync_waits_for_gpu`` (timelines written out there), and plain loops
over the raw events of the shared ``a100x2_r0_pgcfg`` and ``v100x2_r1`` traces
(reference.py's merge/minus/inside; no gpudiag code).
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path
from typing import Any

import make_host_causes
import pytest
import reference

import gpudiag
from gpudiag.analysis.model.diagnosis import Diagnosis, FindingKind

MS = 1_000_000
US = 1_000


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("host_threads")
    for name in ("eager_autograd", "python_gaps", "sync_waits_for_gpu"):
        make_host_causes.write(out / name / "rank-0.json.gz", make_host_causes.CASES[name]())
    return out


def _host(d: Diagnosis) -> Any:
    found = [f for f in d.findings if f.kind == FindingKind.HOST_BOUND]
    assert found, [f.kind for f in d.findings]
    return found[0]


def _raw(path: Path) -> list[dict[str, Any]]:
    return [
        e
        for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        if e.get("ph") == "X"
    ]


def _ns(e: dict[str, Any]) -> tuple[int, int]:
    return round(float(e["ts"]) * US), round((float(e["ts"]) + float(e.get("dur", 0))) * US)


def test_autograd_thread_operators_are_eager_overhead_not_python(cases: Path) -> None:
    d = gpudiag.analyze(cases / "eager_autograd", jobs=1)
    cause = _host(d).metrics.cause
    assert cause.kind == "eager"
    # by construction: 80 operators of 300 µs and one of 1.7 ms a step (25.7 ms), less
    # the 85 kernels of 16 µs that run inside them: 24.34 ms a step, the GPU idle
    assert cause.ns_per_step == 24_340 * US
    host_ops = d.ranks[0].evidence.host_ops
    assert host_ops["training_ns_per_step"] == [13_700 * US] * 5  # forward + optimizer
    assert host_ops["other_threads_ns_per_step"] == [12_000 * US] * 5  # backward
    assert host_ops["between_idle_ns_per_step"] == [4_300 * US] * 5
    assert "eager operator overhead 81%" in d.verdict.headline
    assert "Python" not in d.verdict.headline
    # the console line: activity, its time a step and the steps, in one finding
    msg = _host(d).message
    assert "eager operator overhead — CPU time inside operators" in msg
    assert "(24.3 ms a step, steps 0–4;" in msg and "autograd thread 12.0 ms" in msg
    first = d.recommendations[0]
    assert first.id == "eager-overhead"
    assert "torch.compile" in first.title and "CUDA graphs" in first.title
    assert first.estimated_gain_ns == 24_340 * US
    assert not any(r.title.startswith("Cut Python overhead") for r in d.recommendations)


def test_python_between_operators_when_no_thread_is_inside_one(cases: Path) -> None:
    d = gpudiag.analyze(cases / "python_gaps", jobs=1)
    cause = _host(d).metrics.cause
    assert cause.kind == "python"
    # 60 operators of 100 µs in each 30 ms step: 24 ms with no operator open, no kernel
    assert cause.ns_per_step == 24_000 * US
    assert "Python overhead between operators 80%" in d.verdict.headline
    assert "80% of each step (24.0 ms a step, steps 0–4)" in _host(d).message
    assert d.recommendations[0].title == "Cut Python overhead between operators"


def test_a_sync_waiting_for_longer_compute_does_not_explain_slow_steps(cases: Path) -> None:
    d = gpudiag.analyze(cases / "sync_waits_for_gpu", jobs=1)
    var = next(f for f in d.findings if f.kind == FindingKind.STEP_VARIABILITY)
    assert var.steps == [2, 4]
    assert var.metrics.cause is None and var.metrics.grows == "compute"
    # by construction: 12 GEMMs of 2 ms in steps 2 and 4 against 6: 12 ms more compute
    assert "compute grows by 12.0 ms a slow step" in var.message
    assert var.metrics.kernels["count_slow"] == 12 and var.metrics.kernels["count_usual"] == 6
    assert var.metrics.kernels["grew"] == {"ampere_sgemm_128x64_nn": 12 * MS}
    assert var.metrics.blocking_call.api == "cudaStreamSynchronize"
    assert not any(r.id == "host-sync" for r in d.recommendations)


def _threads(events: list[dict[str, Any]], main: tuple[Any, Any]) -> dict[str, list]:
    """Merged operator intervals: the training thread, the others, and all threads."""
    ops: dict[str, list[tuple[int, int]]] = {"main": [], "rest": []}
    for e in events:
        if e.get("cat") == "cpu_op":
            ops["main" if (e["pid"], e["tid"]) == main else "rest"].append(_ns(e))
    return {k: reference.merge(v) for k, v in ops.items()} | {
        "any": reference.merge(ops["main"] + ops["rest"])
    }


def test_a100x2_host_is_inside_operators_not_between_them(kineto_sets: Path) -> None:
    path = kineto_sets / "a100x2_r0_pgcfg" / "rank-0.json.gz"
    events = _raw(path)
    steps = sorted(
        (*_ns(e), e["pid"], e["tid"]) for e in events if re.match(r"ProfilerStep#\d+$", e["name"])
    )
    ops = _threads(events, steps[0][2:])
    kernels = reference.merge([_ns(e) for e in events if e.get("cat") == "kernel"])
    total = sum(b - a for a, b, *_ in steps)
    main = sum(reference.inside(ops["main"], a, b) for a, b, *_ in steps)
    rest = sum(reference.inside(ops["rest"], a, b) for a, b, *_ in steps)
    anyt = sum(reference.inside(ops["any"], a, b) for a, b, *_ in steps)
    idle_in = sum(
        reference.inside(reference.minus(ops["any"], kernels), a, b) for a, b, *_ in steps
    )
    # the raw events: the training thread alone is outside operators over half of each step,
    # yet some host thread is inside one 86% of it: the autograd thread runs backward
    assert 1 - main / total > 0.5 and anyt / total > 0.85 and rest > 0.35 * total
    d = gpudiag.analyze(path, jobs=1)
    ev = d.ranks[0].evidence
    got = ev.host_ops
    assert sum(got["training_ns_per_step"]) == pytest.approx(main, rel=0.01)
    assert sum(got["other_threads_ns_per_step"]) == pytest.approx(rest, rel=0.01)
    assert ev.host_op_share == pytest.approx(anyt / total, abs=0.01)
    cause = _host(d).metrics.cause
    assert cause.kind == "eager"
    # inside an operator with no kernel running bounds the cause's time from above (it
    # leaves out data wait and host-side communication calls too)
    assert 0.8 * idle_in / 3 <= cause.ns_per_step <= idle_in / 3
    assert "eager operator overhead" in d.verdict.headline and "Python" not in d.verdict.headline
    assert re.search(r"\d+\.\d ms a step, steps 4–6;", _host(d).message)
    assert d.recommendations[0].id == "eager-overhead"
    assert "Cut Python overhead" not in " ".join(r.title for r in d.recommendations)


def test_v100_slow_steps_are_named_by_their_compute_not_the_copy(kineto_sets: Path) -> None:
    path = kineto_sets / "v100x2_r1" / "rank-1.json.gz"
    events = _raw(path)
    steps = {
        int(e["name"].split("#")[1]): _ns(e)
        for e in events
        if re.match(r"ProfilerStep#\d+$", e["name"])
    }
    slow, usual = [1010, 1011, 1014], [1009, 1012, 1013]
    per: dict[str, dict[int, int]] = {}
    count = dict.fromkeys(steps, 0)
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a, b = _ns(e)
        n = next((k for k, (s, t) in steps.items() if s <= a < t), None)
        if n is None:
            continue
        count[n] += 1
        if not reference.is_comm_kernel(e["name"]):
            per.setdefault(e["name"], dict.fromkeys(steps, 0))[n] += b - a
    grew = {
        k: sum(v[n] - statistics.median(v[m] for m in usual) for n in slow) / 3
        for k, v in per.items()
    }
    top = max(grew, key=lambda k: grew[k])
    d = gpudiag.analyze(path, jobs=1)
    var = next(f for f in d.findings if f.kind == FindingKind.STEP_VARIABILITY)
    assert var.steps == slow
    assert var.metrics.cause is None and var.metrics.grows == "compute"
    assert "compute grows by" in var.message and "blocking copies:" not in var.message
    k = var.metrics.kernels
    assert k["count_slow"] == pytest.approx(sum(count[n] for n in slow) / 3, rel=0.03)
    assert k["count_usual"] == pytest.approx(statistics.median(count[n] for n in usual), rel=0.03)
    assert next(iter(k["grew"])) == top
    assert k["grew"][top] == pytest.approx(grew[top], rel=0.15)
    # the copy is a note: it waits for the GPU most of its time
    assert var.metrics.blocking_call.api == "cudaMemcpyAsync"
    assert "waiting for that GPU work" in var.message
    assert d.recommendations[0].id != "blocking-copies"
