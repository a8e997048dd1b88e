"""Live alerts while a job runs: the offline rules, judged on a sliding window of its steps.

The monitor of ``gpudiag run`` (:mod:`gpudiag.live`) feeds each rank's step telemetry (and
NVML utilisation, and whether the run conditions call the host busy) into
:class:`LiveRules` as the ranks write it. Whenever every rank has finished a new step, the
rules judge the latest ``live.window_steps`` steps (all ranks have them; warm-up and the
steps the profiler slowed are left out, as offline) **with the offline implementations and
thresholds**:

* **straggler**: :func:`gpudiag.analysis.stragglers.stepmatrix.slow_steps` — a rank's busy time
  exceeds the other ranks' median by ``stragglers.excess_ratio`` of the window's median
  step, while it waited no longer than they did (they wait for it: in DDP's all-reduce
  inside backward, or in the job's own collectives). The onset must also stand out from
  the window's own jitter (``stragglers.jitter_sigmas`` robust standard deviations of each
  rank's excess around its own level, in the window's steps before the onset), as an
  offline stall must stand out from the run's;
* **data_bound**, **comm_bound**, **idle_ratio**:
  :func:`gpudiag.analysis.findings.idle.idle_findings`
  on the window's steps (data-wait and comm-wait as measured, busy as compute: the
  offline telemetry-only diagnosis; the data-wait is the input wait of
  :mod:`gpudiag.analysis.run.phases`, the DataLoader's or the growth of the pre-forward
  phase over the least one of the rank's steps judged so far, whatever makes the batch;
  a rank a raised straggler alert names gets no data-bound or telemetry-idle alert: its
  longer pre-forward phase is the straggler's own work, which the others wait for),
  so a rank is named only when its time-weighted share crosses ``data_bound_ratio`` /
  ``comm_bound_ratio`` / ``idle_ratio_max`` *and* it does so in most of the window's
  steps or without the single worst one. Idle is 1 − NVML's
  utilisation (:func:`~gpudiag.analysis.rank.analyse.nvml_idle_findings`) where a GPU is
  sampled, else 1 − busy / step time from the telemetry; that telemetry idle is the sum
  of data- and comm-wait, so it is not raised for ranks a data or comm alert already names.

What online adds (``Thresholds.live``, docs/definitions.md): an onset is confirmed when
the effect shows in each of the latest ``confirm_steps`` (2) steps — ``busy_confirm_steps``
(3) while the run conditions say the host is busy — so a single slow step (a checkpoint, a
garbage collection) never raises an alert; an alert clears once ``clear_steps`` (3) steps
in a row show less than ``hysteresis_ratio`` (half) of the threshold that raised it, and
says so once; the same alert (kind and ranks) is not raised again within
``min_gap_steps`` (20) of its last raise; nothing is judged in the first ``warmup_steps``
(5) steps, nor before a whole window of steps has been seen.

**no_progress** comes from the hang watchdog (:meth:`LiveRules.no_progress`); it clears
when a step finishes again. Pure: no I/O, the time is passed in.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, TypedDict

import numpy as np

from gpudiag._support.records import dataclass
from gpudiag.analysis.findings.idle import RULES, idle_findings
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import Finding, FindingKind, LiveAlert, RunStep, StepBreakdown
from gpudiag.analysis.model.metrics import JsonObject
from gpudiag.analysis.rank.analyse import nvml_idle_findings, telemetry_rank_results
from gpudiag.analysis.reading.steady import disturbed_steps
from gpudiag.analysis.run.phases import input_wait
from gpudiag.analysis.run.summary import summarize_rank
from gpudiag.analysis.stragglers.stepmatrix import jitter_ns, slow_steps, steps_matrix
from gpudiag.config import Thresholds

NO_PROGRESS = "no_progress"
STRAGGLER = str(FindingKind.STRAGGLER)
SHARE_KINDS = (FindingKind.DATA_BOUND, FindingKind.COMM_BOUND, FindingKind.IDLE_RATIO)
KINDS = (STRAGGLER, *(str(k) for k in SHARE_KINDS), NO_PROGRESS)
RAISED, CLEARED = "raised", "cleared"
_RULE = {r.kind: r for r in RULES}
_WAITS = (str(FindingKind.DATA_BOUND), str(FindingKind.COMM_BOUND))
_NO_LONGER = {
    FindingKind.DATA_BOUND: "data-bound",
    FindingKind.COMM_BOUND: "communication-bound",
    FindingKind.IDLE_RATIO: "idle above the limit",
}


def iso_time(time_ns: int) -> str:
    """``2026-12-01T06:31:02.123Z`` (UTC, milliseconds)."""
    secs, ns = divmod(time_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ns // 1_000_000:03d}Z"


Alert = LiveAlert


class AlertRecord(TypedDict):
    """One line of ``alerts.jsonl`` (docs/run-directory.md, "Live alerts")."""

    type: Literal["alert"]
    time: str  # UTC, ISO 8601
    time_ns: int
    step: int
    kind: str
    state: str  # raised or cleared
    ranks: list[int]
    message: str
    metrics: Mapping[str, object]  # the kind's figures (docs/run-directory.md lists them)


def alert_record(a: Alert) -> AlertRecord:
    """The ``alerts.jsonl`` record of an alert (docs/run-directory.md)."""
    return AlertRecord(
        type="alert",
        time=iso_time(a.time_ns),
        time_ns=a.time_ns,
        step=a.step,
        kind=a.kind,
        state=a.state,
        ranks=list(a.ranks),
        message=a.message,
        metrics=a.metrics,
    )


@dataclass(frozen=True)
class _WindowUtil:
    """NVML utilisation over the latest steps: per (rank, step), and 1 − util per rank."""

    steps: dict[tuple[int, int], float]
    window: dict[int, float]


@dataclass
class _Active:
    """An alert that is raised and not cleared yet."""

    alert: Alert
    onset: int
    limit: float  # the threshold that raised it; below hysteresis × this counts as gone
    quiet: int = 0  # steps in a row without the effect


def _ranks_words(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {words.fold(ranks)}"


def _share_value(kind: FindingKind, x: RunStep) -> float:
    """A step's data-wait, comm-wait or telemetry-idle share.

    Split as :func:`gpudiag.analysis.rank.analyse.telemetry_rank_results` splits the rows.
    """
    data = min(max(x.data_wait_ns or 0, 0), x.duration_ns)
    comm = min(max(x.comm_wait_ns or 0, 0), x.duration_ns - data)
    if kind == FindingKind.DATA_BOUND:
        return data / x.duration_ns
    if kind == FindingKind.COMM_BOUND:
        return comm / x.duration_ns
    return (data + comm) / x.duration_ns


def _run_start(flags: Sequence[bool]) -> int:
    """Index of the first of the trailing run of true values (the onset within the window)."""
    i = len(flags)
    while i > 0 and flags[i - 1]:
        i -= 1
    return i


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.0f} ms" if abs(ns) >= 10e6 else f"{ns / 1e6:.1f} ms"


class LiveRules:
    """The online state: recent steps of every rank, and the alerts raised."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or Thresholds()
        self.rules = self.th.live
        self.steps: dict[int, dict[int, RunStep]] = {}
        self.done = -1  # the last step every rank had when judged
        self.window: deque[int] = deque(maxlen=max(1, self.rules.window_steps))
        self.profiled: set[int] = set()
        self.util: dict[int, deque[tuple[int, float]]] = {}  # rank → (time_ns, util_ratio)
        self.busy: list[str] = []  # why the host is busy now (run conditions), or empty
        self.active: dict[tuple[str, tuple[int, ...]], _Active] = {}
        self.last_raised: dict[tuple[str, tuple[int, ...]], int] = {}
        self.history: list[Alert] = []
        self.judged = 0  # steps every rank finished, seen by evaluate()
        self.floor: dict[int, int] = {}  # rank → least pre-forward phase of its steady steps

    # ---- input ----

    def add_steps(self, steps: Iterable[RunStep]) -> None:
        """New telemetry steps (any rank, any order); data-wait is their input wait."""
        for s in steps:
            if s.pre_forward_ns is not None:
                floor = self.floor.get(s.rank)
                if s.step >= self.rules.warmup_steps and not s.profiled:
                    floor = s.pre_forward_ns if floor is None else min(floor, s.pre_forward_ns)
                    self.floor[s.rank] = floor
                s = dataclasses.replace(
                    s, loader_wait_ns=s.data_wait_ns, data_wait_ns=input_wait(s, floor)
                )
            self.steps.setdefault(s.rank, {})[s.step] = s
            if s.profiled:
                self.profiled.add(s.step)

    def restart(self) -> None:
        """The job restarted its ranks (a new telemetry header): steps count from 0 again.

        The recent steps, the window and the repeat gaps start over; an alert raised stays
        raised until the new steps clear it.
        """
        self.steps, self.done, self.profiled = {}, -1, set()
        self.floor = {}
        self.window.clear()
        self.util.clear()
        self.last_raised = {}

    def add_gpu_samples(self, rank: int, samples: Iterable[tuple[int, float]]) -> None:
        """NVML utilisation samples (time_ns, util_ratio) of the GPU of ``rank``."""
        q = self.util.setdefault(rank, deque(maxlen=100_000))
        q.extend(samples)

    def host_busy(self, reasons: Sequence[str]) -> None:
        """Why the run conditions call the host busy now (empty: quiet, or not known)."""
        self.busy = list(reasons)

    def no_progress(self, now_ns: int, message: str, metrics: JsonObject) -> Alert | None:
        """The hang watchdog found no step finishing: an alert until a step finishes again."""
        key = (NO_PROGRESS, ())
        if key in self.active:
            return None
        a = Alert(now_ns, self.done, NO_PROGRESS, [], message, metrics)
        self.active[key] = _Active(a, self.done, 0.0)
        self.last_raised[key] = self.done
        self.history.append(a)
        return a

    # ---- judging ----

    def evaluate(self, now_ns: int) -> list[Alert]:
        """Judge every step that all ranks have finished since the last call."""
        out: list[Alert] = []
        ranks = sorted(self.steps)
        if not ranks:
            return out
        last = min(max(per, default=-1) for per in self.steps.values())
        if last > self.done and (NO_PROGRESS, ()) in self.active:
            a = self.active.pop((NO_PROGRESS, ())).alert
            out.append(self._cleared(a, now_ns, last, "steps finish again"))
        disturbed = disturbed_steps(
            RunStep(0, n, 0, 1, None, None, None, True) for n in self.profiled
        )
        for s in range(self.done + 1, last + 1):
            self.done = s
            self.judged += 1
            if s < self.rules.warmup_steps or s in disturbed:
                continue
            if not all(s in self.steps[r] for r in ranks):
                continue  # a rank restarted or lost that record
            self.window.append(s)
            if len(self.window) >= self.rules.window_steps:
                out += self._judge(ranks, s, now_ns)
        self._prune()
        self.history += out
        return out

    def raised(self) -> list[Alert]:
        """The alerts raised and not cleared, oldest first."""
        return sorted((a.alert for a in self.active.values()), key=lambda a: a.time_ns)

    def _prune(self) -> None:
        keep = min(self.window, default=self.done) - 1
        for per in self.steps.values():
            for n in [n for n in per if n < keep]:
                del per[n]
        self.profiled = {n for n in self.profiled if n >= keep - 1}
        if self.window:
            lo = min(
                per[self.window[0]].start_ns for per in self.steps.values() if self.window[0] in per
            )
            for q in self.util.values():
                while q and q[0][0] < lo:
                    q.popleft()

    def _confirm(self) -> int:
        return max(1, self.rules.busy_confirm_steps if self.busy else self.rules.confirm_steps)

    def _judge(self, ranks: list[int], s: int, now_ns: int) -> list[Alert]:
        """The full rules where something new could be raised; cheap checks otherwise.

        The quick checks are necessary conditions of the rules, on plain floats: a rank
        whose excess, or a share that crosses its limit, in each of the confirming steps.
        Only a candidate that no raised alert covers needs the full rule; a raised alert
        only needs to know whether its effect is still there (the hysteresis test).
        """
        win = list(self.window)
        c = min(self._confirm(), len(win))
        out: list[Alert] = []
        busy = self._busy(ranks, win)
        raised_ranks = {k[1][0] for k in self.active if k[0] == STRAGGLER}
        steps: list[RunStep] = []
        if busy is not None and self._straggler_candidates(ranks, win, c, busy) - raised_ranks:
            steps = [self.steps[r][n] for r in ranks for n in win]
            out += self._stragglers(ranks, win, steps, c, s, now_ns)
        elif busy is not None and raised_ranks:
            out += self._stragglers_quiet(ranks, win, busy, s, now_ns)
        share_kinds = {str(k) for k in SHARE_KINDS}
        raised_kinds = {k[0] for k in self.active if k[0] in share_kinds}
        if self.util or self._share_candidates(ranks, win[-c:]) - raised_kinds:
            steps = steps or [self.steps[r][n] for r in ranks for n in win]
            out += self._shares(win, steps, c, s, now_ns)
        elif raised_kinds:
            out += self._shares_quiet(s, now_ns)
        return out

    def _busy(self, ranks: list[int], win: list[int]) -> dict[int, list[float]] | None:
        """Each rank's busy time (step − its wait) over the window; None if not measured."""
        if len(ranks) < 2:
            return None
        busy: dict[int, list[float]] = {}
        for r in ranks:
            row = []
            for n in win:
                x = self.steps[r][n]
                wait = x.backward_ns if x.backward_ns is not None else x.comm_wait_ns
                if wait is None:
                    return None
                row.append(float(x.duration_ns - wait))
            busy[r] = row
        return busy

    def _excess(self, ranks: list[int], busy: dict[int, list[float]], r: int, j: int) -> float:
        return busy[r][j] - statistics.median(busy[o][j] for o in ranks if o != r)

    def _straggler_candidates(
        self, ranks: list[int], win: list[int], c: int, busy: dict[int, list[float]]
    ) -> set[int]:
        """Ranks whose excess reaches ``excess_ratio`` of a step in each of the last c."""
        step = statistics.median(self.steps[r][n].duration_ns for r in ranks for n in win)
        limit = self.th.stragglers.excess_ratio * step
        n = len(win)
        return {
            r
            for r in ranks
            if all(self._excess(ranks, busy, r, j) >= limit for j in range(n - c, n))
        }

    def _stragglers_quiet(
        self, ranks: list[int], win: list[int], busy: dict[int, list[float]], s: int, now_ns: int
    ) -> list[Alert]:
        out: list[Alert] = []
        for key, a in list(self.active.items()):
            if key[0] != STRAGGLER or key[1][0] not in ranks:
                continue
            r = key[1][0]
            present = self._excess(ranks, busy, r, len(win) - 1) >= (
                self.rules.hysteresis_ratio * a.limit
            )
            out += self._quiet(key, a, present, s, now_ns, f"rank {r} is no longer a straggler")
        return out

    def _share_candidates(self, ranks: list[int], last: list[int]) -> set[str]:
        """The share kinds some rank crosses in each of ``last`` (telemetry values)."""
        out = set()
        named = {r for k, a in self.active.items() if k[0] in _WAITS for r in a.alert.ranks}
        for kind in SHARE_KINDS:
            rule = _RULE[kind]
            limit = rule.limit(self.th)
            for r in ranks:
                if kind == FindingKind.IDLE_RATIO and r in named:
                    continue  # the telemetry idle is those waits: not raised for them
                vals = [_share_value(kind, self.steps[r][n]) for n in last]
                if all(v > limit if rule.strict else v >= limit for v in vals):
                    out.add(str(kind))
                    break
        return out

    def _shares_quiet(self, s: int, now_ns: int) -> list[Alert]:
        out: list[Alert] = []
        for key, a in list(self.active.items()):
            kind = next((k for k in SHARE_KINDS if str(k) == key[0]), None)
            if kind is None:
                continue
            present = any(
                _share_value(kind, self.steps[r][s]) >= self.rules.hysteresis_ratio * a.limit
                for r in a.alert.ranks
                if s in self.steps.get(r, {})
            )
            out += self._quiet(
                key,
                a,
                present,
                s,
                now_ns,
                f"{_ranks_words(a.alert.ranks)}: no longer {_NO_LONGER[kind]}",
            )
        return out

    def _stragglers(
        self, ranks: list[int], win: list[int], steps: list[RunStep], c: int, s: int, now_ns: int
    ) -> list[Alert]:
        out: list[Alert] = []
        m = steps_matrix(steps, ranks, win) if len(ranks) >= 2 else None
        if m is None:
            return out
        rules = self.th.stragglers
        ex, slow, step = slow_steps(m, rules)
        hist = ex[:, : len(win) - c]
        hist = hist - np.median(hist, axis=1, keepdims=True)  # each rank around its own level
        floor = max(rules.excess_ratio * step, rules.jitter_sigmas * jitter_ns(hist))
        others_wait = np.array(
            [np.median(np.delete(m.wait, i, axis=0), axis=0) for i in range(len(ranks))]
        )
        for i, r in enumerate(ranks):
            key = (STRAGGLER, (r,))
            onset = bool(slow[i, -c:].all() and (ex[i, -c:] >= floor).all())
            a = self.active.get(key)
            present = a is not None and bool(ex[i, -1] >= self.rules.hysteresis_ratio * a.limit)
            if onset and a is None and self._may_raise(key, s):
                span = slice(len(win) - c, len(win))
                first = win[_run_start(list(slow[i]))]
                added = float(np.median(ex[i, span]))
                others = float(np.median(np.delete(m.busy[:, span], i, axis=0)))
                times = float(np.median(m.busy[i, span])) / others if others > 0 else float("inf")
                where = (
                    "backward (DDP's gradient all-reduce)"
                    if all(x.backward_ns is not None for x in steps)
                    else "collectives"
                )
                msg = (
                    f"rank {r} is a straggler: +{_ms(added)} a step ({times:.1f}× the others' "
                    f"median) since step {first}, the others wait for it in {where}"
                )
                metrics: JsonObject = {
                    "excess_ns": round(added),
                    "busy_ratio": round(times, 3),
                    "step_ns": round(step),
                    "threshold_ns": round(floor),
                    "others_wait_ns": round(float(np.median(others_wait[i, span]))),
                    "onset_step": first,
                }
                out.append(self._raise(key, s, now_ns, msg, metrics, first, floor))
            elif a is not None:
                out += self._quiet(key, a, present, s, now_ns, f"rank {r} is no longer a straggler")
        return out

    def _shares(
        self, win: list[int], steps: list[RunStep], c: int, s: int, now_ns: int
    ) -> list[Alert]:
        results = telemetry_rank_results(steps)
        rows = [b for res in results for b in res.steps]
        util = self._window_util(rows)
        findings = idle_findings(
            [summarize_rank(res) for res in results], rows, self.th, telemetry_idle=util is None
        )
        if util is not None:
            findings = [f for f in findings if f.kind != FindingKind.IDLE_RATIO]
            findings += nvml_idle_findings(util.window, self.th, "of the latest steps")
        by_kind = {f.kind: f for f in findings}
        per_step = self._per_step(rows, util)
        out: list[Alert] = []
        named: set[int] = set()
        # a straggler's own input or host work (its longer pre-forward phase) is its alert's
        stragglers = {a.alert.ranks[0] for k, a in self.active.items() if k[0] == STRAGGLER}
        for kind in SHARE_KINDS:
            skip = named | stragglers if kind == FindingKind.IDLE_RATIO and util is None else set()
            if kind == FindingKind.DATA_BOUND:
                skip = stragglers
            out += self._share(kind, by_kind.get(kind), per_step[kind], win, c, s, now_ns, skip)
            if kind != FindingKind.IDLE_RATIO:
                named |= {
                    r for k, a in self.active.items() if k[0] == str(kind) for r in a.alert.ranks
                }
        return out

    def _per_step(
        self, rows: list[StepBreakdown], util: _WindowUtil | None
    ) -> dict[FindingKind, dict[int, dict[int, float]]]:
        """Each kind's value per rank and step (what the offline rule counts per step)."""
        out: dict[FindingKind, dict[int, dict[int, float]]] = {k: {} for k in SHARE_KINDS}
        for b in rows:
            if not b.duration_ns:
                continue
            for kind in SHARE_KINDS:
                out[kind].setdefault(b.rank, {})[b.step] = _RULE[kind].per_step(b)
        if util is not None:
            out[FindingKind.IDLE_RATIO] = {}
            for (r, n), u in util.steps.items():
                out[FindingKind.IDLE_RATIO].setdefault(r, {})[n] = 1.0 - u
        return out

    def _window_util(self, rows: list[StepBreakdown]) -> _WindowUtil | None:
        """NVML utilisation per (rank, step) and 1 − util per rank over the window; or None."""
        per_step: dict[tuple[int, int], float] = {}
        window: dict[int, float] = {}
        for rank, q in self.util.items():
            if not q:
                continue
            t = np.fromiter((x[0] for x in q), np.int64, len(q))
            u = np.fromiter((x[1] for x in q), np.float64, len(q))
            mine = [b for b in rows if b.rank == rank]
            inside = []
            for b in mine:
                sel = (t >= b.start_ns) & (t < b.start_ns + b.duration_ns)
                if sel.any():
                    per_step[(rank, b.step)] = float(u[sel].mean())
                    inside.append(sel)
            if inside:
                window[rank] = 1.0 - float(u[np.logical_or.reduce(inside)].mean())
        return _WindowUtil(per_step, window) if window else None

    def _share(
        self,
        kind: FindingKind,
        f: Finding | None,
        values: dict[int, dict[int, float]],
        win: list[int],
        c: int,
        s: int,
        now_ns: int,
        skip: set[int],
    ) -> list[Alert]:
        rule = _RULE[kind]
        limit = rule.limit(self.th)
        key_kind = str(kind)
        mine = [(k, a) for k, a in self.active.items() if k[0] == key_kind]
        out: list[Alert] = []
        for key, a in mine:
            present = any(
                values.get(r, {}).get(s, 0.0) >= self.rules.hysteresis_ratio * a.limit
                for r in a.alert.ranks
            )
            out += self._quiet(
                key,
                a,
                present,
                s,
                now_ns,
                f"{_ranks_words(a.alert.ranks)}: no longer {_NO_LONGER[kind]}",
            )
        if f is None or mine:
            return out

        def crosses(v: float) -> bool:
            return v > limit if rule.strict else v >= limit

        ranks = [
            r
            for r in f.ranks
            if r not in skip and all(crosses(values.get(r, {}).get(n, 0.0)) for n in win[-c:])
        ]
        key = (key_kind, tuple(ranks))
        if not ranks or not self._may_raise(key, s):
            return out
        shares: JsonObject = {
            str(r): round(sum(values[r][n] for n in win) / len(win), 4) for r in ranks
        }
        first = win[min(_run_start([crosses(values[r].get(n, 0.0)) for n in win]) for r in ranks)]
        msg = f"{f.message} since step {first}"
        metrics: JsonObject = {
            "per_rank": shares,
            "threshold": limit,
            "onset_step": first,
            "window_steps": [win[0], win[-1]],
        }
        if kind == FindingKind.IDLE_RATIO:
            nvml = getattr(f.metrics, "source", None) == "nvml"
            metrics["source"] = "nvml" if nvml else "telemetry"
        out.append(self._raise(key, s, now_ns, msg, metrics, first, limit))
        return out

    # ---- lifecycle ----

    def _may_raise(self, key: tuple[str, tuple[int, ...]], s: int) -> bool:
        last = self.last_raised.get(key)
        return last is None or s - last >= self.rules.min_gap_steps

    def _raise(
        self,
        key: tuple[str, tuple[int, ...]],
        s: int,
        now_ns: int,
        msg: str,
        metrics: JsonObject,
        onset: int,
        limit: float,
    ) -> Alert:
        if self.busy:
            metrics["host_busy"] = list(self.busy)
            msg += f" (host busy: {'; '.join(self.busy)})"
        a = Alert(now_ns, s, key[0], list(key[1]), msg, metrics)
        self.active[key] = _Active(a, onset, limit)
        self.last_raised[key] = s
        return a

    def _quiet(
        self,
        key: tuple[str, tuple[int, ...]],
        a: _Active,
        present: bool,
        s: int,
        now_ns: int,
        what: str,
    ) -> list[Alert]:
        a.quiet = 0 if present else a.quiet + 1
        if a.quiet < self.rules.clear_steps:
            return []
        del self.active[key]
        return [self._cleared(a.alert, now_ns, s, what)]

    def _cleared(self, a: Alert, now_ns: int, s: int, what: str) -> Alert:
        return Alert(
            now_ns,
            s,
            a.kind,
            list(a.ranks),
            f"{what} (raised at step {a.step})",
            {"raised_step": a.step},
            CLEARED,
        )
