"""Thin typer app (run, collect, attach, analyze, report, gate, doctor); each command ≲ 20 lines."""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpudiag import __version__, clihelp
from gpudiag.config import Thresholds, load_project_config, thresholds_from_config
from gpudiag.errors import EXIT_USAGE, GpudiagError
from gpudiag.runconditions import RunConditions

# A command builds ~100 classes and then a diagnosis, nearly all of it alive until exit;
# the collector's default (a pass every 700 new objects) walks them again and again:
# ~15 ms of a small `analyze` (issue 23). A pass every 10,000 costs half of that and
# holds back little more garbage.
gc.set_threshold(10_000, 10, 10)

app = typer.Typer(
    name="gpudiag",
    cls=clihelp.Group,
    help="Why is my distributed PyTorch training slow? Compute, data-wait, comm-wait, stragglers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)

_state: dict[str, Any] = {"debug": False, "cache": True}


def _version(value: bool) -> None:
    if value:
        print(f"gpudiag {__version__}")
        raise typer.Exit()


def _no_color(value: bool) -> None:
    """``--no-color``: as ``NO_COLOR=1`` for everything this process prints."""
    if value:
        os.environ["NO_COLOR"] = "1"


NoColor = Annotated[
    bool,
    typer.Option("--no-color", callback=_no_color, help="No colour (also: NO_COLOR=1, TERM=dumb)."),
]


def _no_cache(value: bool) -> None:
    """``--no-cache``: analyse every trace file anew, and store nothing (gpudiag.cache)."""
    if value:
        _state["cache"] = False


NoCache = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        callback=_no_cache,
        help="Read every trace anew; keep no per-rank results (also: GPUDIAG_NO_CACHE=1).",
    ),
]


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    no_color: NoColor = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _state["debug"] = debug
    _state["cache"] = True  # until a command's --no-cache says otherwise


def thresholds(**overrides: Any) -> Thresholds:
    """Defaults → [tool.gpudiag] → CLI options (``None`` means not given)."""
    return thresholds_from_config(load_project_config()).replace(**overrides)


def emit(result: Any, fmt: str, output: Path | None, **options: Any) -> None:
    """Render ``result`` on stdout, or into ``output`` by the rules of :mod:`gpudiag.fileio`.

    ``-`` is stdout; a regular file (or a new one) is replaced atomically; a device, FIFO
    or symbolic link is written through; anything else is refused with one line.
    """
    from gpudiag.report import render

    if output is None or str(output) == "-":
        render(result, fmt, sys.stdout, **options)
        return
    from gpudiag.fileio import write_output

    with write_output(output) as f:
        render(result, fmt, f, **options)
    print(f"wrote {output}", file=sys.stderr)


def _diagnosis(path: Path, th: Thresholds, **kw: Any) -> Any:
    """A Diagnosis: a saved diagnosis JSON read back, anything else analysed."""
    from gpudiag import api

    return api.analyze(path, thresholds=th, cache=_state["cache"], **kw)


@app.command(cls=clihelp.Command)
def analyze(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Run directory, trace files, or directories of traces.", readable=False
        ),
    ],
    steps: Annotated[bool, typer.Option("--steps", help="Also print the per-step table.")] = False,
    fmt: Annotated[
        str | None, typer.Option("--format", "-f", help="table, json, csv, markdown or html.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report here.", readable=False)
    ] = None,
    idle_threshold: Annotated[
        float | None, typer.Option("--idle-threshold", help="Flag idle ratios above this (0.3).")
    ] = None,
    step_marker: Annotated[
        str | None, typer.Option("--step-marker", help="Regex for step ranges; group 1 = number.")
    ] = None,
    data_marker: Annotated[
        str | None, typer.Option("--data-marker", help="Regex for data-loading ranges.")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", help="Worker processes (CPUs).")
    ] = None,
    nsys: Annotated[
        Path | None, typer.Option("--nsys", help="nsys binary to export .nsys-rep reports with.")
    ] = None,
    include_warmup: Annotated[
        bool, typer.Option("--include-warmup", help="Keep slow leading (warm-up) steps.")
    ] = False,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            help="Analyse each rank file on this Dask scheduler's workers (tcp://HOST:PORT; "
            "`local`: here). Default: $DASK_SCHEDULER_ADDRESS, then [tool.gpudiag] scheduler.",
        ),
    ] = None,
    timeline: Annotated[
        Path | None,
        typer.Option(
            "--timeline",
            help="Also write the annotated timeline here (open it in ui.perfetto.dev), "
            "e.g. timeline.json.gz.",
        ),
    ] = None,
    timeline_full: Annotated[
        bool, typer.Option("--timeline-full", help="Add the raw kernels to --timeline.")
    ] = False,
    no_color: NoColor = False,
    no_cache: NoCache = False,
) -> None:
    """Diagnose PyTorch Profiler traces, Nsight Systems reports or a gpudiag run directory."""
    from gpudiag.report import pick_format

    form = pick_format("diagnosis", fmt, output)
    if timeline_full and timeline is None:
        raise GpudiagError("--timeline-full adds to --timeline", "give --timeline FILE too",
                           EXIT_USAGE)  # fmt: skip
    th = thresholds(idle_ratio_max=idle_threshold, step_re=step_marker, data_re=data_marker)
    if include_warmup:
        th = th.replace(steady=dataclasses.replace(th.steady, include_warmup=True))
    d = _diagnose_paths(paths, th, jobs, nsys, scheduler, timeline, timeline_full)
    _warn_steps(d)
    emit(d, form, output, **({"show_steps": steps} if form == "table" else {}))


def _quiet_dask() -> None:
    """Dask's loggers at ERROR (its retries are noise on gpudiag's stderr).

    Importing ``distributed`` sets ``distributed.client`` and others to their configured
    levels, so it is imported first (when installed) and then every one of them is set.
    """
    import importlib.util
    import logging

    if importlib.util.find_spec("distributed") is not None:
        import distributed  # noqa: F401

    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.ERROR)


def _diagnose_paths(
    paths: list[Path],
    th: Thresholds,
    jobs: int | None,
    nsys: Path | None,
    scheduler: str | None,
    timeline: Path | None,
    timeline_full: bool,
) -> Any:
    """``api.analyze`` with the scheduler chosen and a progress bar on a terminal."""
    from gpudiag import api
    from gpudiag.config import scheduler_address
    from gpudiag.report.live import analysis_progress

    address = scheduler_address(scheduler, th)
    if address is not None:  # stderr carries gpudiag's own lines: Dask's are retried noise
        _quiet_dask()
    if address is not None and jobs is not None:
        raise GpudiagError("--jobs bounds local processes; with a Dask scheduler leave it out",
                           f"the cluster at {address} decides", EXIT_USAGE)  # fmt: skip
    hook, bar = analysis_progress()
    try:
        return api.analyze(*paths, thresholds=th, jobs=jobs, nsys=str(nsys) if nsys else None,
                           scheduler=address, progress=hook, timeline=timeline,
                           timeline_full=timeline_full, cache=_state["cache"])  # fmt: skip
    finally:
        if bar is not None:
            bar.stop()


def _warn_steps(d: Any) -> None:
    """Say on stderr when steps were not found from markers: every number depends on them."""
    from gpudiag.analysis.metrics import SourceMissingMetrics

    for f in d.findings:
        m = f.metrics
        if isinstance(m, SourceMissingMetrics) and m.missing == "steps":
            who = ", ".join(map(str, f.ranks))
            print(f"gpudiag: warning: rank {who}: {f.message}", file=sys.stderr)


def _printable(text: str) -> str:
    """One line without control characters: messages quote file names and file contents."""
    text = " ".join(str(text).splitlines())
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


_ROOT_FLAGS = {"--debug", "--no-color"}  # the root options that a command name may follow


def _app_for(args: list[str]) -> typer.Typer:
    """The app with only the command that ``args`` runs, or the whole app.

    typer builds every command's options (evaluating each annotation of its function:
    ~30 ms for the seven) before it looks at the arguments; one command needs only its
    own. Help, ``--version``, an unknown name or any other root option get the whole app.
    """
    i = 0
    while i < len(args) and args[i] in _ROOT_FLAGS:
        i += 1
    if i == len(args):
        return app
    name = args[i]
    infos = [c for c in app.registered_commands
             if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]  # type: ignore[union-attr]  # fmt: skip
    if len(infos) != 1:
        return app
    one = copy.copy(app)
    one.registered_commands = infos
    return one


def _is_a(e: BaseException, name: str) -> bool:
    """Whether ``e`` is a click exception of that class (typer vendors its own click)."""
    return any(c.__name__ == name for c in type(e).__mro__)


def _usage_words(e: Any) -> tuple[str, str]:
    """A click usage error as gpudiag says errors: one line, and a hint.

    An unknown option suggests only a close match (``--jbos`` → ``--jobs``, the only option
    it begins: ``--max-idle`` → ``--max-idle-ratio``; ``--bogus`` suggests nothing), compared
    without the leading dashes.
    """
    import difflib

    where = e.ctx.command_path if e.ctx is not None else "gpudiag"
    help_hint = f"see '{where} --help'"
    if _is_a(e, "NoSuchOption"):
        names = [o for p in (e.ctx.command.params if e.ctx else []) for o in p.opts
                 if o.startswith("-")]  # fmt: skip
        bare = {n.lstrip("-"): n for n in names}
        given = e.option_name.lstrip("-")
        close = [n for n in bare if n.startswith(given)] if len(given) >= 3 else []
        close = (close if len(close) == 1
                 else difflib.get_close_matches(given, list(bare), n=1, cutoff=0.75))  # fmt: skip
        hint = f"did you mean {bare[close[0]]}? ({help_hint})" if close else help_hint
        return f"{where}: no such option: {e.option_name}", hint
    text = e.format_message().strip() if hasattr(e, "format_message") else str(e)
    return f"{where}: {text}", help_hint


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; print GpudiagError as one line plus a hint, exit with its code."""
    from gpudiag.cli_coerce import install

    command = typer.main.get_command(_app_for(sys.argv[1:] if argv is None else argv))
    install(command)  # plain str/Path/int/float coercion: no pydantic in every process
    try:
        command.main(args=argv, prog_name="gpudiag", standalone_mode=False)
    except GpudiagError as e:
        if _state["debug"]:
            raise
        print(f"gpudiag: error: {_printable(e.message)}", file=sys.stderr)
        if e.hint:
            print(f"  hint: {_printable(e.hint)}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("gpudiag: aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # The reader of stdout went away (`gpudiag … | head`): stop quietly, as cat does.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except Exception as e:
        if _is_a(e, "UsageError"):  # click/typer usage errors: gpudiag's one line
            message, hint = _usage_words(e)
            print(f"gpudiag: error: {_printable(message)}", file=sys.stderr)
            print(f"  hint: {_printable(hint)}", file=sys.stderr)
            sys.exit(int(getattr(e, "exit_code", EXIT_USAGE) or EXIT_USAGE))
        if _state["debug"]:
            raise
        print(f"gpudiag: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            "  hint: re-run with --debug for the traceback, and please report it", file=sys.stderr
        )
        sys.exit(70)


# ---- capture commands (run, attach, doctor) ----


TIMELINE_FILE = "timeline.json.gz"  # the annotated timeline in every run directory


def _print_run_diagnosis(out_dir: Path, run_dir: Path) -> None:
    """Print the diagnosis of a finished run on stdout; failures only mark it incomplete."""
    from gpudiag.collect.log import log
    from gpudiag.collect.run_manifest import record_incomplete

    try:
        from gpudiag import api
        from gpudiag.report.console import render

        d = api.analyze(out_dir, thresholds=thresholds(), timeline=out_dir / TIMELINE_FILE,
                        cache=True)  # fmt: skip
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
        raise GpudiagError(f"--alerts {alerts} is not on or off", "use --alerts on or --alerts off",
                           EXIT_USAGE)  # fmt: skip
    if alerts == "off":
        if alert_exec:
            raise GpudiagError("--alert-exec needs the alerts on", "drop --alerts off",
                               EXIT_USAGE)  # fmt: skip
        return None
    from gpudiag.collect.log import log
    from gpudiag.live.monitor import AlertOptions, Monitor

    return Monitor(thresholds(), AlertOptions(exec_cmd=alert_exec), log=log)


def _with_alerts(show: Any, monitor: Any) -> Any:
    """The progress callback, with the alerts raised now in each snapshot (the live panel)."""
    if show is None or monitor is None:
        return show

    def with_alerts(p: Any) -> None:
        show(dataclasses.replace(p, alerts=[a.line() for a in monitor.raised()]))

    return with_alerts


def _check_run_args(profile_steps: str, nsys_range: str) -> None:
    """Usage errors of `gpudiag run` that typer cannot see: the window and the nsys range."""
    from gpudiag.collect import hook

    try:
        hook.parse_window(profile_steps)
    except ValueError as e:
        raise GpudiagError(str(e), "use --profile-steps 5:10 or off", EXIT_USAGE) from e
    if nsys_range not in ("window", "all"):
        raise GpudiagError(f"--nsys-range {nsys_range} is not window or all",
                           "use --nsys-range window or --nsys-range all", EXIT_USAGE)  # fmt: skip


def _hang_options(timeout_s: float | None, on_hang: str) -> Any:
    """The watchdog's settings: --hang-timeout, else [tool.gpudiag.hang]; its report printer."""
    from gpudiag.collect import watchdog

    if on_hang not in watchdog.ON_HANG:
        raise GpudiagError(f"--on-hang {on_hang} is not report or kill",
                           "use --on-hang report or --on-hang kill", EXIT_USAGE)  # fmt: skip
    if timeout_s is not None and not timeout_s > 0:
        raise GpudiagError(f"--hang-timeout {timeout_s} is not a positive number of seconds",
                           "use e.g. --hang-timeout 600", EXIT_USAGE)  # fmt: skip
    rules = thresholds().hang
    if timeout_s is None and rules.timeout_s > 0:
        timeout_s = rules.timeout_s
    return watchdog.HangOptions(
        timeout_s=timeout_s,
        on_hang=on_hang,
        min_timeout_s=rules.min_timeout_s,
        step_factor=rules.step_factor,
        answer_wait_s=rules.answer_wait_s,
        report=_print_hang,
    )


def _print_hang(event: Any) -> None:
    """Print the live hang diagnosis on stderr, from what the ranks wrote just now."""
    from gpudiag.collect import hangdump
    from gpudiag.collect.log import log

    try:
        from gpudiag.analysis.hang import analyze_dumps
        from gpudiag.analysis.hang_cases import hang_cases
        from gpudiag.traces.flightrec import read_hang_dir

        d = hangdump.hang_dir(Path(event.run_dir))
        dumps, stacks, _ = read_hang_dir(d) if d.is_dir() else ([], [], [])
        analysis = analyze_dumps(dumps) if dumps else None
        cases = hang_cases(analysis, stacks)
        log(
            f"no rank finished a step for {event.idle_s:.0f} s (hang timeout {event.timeout_s:g} s)"
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
    except Exception as e:
        log(f"hang report failed ({type(e).__name__}: {e}); evidence in the run directory")


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
            "(default: the larger of 5 min and 20× the median step).",
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
    from gpudiag.collect import launcher, watchdog
    from gpudiag.collect.log import log
    from gpudiag.collect.run_setup import RunOptions
    from gpudiag.report.live import run_progress

    _check_run_args(profile_steps, nsys_range)
    opts = RunOptions(command, out, profile_steps, not no_nvml, nvml_interval, node_rank)
    opts.nsys, opts.nsys_range = nsys, nsys_range
    monitor = _alert_monitor(alerts, alert_exec)
    opts.watchers = [monitor] if monitor is not None else []
    opts.hang = _hang_options(hang_timeout, on_hang)
    show, live = run_progress(quiet)
    show = _with_alerts(show, monitor)
    try:
        res = launcher.run(opts, progress=show)
    finally:
        if live is not None and live.is_started:
            live.stop()
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
    from gpudiag import rundir
    from gpudiag.collect import attach as att
    from gpudiag.collect.log import log
    from gpudiag.collect.run_setup import default_out_dir

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
    from gpudiag.collect.probe import probe

    emit(probe().as_dict(), "json" if as_json else "table", None)


# ---- gate, report, diff ----


def _run_conditions(path: Path) -> RunConditions | None:
    """The run conditions a run directory's manifests recorded (None when there are none)."""
    from gpudiag import runconditions, rundir

    if not rundir.is_run_dir(path):
        return None
    found = []
    for node in rundir.node_dirs(path):
        try:
            found.append(rundir.read_manifest(node / rundir.MANIFEST).conditions)
        except ValueError:
            continue
    return runconditions.merge(found)


def _gate_runs(path: Path, th: Thresholds, cfg: Any) -> list[Any]:
    """A baseline path as RunStats: a baseline file's runs, or one analysed run."""
    import json

    from gpudiag.analysis.baseline import BASELINE_FORMAT, baseline_from_json, run_stat
    from gpudiag.errors import InputError

    if path.is_file() and path.suffix == ".json":
        with path.open("rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
        if BASELINE_FORMAT in head:
            try:
                return baseline_from_json(json.loads(path.read_text(encoding="utf-8")))
            except (ValueError, OSError) as e:
                raise InputError(f"{path}: {e}", "write it again with `gpudiag gate "
                                 "--save-baseline FILE RUN…`") from e  # fmt: skip
    d = _diagnosis(path, th)
    return [run_stat(d, str(path), _run_conditions(path), cfg.warmup_steps, th)]


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
    from gpudiag.report import pick_format

    form = pick_format("gate", fmt, None)
    th = thresholds()
    effect = min_effect if min_effect is not None else max_regression
    cfg = gate_config(
        th.extra.get("gate"), max_idle_ratio=max_idle_ratio, max_comm_wait_ratio=max_comm_wait,
        max_data_wait_ratio=max_data_wait, alpha=alpha, min_samples=min_samples,
        min_effect_ratio=None if effect is None else effect / 100.0,
        warmup_steps=warmup_steps, stragglers=stragglers, inconclusive_ok=inconclusive_ok,
    )  # fmt: skip
    if save_baseline is not None and not baseline and len(paths) > 1:
        sys.exit(_save_baseline(paths, save_baseline, th, cfg, form, junit, markdown))
    if len(paths) > 1 and not baseline:
        raise typer.BadParameter("one run to gate; several only with --baseline or "
                                 "--save-baseline")  # fmt: skip
    base_paths = [*(baseline or []), *paths[1:]]
    sys.exit(_gate_one(paths[0], base_paths, th, cfg, form, save_baseline, junit, markdown))


def _gate_one(
    path: Path,
    base_paths: list[Path],
    th: Thresholds,
    cfg: Any,
    form: str,
    save_diagnosis: Path | None,
    junit: Path | None,
    markdown: Path | None,
) -> int:
    """Gate one run against the baseline runs; its exit code."""
    from gpudiag.analysis.gate import evaluate
    from gpudiag.report import ci

    d = _diagnosis(path, th)
    if save_diagnosis is not None:
        emit(d, "json", save_diagnosis)
    base = [r for p in base_paths for r in _gate_runs(p, th, cfg)] or None
    names = " ".join(str(p) for p in base_paths) or None
    res = evaluate(d, cfg, base, str(path), names, th, _run_conditions(path))
    emit(res, form, None)
    ci.write_outputs(res, junit, markdown)
    if res.exit_code:
        print(f"gpudiag: gate {res.status} (exit {res.exit_code})", file=sys.stderr)
    return int(res.exit_code)


def _save_baseline(paths: list[Path], out: Path, th: Thresholds, cfg: Any, form: str,
                   junit: Path | None, markdown: Path | None) -> int:  # fmt: skip
    """Write a baseline file of several runs, one labelled row each; nothing is judged."""
    import json

    from gpudiag.analysis.baseline import baseline_to_json, run_stat
    from gpudiag.analysis.gate import baseline_summary
    from gpudiag.report import ci
    from gpudiag.rundir import atomic_write

    runs = [run_stat(_diagnosis(p, th), str(p), _run_conditions(p), cfg.warmup_steps, th)
            for p in paths]  # fmt: skip
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
    from gpudiag.analysis.diff import diff as run_diff
    from gpudiag.report import pick_format

    form = pick_format("diff", fmt, output)
    th = thresholds()
    emit(run_diff(_diagnosis(a, th), _diagnosis(b, th), str(a), str(b), th.diff, th), form, output)


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
    emit(_diagnosis(path, thresholds()), "html", output)
