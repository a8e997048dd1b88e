"""The capture commands: ``gpudiag run`` (launch and watch a job), ``attach`` and ``doctor``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpudiag.cli import help as clihelp
from gpudiag.cli.base import emit, thresholds
from gpudiag.cli.common import NoColor, app
from gpudiag.errors import EXIT_USAGE, GpudiagError

TIMELINE_FILE = "timeline.json.gz"  # the annotated timeline in every run directory


def _print_run_diagnosis(out_dir: Path, run_dir: Path) -> None:
    """Print the diagnosis of a finished run on stdout; failures only mark it incomplete."""
    from gpudiag.collect.launch.log import log
    from gpudiag.collect.launch.run_manifest import record_incomplete

    try:
        from gpudiag.api import load as api
        from gpudiag.report.console import render

        d = api.analyze(
            out_dir, thresholds=thresholds(), timeline=out_dir / TIMELINE_FILE, cache=True
        )
        sys.stdout.flush()
        render(d, sys.stdout)
    except Exception as e:
        if isinstance(e, GpudiagError):
            msg = f"analysis failed: {e.message}" + (f" ({e.hint})" if e.hint else "")
        else:
            msg = f"analysis failed: {type(e).__name__}: {e}"
        log(f"{msg}; re-run it with `gpudiag analyze {out_dir}`")
        record_incomplete(run_dir, msg)


def _alert_monitor(alerts: str, alert_exec: str | None) -> Any:
    """The live alerts' monitor (gpudiag/live/monitor.py), or None with ``--alerts off``."""
    if alerts not in ("on", "off"):
        raise GpudiagError(
            f"--alerts {alerts} is not on or off", "use --alerts on or --alerts off", EXIT_USAGE
        )
    if alerts == "off":
        if alert_exec:
            raise GpudiagError("--alert-exec needs the alerts on", "drop --alerts off", EXIT_USAGE)
        return None
    from gpudiag.collect.launch.log import log
    from gpudiag.live.monitor import AlertOptions, Monitor

    return Monitor(thresholds(), AlertOptions(exec_cmd=alert_exec), log=log)


def _with_alerts(show: Any, monitor: Any) -> Any:
    """The progress callback, with the alerts raised now in each snapshot (the status line)."""
    if show is None or monitor is None:
        return show

    def with_alerts(p: Any) -> None:
        show(dataclasses.replace(p, alerts=[a.line() for a in monitor.raised()]))

    return with_alerts


def _check_run_args(profile_steps: str, nsys_range: str) -> None:
    """Usage errors of `gpudiag run` that typer cannot see: the window and the nsys range."""
    from gpudiag.collect.rank import hook

    try:
        hook.parse_window(profile_steps)
    except ValueError as e:
        raise GpudiagError(str(e), "use --profile-steps 5:10 or off", EXIT_USAGE) from e
    if nsys_range not in ("window", "all"):
        raise GpudiagError(
            f"--nsys-range {nsys_range} is not window or all",
            "use --nsys-range window or --nsys-range all",
            EXIT_USAGE,
        )


def _hang_options(timeout_s: float | None, on_hang: str) -> Any:
    """The watchdog's settings: --hang-timeout, else [tool.gpudiag.hang]; its report printer."""
    from gpudiag.collect.launch import watchdog

    if on_hang not in watchdog.ON_HANG:
        raise GpudiagError(
            f"--on-hang {on_hang} is not report or kill",
            "use --on-hang report or --on-hang kill",
            EXIT_USAGE,
        )
    if timeout_s is not None and not timeout_s > 0:
        raise GpudiagError(
            f"--hang-timeout {timeout_s} is not a positive number of seconds",
            "use e.g. --hang-timeout 600",
            EXIT_USAGE,
        )
    rules = thresholds().hang
    if timeout_s is None and rules.timeout_s > 0:
        timeout_s = rules.timeout_s
    return watchdog.HangOptions(
        timeout_s=timeout_s,
        on_hang=on_hang,
        min_timeout_s=rules.min_timeout_s,
        step_factor=rules.step_factor,
        startup_timeout_s=rules.startup_timeout_s,
        answer_wait_s=rules.answer_wait_s,
        report=_print_hang,
    )


def _print_hang(event: Any) -> None:
    """Print the live hang diagnosis on stderr, from what the ranks wrote just now."""
    from gpudiag.collect.launch.log import log
    from gpudiag.collect.rank import hangdump

    try:
        from gpudiag.analysis.hangs.cases import hang_cases
        from gpudiag.analysis.hangs.stuck import analyze_dumps
        from gpudiag.traces.runfiles.flightrec import read_hang_dir

        d = hangdump.hang_dir(Path(event.run_dir))
        dumps, stacks, _ = read_hang_dir(d) if d.is_dir() else ([], [], [])
        analysis = analyze_dumps(dumps) if dumps else None
        cases = hang_cases(analysis, stacks)
        log(
            f"the job looks stuck: no rank finished a step for {event.idle_s:.0f} s (hang "
            f"timeout {event.timeout_s:g} s: {event.rule or 'automatic'})"
        )
        if not cases:
            log(
                "stuck, but the ranks' evidence names no culprit "
                f"(answers from ranks {event.answered} of {event.expected}); see {d}"
            )
        for c in cases:
            log(("STUCK: " if c.kind == "hang" else "MISMATCH: ") + c.message)
        missing = sorted(set(event.expected) - set(event.answered))
        if missing:
            log(f"no answer from rank(s) {missing} within {event.answer_s:.0f} s")
        log(f"flight recorder and stacks: {d}")
        log(_next_words(event.on_hang))
    except Exception as e:
        log(f"hang report failed ({type(e).__name__}: {e}); evidence in the run directory")


def _next_words(on_hang: str) -> str:
    """What happens to the job now, and how to choose otherwise."""
    if on_hang == "kill":
        return "ending the job (--on-hang kill): SIGINT to its ranks, as Ctrl-C"
    return (
        "the job is left running (--on-hang report): press Ctrl-C to end it (what the ranks "
        "captured is kept), or wait for its own collective timeout; --on-hang kill ends a "
        "stuck job by itself, --hang-timeout S waits longer before calling it stuck"
    )


@app.command(cls=clihelp.Command, context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="The training command, after `--`.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Run directory (runs/<time>-<id>).")
    ] = None,
    profile_steps: Annotated[
        str, typer.Option("--profile-steps", help="Steps A:B (B exclusive) to profile, or off.")
    ] = "5:10",
    nvml_interval: Annotated[
        float, typer.Option("--nvml-interval", help="Seconds between NVML samples.")
    ] = 0.1,
    no_nvml: Annotated[bool, typer.Option("--no-nvml", help="Do not sample NVML.")] = False,
    node_rank: Annotated[
        int | None, typer.Option("--node-rank", help="This node's rank (GROUP_RANK/SLURM_NODEID).")
    ] = None,
    no_analyze: Annotated[bool, typer.Option("--no-analyze", help="Skip the diagnosis.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
    nsys: Annotated[
        bool, typer.Option("--nsys", help="Also record with Nsight Systems (nsys profile).")
    ] = False,
    nsys_range: Annotated[
        str, typer.Option("--nsys-range", help="window (the profiled steps, via CUDA) or all.")
    ] = "window",
    alerts: Annotated[
        str,
        typer.Option(
            "--alerts", metavar="on|off", help="on: live alerts (stderr, alerts.jsonl, panel); off."
        ),
    ] = "on",
    alert_exec: Annotated[
        str | None,
        typer.Option(
            "--alert-exec", metavar="CMD", help="Run CMD (sh -c) with each alert's JSON on stdin."
        ),
    ] = None,
    hang_timeout: Annotated[
        float | None,
        typer.Option(
            "--hang-timeout",
            metavar="S",
            help="Seconds without a finished step on any rank before the job counts as stuck "
            "(default: the larger of 60 s and 10× the median step; 5 min before the first).",
        ),
    ] = None,
    on_hang: Annotated[
        str,
        typer.Option(
            "--on-hang", metavar="report|kill", help="report (keep the job running) or kill."
        ),
    ] = "report",
) -> None:
    """Run a training command unchanged and capture NVML, traces and step telemetry."""
    from gpudiag.collect.launch import launcher, watchdog
    from gpudiag.collect.launch.log import log
    from gpudiag.collect.launch.run_setup import RunOptions
    from gpudiag.report.live import run_progress

    _check_run_args(profile_steps, nsys_range)
    opts = RunOptions(command, out, profile_steps, not no_nvml, nvml_interval, node_rank)
    opts.nsys, opts.nsys_range = nsys, nsys_range
    monitor = _alert_monitor(alerts, alert_exec)
    opts.watchers = [monitor] if monitor is not None else []
    opts.hang = _hang_options(hang_timeout, on_hang)
    show, status = run_progress(quiet)
    show = _with_alerts(show, monitor)
    try:
        res = launcher.run(opts, progress=show)
    finally:
        if status is not None:
            status.stop()
    log(f"{watchdog.ended_words(res.manifest, res.exit_code)}; run directory {res.out_dir}")
    if not no_analyze:
        _print_run_diagnosis(res.out_dir, res.run_dir)
    print(f"run directory: {res.out_dir}", file=sys.stderr)
    sys.stdout.flush()
    # SystemExit, not typer.Exit: main() runs click with standalone_mode=False, which
    # turns typer.Exit into a return value and would lose the job's exit code.
    sys.exit(res.exit_code)


@app.command(cls=clihelp.Command)
def attach(
    pid: Annotated[int | None, typer.Option("--pid", help="A running job's PID.")] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run", help="Run directory of a live `gpudiag run`.")
    ] = None,
    profile_next: Annotated[
        int | None, typer.Option("--profile-next", help="With --run: profile the next N steps.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Where to write the samples.")] = None,
    nvml_interval: Annotated[float, typer.Option("--nvml-interval")] = 0.1,
) -> None:
    """Sample the GPUs of a running job, or ask a `gpudiag run` job to profile now."""
    from gpudiag.collect.launch import attach as att
    from gpudiag.collect.launch.log import log
    from gpudiag.collect.launch.run_setup import default_out_dir
    from gpudiag.rundir import layout as rundir

    if profile_next is not None:
        if run_dir is None or profile_next <= 0:
            raise GpudiagError("--profile-next N needs --run RUN_DIR and N > 0", "", EXIT_USAGE)
        dirs = [d for d in (rundir.node_dirs(run_dir) or [run_dir]) if att.live_run(d)]
        if not dirs:
            raise GpudiagError(
                f"{run_dir}: no live `gpudiag run` job writes here",
                "pass the run directory printed by `gpudiag run`",
                EXIT_USAGE,
            )
        for d in dirs:
            log(f"requested {profile_next} profiled steps: {att.request_profile(d, profile_next)}")
        return
    if pid is None:
        raise GpudiagError("give --pid PID (or --run RUN_DIR --profile-next N)", "", EXIT_USAGE)
    target = out or run_dir or default_out_dir()
    log(f"sampling the GPUs of PID {pid} into {target} until it ends (Ctrl-C stops)")
    res = att.attach(pid, target, interval_s=nvml_interval)
    if res.reason:
        log(res.reason)
    print(f"run directory: {res.run_dir}", file=sys.stderr)


@app.command(cls=clihelp.Command)
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    no_color: NoColor = False,
) -> None:
    """Show what this host can capture (NVML, GPUs, torch, CUDA, NCCL, nsys) and why not."""
    from gpudiag.collect.launch.probe import probe

    emit(probe().as_dict(), "json" if as_json else "table", None)
