"""``gpudiag gate`` (the CI gate and its baselines), ``diff`` (two runs) and ``report`` (HTML)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from gpudiag import __version__
from gpudiag.cli import help as clihelp
from gpudiag.cli.base import diagnosis, emit, thresholds
from gpudiag.cli.common import NoCache, NoColor, app
from gpudiag.config import Thresholds
from gpudiag.rundir.conditions import RunConditions


def run_conditions(path: Path) -> RunConditions | None:
    """The run conditions a run directory's manifests recorded (None when there are none)."""
    from gpudiag.rundir import conditions as runconditions
    from gpudiag.rundir import layout as rundir

    if not rundir.is_run_dir(path):
        return None
    found = []
    for node in rundir.node_dirs(path):
        try:
            found.append(rundir.read_manifest(node / rundir.MANIFEST).conditions)
        except ValueError:
            continue
    return runconditions.merge(found)


def steady_conditions(path: Path, d: Any, th: Thresholds, cfg: Any) -> RunConditions | None:
    """:func:`run_conditions` with the CPU share others took over the steady steps compared.

    From the run's contention samples over time (``conditions/<host>.jsonl``) within the
    span of the steady steps the gate's step samples rest on; the summary alone when either
    is missing.
    """
    from gpudiag.analysis.compare.baseline import steady_window
    from gpudiag.rundir.conditions import window_share
    from gpudiag.traces.runfiles.contention import load_contention

    conditions = run_conditions(path)
    span = steady_window(d, cfg.warmup_steps, th) if conditions is not None else None
    if conditions is None or span is None:
        return conditions
    return conditions.with_steady_cpu_ratio(window_share(load_contention(path), *span))


def _gate_runs(path: Path, th: Thresholds, cfg: Any) -> list[Any]:
    """A baseline path as RunStats: a baseline file's runs, or one analysed run."""
    import json

    from gpudiag.analysis.compare.baseline import BASELINE_FORMAT, baseline_from_json, run_stat
    from gpudiag.errors import InputError

    if path.is_file() and path.suffix == ".json":
        with path.open("rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
        if BASELINE_FORMAT in head:
            try:
                return baseline_from_json(json.loads(path.read_text(encoding="utf-8")))
            except (ValueError, OSError) as e:
                raise InputError(
                    f"{path}: {e}", "write it again with `gpudiag gate --save-baseline FILE RUN…`"
                ) from e
    d = diagnosis(path, th)
    return [run_stat(d, str(path), steady_conditions(path, d, th, cfg), cfg.warmup_steps, th)]


Paired = Annotated[
    bool,
    typer.Option(
        "--paired",
        help="PATHS are baseline and candidate runs alternated as recorded "
        "(B1 C1 B2 C2 …): test their pairs.",
    ),
]


@app.command(cls=clihelp.Command)
def gate(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Run directory, traces or diagnosis JSON (several with "
            "--save-baseline, or extra baseline runs after --baseline).",
            readable=False,
        ),
    ],
    baseline: Annotated[
        list[Path] | None,
        typer.Option(
            "--baseline",
            help="Baseline run(s): run dirs, diagnoses, baseline files.",
            readable=False,
        ),
    ] = None,
    save_baseline: Annotated[
        Path | None,
        typer.Option("--save-baseline", help="Save the runs as a baseline here.", readable=False),
    ] = None,
    max_idle_ratio: Annotated[
        float | None, typer.Option(help="Per rank (default: the idle threshold, 0.3).")
    ] = None,
    max_comm_wait: Annotated[float | None, typer.Option(help="Max comm-wait share.")] = None,
    max_data_wait: Annotated[float | None, typer.Option(help="Max data-wait share.")] = None,
    min_effect: Annotated[
        float | None, typer.Option(help="Smallest slowdown that can fail, percent (5).")
    ] = None,
    max_regression: Annotated[
        float | None, typer.Option(help="Older name of --min-effect.", hidden=True)
    ] = None,
    alpha: Annotated[float | None, typer.Option(help="Within-run test level (0.01).")] = None,
    min_samples: Annotated[int | None, typer.Option(help="Min steps per run (8).")] = None,
    warmup_steps: Annotated[
        int | None, typer.Option(help="Leading steps left out (default: the steady rule, 1).")
    ] = None,
    stragglers: Annotated[str | None, typer.Option(help="fail, warn or off.")] = None,
    inconclusive_ok: Annotated[
        bool | None, typer.Option("--inconclusive-ok", help="Exit 0, not 5, if undecided.")
    ] = None,
    paired: Paired = False,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Write JUnit XML.", readable=False)
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Write Markdown.", readable=False)
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json, markdown.")] = "table",
    no_color: NoColor = False,
    no_cache: NoCache = False,
) -> None:
    """CI performance gate: idle/wait limits, stragglers, regression against baseline runs."""
    from gpudiag.config import gate_config

    form = fmt  # the renderer picks the format once the result exists
    th = thresholds()
    effect = min_effect if min_effect is not None else max_regression
    cfg = gate_config(
        th.extra.get("gate"),
        max_idle_ratio=max_idle_ratio,
        max_comm_wait_ratio=max_comm_wait,
        max_data_wait_ratio=max_data_wait,
        alpha=alpha,
        min_samples=min_samples,
        min_effect_ratio=None if effect is None else effect / 100.0,
        warmup_steps=warmup_steps,
        stragglers=stragglers,
        inconclusive_ok=inconclusive_ok,
    )
    if paired:
        sys.exit(_gate_paired(paths, baseline, save_baseline, th, cfg, form, junit, markdown))
    if save_baseline is not None and not baseline and len(paths) > 1:
        sys.exit(_save_baseline(paths, save_baseline, th, cfg, form, junit, markdown))
    if len(paths) > 1 and not baseline:
        raise typer.BadParameter("one run to gate; several only with --baseline or --save-baseline")
    base_paths = [*(baseline or []), *paths[1:]]
    sys.exit(_gate_one(paths[0], base_paths, th, cfg, form, save_baseline, junit, markdown))


def _gate_paired(
    paths: list[Path],
    baseline: list[Path] | None,
    save_baseline: Path | None,
    th: Thresholds,
    cfg: Any,
    form: str,
    junit: Path | None,
    markdown: Path | None,
) -> int:
    """``--paired B1 C1 B2 C2 …``: each candidate run against the baseline run before it."""
    if save_baseline is not None or baseline or len(paths) < 4 or len(paths) % 2:
        raise typer.BadParameter(
            "--paired takes the baseline and candidate runs alternated as they were "
            "recorded, two pairs or more: `gpudiag gate --paired B1 C1 B2 C2 B3 C3` "
            f"(got {len(paths)} paths{', and --baseline' if baseline else ''}"
            f"{', and --save-baseline' if save_baseline is not None else ''})"
        )
    base, cands = paths[0::2], paths[1::2]
    return _gate_one(cands[0], base, th, cfg, form, None, junit, markdown, cands[1:])


def _gate_one(
    path: Path,
    base_paths: list[Path],
    th: Thresholds,
    cfg: Any,
    form: str,
    save_diagnosis: Path | None,
    junit: Path | None,
    markdown: Path | None,
    paired: Sequence[Path] | None = None,
) -> int:
    """Gate one run against the baseline runs; its exit code.

    ``paired``: the candidate's further runs (``--paired``), each paired with the baseline
    run of its position (``path`` with the first).
    """
    from gpudiag.analysis.compare.baseline import run_outcome
    from gpudiag.analysis.compare.gate import evaluate
    from gpudiag.report import ci

    d = diagnosis(path, th)
    ended = run_outcome(d)
    if save_diagnosis is not None and ended:
        print(
            f"gpudiag: {path}: not saved as a baseline to {save_diagnosis}: the run did not "
            f"end well ({ended})",
            file=sys.stderr,
        )
    elif save_diagnosis is not None:
        emit(d, "json", save_diagnosis)
    base = [r for p in base_paths for r in _gate_runs(p, th, cfg)] or None
    names = " ".join(str(p) for p in base_paths) or None
    more = None if paired is None else [r for p in paired for r in _gate_runs(p, th, cfg)]
    conditions = steady_conditions(path, d, th, cfg)
    res = evaluate(d, cfg, base, str(path), names, th, conditions, more)
    emit(res, form, None)
    ci.write_outputs(res, junit, markdown)
    if res.exit_code:
        print(f"gpudiag: gate {res.status} (exit {res.exit_code})", file=sys.stderr)
    return int(res.exit_code)


def _save_baseline(
    paths: list[Path],
    out: Path,
    th: Thresholds,
    cfg: Any,
    form: str,
    junit: Path | None,
    markdown: Path | None,
) -> int:
    """Write a baseline file of several runs, one labelled row each; nothing is judged."""
    import json

    from gpudiag.analysis.compare.baseline import baseline_to_json, run_stat
    from gpudiag.analysis.compare.gate import baseline_summary
    from gpudiag.errors import InputError
    from gpudiag.report import ci
    from gpudiag.rundir.layout import atomic_write

    runs = []
    for p in paths:
        d = diagnosis(p, th)
        runs.append(run_stat(d, str(p), steady_conditions(p, d, th, cfg), cfg.warmup_steps, th))
    bad = [r for r in runs if r.outcome]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(
            bad[0].name,
            f"the run did not end well ({bad[0].outcome}): refused as a baseline{more}",
            "re-run it, or leave it out of the baseline; nothing was written",
        )
    with atomic_write(out) as f:
        json.dump(baseline_to_json(runs, cfg, __version__), f, indent=1)
        f.write("\n")
    print(f"wrote {out}: baseline of {len(runs)} runs", file=sys.stderr)
    res = baseline_summary(runs, cfg, f"baseline {out}")
    emit(res, form, None)
    ci.write_outputs(res, junit, markdown)
    return int(res.exit_code)


@app.command(cls=clihelp.Command)
def diff(
    a: Annotated[
        Path, typer.Argument(help="Run A (run dir, traces or diagnosis JSON).", readable=False)
    ],
    b: Annotated[Path, typer.Argument(help="Run B, compared with A.", readable=False)],
    fmt: Annotated[
        str | None, typer.Option("--format", "-f", help="table, markdown, json.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here.", readable=False)
    ] = None,
    no_color: NoColor = False,
    no_cache: NoCache = False,
) -> None:
    """What changed between two runs: step time, shares, idle ratio, per rank."""
    from gpudiag.analysis.compare.diff import diff as run_diff

    th = thresholds()
    emit(run_diff(diagnosis(a, th), diagnosis(b, th), str(a), str(b), th.diff, th), fmt, output)


@app.command(cls=clihelp.Command)
def report(
    path: Annotated[
        Path, typer.Argument(help="Run directory, traces, or a diagnosis JSON.", readable=False)
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The HTML file to write.", readable=False)
    ] = Path("gpudiag-report.html"),
    no_cache: NoCache = False,
) -> None:
    """Write one self-contained HTML report (charts inline, works offline)."""
    emit(diagnosis(path, thresholds()), "html", output)
