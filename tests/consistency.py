"""Properties every diagnosis must hold, whatever its input: one story, one source per number.

:func:`problems` reads a diagnosis as a user does — its JSON (``Diagnosis.to_json``) and its
console text — and lists each place where two of its numbers disagree (issue 24 §1). It
never recomputes the analysis: the truth of each number is the accuracy tests' business;
here only agreement is checked:

* the shares of step time (run and ranks) sum to 1;
* the verdict names a finding (``verdict.finding``) of its kind, with that finding's ranks,
  and quotes that finding's own metric (``verdict.share``): a persistent straggler's typical
  excess, an intermittent one's stall count, a late rank's waiting per step, a data, comm or
  host finding's mean share over its ranks; the headline's percentage is that share;
* a straggler verdict only above the straggler threshold (never "0% slower");
* a data-bound verdict implies a positive "no data wait" gain in the what-if, and a
  communication-bound one a positive "comm fully overlapped" gain, on the median step or,
  where the median step does not show it, on the mean step the what-if then gives
  (``on_mean``: the verdict's shares are of the run's time);
* the what-if's step is its statistic (the headline's median; the mean in ``on_mean`` and
  in older files) of each step's slowest rank, computed here, and its line says which; "all
  together" is never below the critical path (the slowest rank's remaining work);
* a remedy's estimated gain is the what-if's for the change it makes (data: no data wait;
  overlap: comm fully overlapped; straggler: at median speed) and its ratio is that gain over
  the what-if's step;
* prose never shows a remedy id where a title belongs ("not additive with nccl-tuning");
* a recognised pipeline (``collectives.pipeline``) has exactly one ``pipeline_bubble``
  finding, at any bubble size, and none of its stages is called communication-bound or a
  straggler; a "no bottleneck" verdict that names a finding names that pipeline's info
  finding and quotes its bubble;
* the console's header and its table quote the same step statistics for a single rank;
  the run's median and p90 are those of every analysed (rank, step), each rank's those of
  its own steps (computed here), and a header over several ranks says "over all ranks'
  steps";
* a host- or copy-bound verdict whose finding names a cause quotes, after the whole share,
  that cause's own share of step time (``cause.step_share``), never more than the whole;
  a remedy for a named cause gains at most the cause's own time per step
  (``cause.ns_per_step``), itself at most the "other" time;
* "idle X% (above T%)" only when X is above T;
* a kernel in the communication family contributes to communication time (GPU runs).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

#: The what-if field each remedy's gain is (the change the remedy makes).
REMEDY_WHAT_IF = {
    "dataloader": "if_no_data_wait_ns",
    "comm-overlap": "if_comm_overlapped_ns",
    "straggler": "if_straggler_at_median_speed_ns",
}
_KIND = {
    "copy": "host_bound",
    "variability": "step_variability",
    "data": "data_bound",
    "communication": "comm_bound",
    "straggler": "straggler",
    "pipeline": "pipeline_bubble",
    "host": "host_bound",
}


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol


def _shares(where: str, shares: dict[str, float], out: list[str]) -> None:
    total = sum((shares[k] or 0.0) for k in ("compute", "comm_wait", "data_wait", "other"))
    if not _close(total, 1.0, 0.005):
        out.append(f"{where}: shares sum to {total:.4f}, not 1")


def _finding_share(f: dict[str, Any]) -> float | None:
    """The number a verdict naming ``f`` must quote, in the finding's own terms."""
    m = f["metrics"]
    if f["kind"] == "straggler":
        if m.get("source") == "late_arrival":
            step = m.get("step_time_ns_median") or 0
            return m["waited_ns_per_step"] / step if step else None
        if f.get("persistent"):
            # its cost to the mean step (the what-if's straggler at median speed)
            mean = m.get("step_time_ns_mean")
            if mean:
                return (mean - m["step_time_ns_if_median_speed"]) / mean
            return float(m["median_excess_ratio"])
        return None  # a stall count, not a share
    if f["kind"] == "pipeline_bubble":
        return max(float(m.get("bubble_ratio", 0.0)), float(m.get("ideal_bubble_ratio", 0.0)))
    per = m.get("per_rank") or {}
    vals = [float(per[str(r)]) for r in f["ranks"] if str(r) in per] or [
        float(v) for v in per.values()
    ]
    return sum(vals) / len(vals) if vals else None


def _verdict(d: dict[str, Any], out: list[str]) -> None:
    v = d.get("verdict") or {}
    kind = v.get("bottleneck")
    if kind == "none" and v.get("finding") is not None:
        _within_schedule(d, v, out)
        return
    # no finding to quote: no bottleneck, a verdict withheld for want of evidence (issue 20),
    # or how the run ended (hang, mismatch, failure, interrupt: their own findings, issue 21)
    if not kind or kind in ("none", "unknown", "hang", "mismatch", "failure", "interrupted"):
        return
    idx = v.get("finding")
    if not isinstance(idx, int) or not 0 <= idx < len(d["findings"]):
        out.append(f"verdict {kind!r} names no finding (verdict.finding = {idx!r})")
        return
    f = d["findings"][idx]
    if f["kind"] != _KIND[kind]:
        out.append(f"verdict {kind!r} quotes a {f['kind']} finding")
    if sorted(v["ranks"]) != sorted(f["ranks"]):
        out.append(f"verdict ranks {v['ranks']} are not its finding's {f['ranks']}")
    want = _finding_share(f)
    if want is not None and not _close(float(v["share"]), want, 1e-9):
        out.append(f"verdict share {v['share']:.4f} is not its finding's metric {want:.4f}")
    head = v["headline"]
    pct = re.findall(r"(\d+)%", head)
    if want is not None and pct and int(pct[0]) != round(100 * want):
        out.append(f"headline says {pct[0]}% but its finding's metric is {want:.1%}")
    if kind == "straggler":
        _straggler(d, f, head, out)
    if kind in ("host", "copy"):
        _host_cause_share(f, head, out)


def _host_cause_share(f: dict[str, Any], head: str, out: list[str]) -> None:
    """A named host cause is quoted with its own share, after (and within) the whole."""
    cause = f["metrics"].get("cause") or {}
    if cause.get("kind") in (None, "unknown"):
        return
    if cause.get("step_share") is None:
        if cause.get("label") and cause["label"] in head:
            out.append(
                f"headline {head!r} names the cause {cause['label']!r} without its own share"
            )
        return
    own, whole = float(cause["step_share"]), _finding_share(f) or 0.0
    if own > whole + 1e-9:
        out.append(
            f"host cause {cause['kind']!r} holds {own:.1%}, more than its finding's {whole:.1%}"
        )
    m = re.search(r"\(of which (.+?) (\d+)%\)", head)
    if not m or cause["label"] not in m.group(1) or int(m.group(2)) != round(100 * own):
        out.append(
            f"headline {head!r} does not quote its cause {cause['label']!r} with its "
            f"own share {own:.1%}"
        )


def _cause_gains(d: dict[str, Any], out: list[str]) -> None:
    """No remedy for a named host cause promises more than the cause holds."""
    for r in d["recommendations"]:
        ev = r.get("evidence")
        cause = ev.get("cause") if isinstance(ev, dict) else None
        if not isinstance(cause, dict) or cause.get("kind") in (None, "unknown"):
            continue
        own, gain = cause.get("ns_per_step"), r.get("estimated_gain_ns")
        if (
            own is not None
            and cause.get("other_ns_per_step") is not None
            and (own > cause["other_ns_per_step"] + 1)
        ):
            out.append(
                f"host cause {cause['kind']!r}: {own / 1e6:.1f} ms a step, more than "
                f"the 'other' {cause['other_ns_per_step'] / 1e6:.1f} ms"
            )
        if own is not None and gain is not None and gain > own + 1:
            out.append(
                f"remedy {r['id']} promises {gain / 1e6:.1f} ms a step, more than its "
                f"cause {cause['kind']!r} holds ({own / 1e6:.1f} ms)"
            )


def _within_schedule(d: dict[str, Any], v: dict[str, Any], out: list[str]) -> None:
    """A "no bottleneck" verdict naming a finding names a pipeline within its threshold."""
    idx = v["finding"]
    f = d["findings"][idx] if isinstance(idx, int) and 0 <= idx < len(d["findings"]) else None
    if f is None or f["kind"] != "pipeline_bubble" or f["severity"] != "info":
        out.append(
            f"a 'no bottleneck' verdict names finding {idx!r}, not a pipeline within its threshold"
        )
        return
    want = _finding_share(f)
    if want is not None and f"{round(100 * want)}%" not in v["headline"]:
        out.append(f"'no bottleneck' names the pipeline but not its bubble {want:.0%}")


def _pipeline(d: dict[str, Any], out: list[str]) -> None:
    """A recognised pipeline always has its finding, and a pipeline finding its section."""
    pipe = (d.get("collectives") or {}).get("pipeline")
    found = [f for f in d["findings"] if f["kind"] == "pipeline_bubble"]
    if pipe and len(found) != 1:
        out.append(f"a pipeline of {pipe['stages']} stages with {len(found)} pipeline findings")
    if found and not pipe:
        out.append("a pipeline finding without the collectives' pipeline section")
    stages = set(pipe["stage_ranks"]) if pipe else set()
    out.extend(
        f"a pipeline stage's receive waits called {f['kind']} (ranks {f['ranks']})"
        for f in d["findings"]
        if f["kind"] in ("comm_bound", "straggler") and f["ranks"] and set(f["ranks"]) <= stages
    )


def _straggler(d: dict[str, Any], f: dict[str, Any], head: str, out: list[str]) -> None:
    rules = d["thresholds"]["stragglers"]
    m = f["metrics"]
    if re.search(r"\b0% slower", head):
        out.append(f"straggler verdict below any threshold: {head!r}")
    if f.get("persistent") and float(m["median_excess_ratio"]) < rules["excess_ratio"]:
        out.append(f"persistent straggler verdict below the threshold: {head!r}")
    if f.get("persistent") is False:
        n = m.get("slow_steps")
        if n is None or f"{n} of {m.get('steps_compared')}" not in head:
            out.append(f"an intermittent straggler's verdict without its stall count: {head!r}")
        if "slower than the median" in head:
            out.append(f"stalls quoted as a persistent excess: {head!r}")


def _saves(w: dict[str, Any] | None, field: str) -> bool:
    return bool(w) and w.get(field) is not None and w[field] < w["step_time_ns"]


def _what_if(d: dict[str, Any], text: str, out: list[str]) -> None:
    w = d.get("what_if")
    kind = (d.get("verdict") or {}).get("bottleneck")
    if not w:
        return
    _what_if_statistic(d, w, text, out)
    # the verdict's share is of the run's time: where the median step does not show its
    # change, the what-if's mean step (on_mean) must
    on_mean = w.get("on_mean")
    for k, field, words in (
        ("data", "if_no_data_wait_ns", "'no data wait'"),
        ("communication", "if_comm_overlapped_ns", "'comm fully overlapped'"),
    ):
        if kind == k and not (_saves(w, field) or _saves(on_mean, field)):
            out.append(
                f"{k}-bound verdict but {words} changes neither the median nor the mean step"
            )
    crit = w.get("critical_path_ns")
    if w.get("if_all_ns") is not None and crit is not None and w["if_all_ns"] < crit:
        out.append(
            f"'all together' {w['if_all_ns'] / 1e6:.1f} ms is below the critical path "
            f"{crit / 1e6:.1f} ms (the slowest rank's remaining work)"
        )
    for r in d["recommendations"]:
        field = REMEDY_WHAT_IF.get(
            "straggler" if r["id"].startswith("investigate-rank-") else r["id"]
        )
        # a gain on the mean step (the median step saves nothing) is on_mean's
        ev = r.get("evidence")
        on = on_mean if isinstance(ev, dict) and ev.get("gain_statistic") == "mean" else w
        if on is None:
            out.append(f"remedy {r['id']} quotes a mean step's gain the what-if does not give")
            continue
        if field is None or r.get("estimated_gain_ns") is None or on.get(field) is None:
            continue
        if on is on_mean and _saves(w, field):
            out.append(f"remedy {r['id']} quotes the mean step where the median step saves")
        now = on["step_time_ns"]
        gain = now - on[field]
        if not _close(r["estimated_gain_ns"], gain, max(1.0, 0.005 * now)):
            out.append(
                f"remedy {r['id']} promises {r['estimated_gain_ns'] / 1e6:.1f} ms a step, "
                f"the what-if {gain / 1e6:.1f} ms"
            )
        ratio = r.get("estimated_gain_ratio")
        if ratio is not None and now and not _close(ratio, r["estimated_gain_ns"] / now, 1e-3):
            out.append(f"remedy {r['id']}: gain ratio {ratio:.3f} is not its gain over the step")


def _what_if_statistic(d: dict[str, Any], w: dict[str, Any], text: str, out: list[str]) -> None:
    """The what-if's step is its statistic of each step's slowest rank, as its line says.

    Computed here from the steps: the median (the headline's) or, in ``on_mean`` and in
    files written before, the mean.
    """
    longest: dict[int, int] = {}
    for s in d["steps"]:
        longest[s["step"]] = max(longest.get(s["step"], 0), s["duration_ns"])
    if not longest:
        return
    for which in (w, w.get("on_mean")):
        if not which:
            continue
        stat = which.get("statistic", "mean")
        fn = np.median if stat == "median" else np.mean
        want = round(float(fn(list(longest.values()))))
        if abs(which["step_time_ns"] - want) > 1:
            out.append(f"what-if step {which['step_time_ns']} is not the {stat} step {want}")
        flat = " ".join(text.split())
        if "what if:" in flat and f"on the {stat} step" not in flat:
            out.append(f"the what-if line does not say it is on the {stat} step")
    if w.get("on_mean") and w.get("statistic") != "median":
        out.append("a what-if on the mean step with a mean step beside it")


def _prose(d: dict[str, Any], text: str, out: list[str]) -> None:
    ids = {r["id"] for r in d["recommendations"]}
    out.extend(
        f"remedy id {rid!r} in prose where its title belongs"
        for rid in sorted(ids)
        if re.search(rf"additive with[^.\n]*\b{re.escape(rid)}\b", text)
    )


def _stats(durs: list[int]) -> tuple[int, int]:
    """(median, p90) of step times, computed here (numpy's linear percentile)."""
    if not durs:
        return 0, 0
    return round(float(np.percentile(durs, 50))), round(float(np.percentile(durs, 90)))


def _step_stats(d: dict[str, Any], text: str, out: list[str]) -> None:
    """Header and rows: one statistics function, the header's over every (rank, step)."""
    if not d["steps"]:
        return
    run = (d["run"]["step_time_ns_median"], d["run"]["step_time_ns_p90"])
    if run != _stats([s["duration_ns"] for s in d["steps"]]):
        out.append(f"run median/p90 {run} are not those of all its steps")
    for r in d["ranks"]:
        mine = [s["duration_ns"] for s in d["steps"] if s["rank"] == r["rank"]]
        if r["steps"] and (r["step_time_ns_median"], r["step_time_ns_p90"]) != _stats(mine):
            out.append(f"rank {r['rank']}: median/p90 are not those of its steps")
    if (
        text
        and sum(1 for r in d["ranks"] if r["steps"]) > 1
        # the console wraps (a continuation line is indented): read it as one line
        and re.search(
            r"step time median .*p90 \S+ \S+ over all ranks' steps", re.sub(r"\s+", " ", text)
        )
        is None
    ):
        out.append("a header of several ranks' step times does not say it is over all of them")


def _header(d: dict[str, Any], text: str, out: list[str]) -> None:
    if len(d["ranks"]) != 1:
        return
    head = re.search(r"step time median (\S+ \S+), p90 (\S+ \S+)", text)
    row = re.search(r"^\s*\d+\s+\d+\s+(\S+ \S+)\s+(\S+ \S+)\s", text, re.M)
    if head and row and head.groups() != row.groups():
        out.append(f"header median/p90 {head.groups()} but the rank table {row.groups()}")


def _comm_family(d: dict[str, Any], out: list[str]) -> None:
    """A kernel of the communication family contributes to communication time."""
    fams = (d.get("kernels") or {}).get("families") or {}
    comm = float(fams.get("communication", 0.0))
    seen = d["run"]["shares"]["comm_wait"] + d["run"]["comm_overlapped_ratio"]
    if d["run"]["mode"] == "gpu" and comm >= 0.01 and seen == 0:
        out.append(
            f"communication kernels hold {comm:.1%} of GPU time, but comm-wait and "
            "overlap are 0: two rule sets classify kernels"
        )


def _idle(text: str, out: list[str]) -> None:
    pattern = r"idle (\d+(?:\.\d+)?)% \(above (\d+)%\)"
    out.extend(
        f"'{m.group(0)}': an idle statement its own number contradicts"
        for m in re.finditer(pattern, text)
        if float(m.group(1)) <= float(m.group(2))
    )


def problems(d: dict[str, Any], console: str = "") -> list[str]:
    """Every disagreement between numbers of one diagnosis (empty: one story)."""
    out: list[str] = []
    if d["steps"]:
        _shares("run", d["run"]["shares"], out)
        for r in d["ranks"]:
            if r["steps"]:
                _shares(f"rank {r['rank']}", r["shares"], out)
    _verdict(d, out)
    _pipeline(d, out)
    _step_stats(d, console, out)
    _what_if(d, console, out)
    _cause_gains(d, out)
    _comm_family(d, out)
    if console:
        _prose(d, console, out)
        _header(d, console, out)
        _idle(console, out)
    return out
