"""Help text a practitioner reads: plain metavars, an example per command, 80 columns.

Typer's own help spells parameters with Python types (``command... <list[str]>``,
``{command}...``, ``--out <path>``) and cuts the top-level command list at the terminal's
width. :class:`Command` and :class:`Group` replace only the formatting: an argument is its
upper-case name (``COMMAND...``), an option its flag and a metavar from its click type
(``PATH``, ``N``, ``X``, ``TEXT``, or ``a|b`` for a choice), each command's examples
(:data:`EXAMPLES`) close its help, and the command list shows each first sentence whole,
wrapped. docs/cli.md lists the same options and defaults (tests/unit/cli/test_cli_help.py
compares them).
"""

from __future__ import annotations

from typing import Any

from typer import _click as click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

#: ``gpudiag COMMAND --help`` ends with these (the README's and docs/cli.md's examples).
EXAMPLES: dict[str, list[str]] = {
    "analyze": [
        "gpudiag analyze runs/20250101-120000-ab12cd",
        "gpudiag analyze traces/ --format json -o diagnosis.json",
    ],
    "run": ["gpudiag run -- torchrun --standalone --nproc-per-node 2 train.py"],
    "attach": [
        "gpudiag attach --pid 12345 --out samples/",
        "gpudiag attach --run runs/20250101-120000-ab12cd --profile-next 5",
    ],
    "doctor": ["gpudiag doctor"],
    "gate": [
        "gpudiag gate --save-baseline baseline.json runs/a runs/b runs/c",
        "gpudiag gate runs/new --baseline baseline.json --junit gate.xml",
    ],
    "diff": ["gpudiag diff runs/before runs/after"],
    "report": ["gpudiag report runs/20250101-120000-ab12cd -o report.html"],
}

#: An option's metavar, as docs/cli.md spells it (``COMMAND --flag`` first, then ``--flag``).
METAVARS: dict[str, str] = {
    "--out": "DIR",
    "--profile-steps": "A:B",
    "--nvml-interval": "S",
    "--node-rank": "K",
    "--nsys-range": "window|all",
    "--output": "FILE",
    "--idle-threshold": "R",
    "--step-marker": "REGEX",
    "--data-marker": "REGEX",
    "--jobs": "N",
    "--nsys": "PATH",
    "--scheduler": "ADDRESS",
    "--timeline": "FILE",
    "--pid": "PID",
    "--run": "DIR",
    "--profile-next": "N",
    "--baseline": "B1",
    "--save-baseline": "FILE",
    "--max-idle-ratio": "R",
    "--max-comm-wait": "R",
    "--max-data-wait": "R",
    "--min-effect": "PCT",
    "--alpha": "A",
    "--min-samples": "N",
    "--warmup-steps": "N",
    "--stragglers": "fail|warn|off",
    "--junit": "FILE",
    "--markdown": "FILE",
    "analyze --format": "table|json|csv|markdown|html",
    "gate --format": "table|json|markdown",
    "diff --format": "table|markdown|json",
}

_TYPES = {
    "int": "N",
    "float": "X",
    "str": "TEXT",
    "path": "PATH",
    "file": "PATH",
    "directory": "DIR",
}

Param = TyperArgument | TyperOption


def metavar(param: Param, ctx: click.Context) -> str:
    """How a parameter's value is written in help: its metavar, else one from its type."""
    if param.metavar:
        return str(param.metavar)
    if isinstance(param, TyperArgument):
        return (param.name or "arg").upper()
    flag = max(param.opts, key=len)
    named = METAVARS.get(f"{ctx.info_name} {flag}") or METAVARS.get(flag)
    if named:
        return named
    label = param.display_type(ctx).strip("<>")
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    return _TYPES.get(label.lower(), label.upper())


def _option_name(opt: TyperOption, ctx: click.Context) -> str:
    flags = sorted(opt.opts, key=lambda s: (len(s) > 2, s)) + list(opt.secondary_opts)
    name = ", ".join(flags)
    if not opt.is_flag and not opt.count:
        name += " " + metavar(opt, ctx)
    return name


def _record(param: Any, ctx: click.Context) -> tuple[str, str] | None:
    rv = param.get_help_record(ctx)
    if rv is None:
        return None
    if isinstance(param, TyperOption):
        return _option_name(param, ctx), rv[1]
    dots = "..." if param.nargs != 1 else ""
    return metavar(param, ctx) + dots, rv[1]


def _usage_pieces(cmd: click.Command, ctx: click.Context) -> list[str]:
    pieces = [cmd.options_metavar] if cmd.options_metavar else []
    for p in cmd.get_params(ctx):
        if isinstance(p, TyperArgument):
            text = metavar(p, ctx) + ("..." if p.nargs != 1 else "")
            if cmd.context_settings.get("allow_interspersed_args") is False:
                text = "[--] " + text  # the command after `--`, options before it
            pieces.append(text if p.required else f"[{text}]")
    return pieces


def _format_params(cmd: click.Command, ctx: click.Context, fmt: click.HelpFormatter) -> None:
    args: list[tuple[str, str]] = []
    opts: list[tuple[str, str]] = []
    for p in cmd.get_params(ctx):
        rec = _record(p, ctx)
        if rec is not None:
            (args if isinstance(p, TyperArgument) else opts).append(rec)
    if args:
        with fmt.section("Arguments"):
            fmt.write_dl(args)
    if opts:
        with fmt.section("Options"):
            fmt.write_dl(opts)


def _format_examples(name: str | None, fmt: click.HelpFormatter) -> None:
    lines = EXAMPLES.get(name or "", [])
    if lines:
        with fmt.section("Examples"):
            for line in lines:
                fmt.write_text("\b\n" + line)


class Command(TyperCommand):
    """A command whose help names parameters plainly and ends with examples."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:  # noqa: D102
        return _usage_pieces(self, ctx)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:  # noqa: D102
        _format_params(self, ctx, formatter)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:  # noqa: D102
        super().format_epilog(ctx, formatter)
        _format_examples(self.name, formatter)


class Group(TyperGroup):
    """The top level: options plainly, and every command's first sentence whole."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:  # noqa: D102
        _format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:  # noqa: D102
        rows = []
        for name in self.list_commands(ctx):
            cmd: Any = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
