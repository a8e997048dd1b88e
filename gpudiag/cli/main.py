"""The gpudiag command line: builds only the command it runs, says errors in one line.

A thin typer app (:data:`gpudiag.cli.common.app`); its commands are in
:mod:`gpudiag.cli.analyze` (analyze), :mod:`gpudiag.cli.capture` (run, attach, doctor) and
:mod:`gpudiag.cli.gate` (gate, diff, report), each ≲ 20 lines, registered in that order when
:func:`typer_app` imports them. The common spellings of ``gpudiag analyze`` run without
typer (:mod:`gpudiag.cli.quick`); everything else goes through typer.
"""

from __future__ import annotations

import copy
import gc
import sys
from typing import TYPE_CHECKING, Any

from gpudiag.cli.base import state
from gpudiag.cli.quick import ROOT_FLAGS
from gpudiag.errors import EXIT_USAGE, GpudiagError

if TYPE_CHECKING:
    import typer

# A command builds ~100 classes and then a diagnosis, nearly all of it alive until exit;
# the collector's default (a pass every 700 new objects) walks them again and again:
# ~15 ms of a small `analyze` (issue 23). A pass every 10,000 costs half of that and
# holds back little more garbage.
gc.set_threshold(10_000, 10, 10)


def _printable(text: str) -> str:
    """One line without control characters: messages quote file names and file contents."""
    text = " ".join(str(text).splitlines())
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


_ROOT_FLAGS = set(ROOT_FLAGS)  # the root options that a command name may follow


def typer_app() -> typer.Typer:
    """The whole typer app, its commands registered."""
    from gpudiag.cli import analyze as cli_analyze  # noqa: F401  (registers the commands)
    from gpudiag.cli import capture as cli_capture  # noqa: F401  (registers the commands)
    from gpudiag.cli import gate as cli_gate  # noqa: F401  (registers the commands)
    from gpudiag.cli.common import app

    return app


def _hoisted(args: list[str]) -> list[str]:
    """``args`` with the root flags given after the command name moved before it.

    ``gpudiag analyze DIR --debug`` means ``gpudiag --debug analyze DIR``: both spellings
    work. Nothing after ``--`` moves, and for ``run`` nothing from the job's command on (its
    first argument that is not an option), so a job's own ``--debug`` stays the job's.
    """
    i = 0
    while i < len(args) and args[i] in _ROOT_FLAGS:
        i += 1
    if i >= len(args) or args[i].startswith("-"):
        return args
    head, rest = args[: i + 1], args[i + 1 :]
    moved: list[str] = []
    kept: list[str] = []
    for j, a in enumerate(rest):
        if a == "--" or (args[i] == "run" and not a.startswith("-")):
            kept.extend(rest[j:])
            break
        (moved if a in _ROOT_FLAGS else kept).append(a)
    return moved + head + kept if moved else args


def _app_for(args: list[str]) -> typer.Typer:
    """The app with only the command that ``args`` runs, or the whole app.

    typer builds every command's options (evaluating each annotation of its function:
    ~30 ms for the seven) before it looks at the arguments; one command needs only its
    own. Help, ``--version``, an unknown name or any other root option get the whole app.
    """
    import typer

    app = typer_app()
    i = 0
    while i < len(args) and args[i] in _ROOT_FLAGS:
        i += 1
    if i == len(args):
        return app
    name = args[i]
    infos = [
        c
        for c in app.registered_commands
        if (c.name or typer.main.get_command_name(c.callback.__name__)) == name  # type: ignore[union-attr]
    ]
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
        names = [
            o for p in (e.ctx.command.params if e.ctx else []) for o in p.opts if o.startswith("-")
        ]
        bare = {n.lstrip("-"): n for n in names}
        given = e.option_name.lstrip("-")
        close = [n for n in bare if n.startswith(given)] if len(given) >= 3 else []
        close = (
            close
            if len(close) == 1
            else difflib.get_close_matches(given, list(bare), n=1, cutoff=0.75)
        )
        hint = f"did you mean {bare[close[0]]}? ({help_hint})" if close else help_hint
        return f"{where}: no such option: {e.option_name}", hint
    text = e.format_message().strip() if hasattr(e, "format_message") else str(e)
    return f"{where}: {text}", help_hint


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; print GpudiagError as one line plus a hint, exit with its code.

    Called as the program (no ``argv``), it freezes the garbage collector's objects on the
    way out: what is alive then stays alive to the end, and the interpreter's collections
    while it shuts down would walk every one of them (~17 ms of a 0.2 s small analyze,
    issue 34). Files are closed before that; nothing gpudiag writes waits for a collection.
    """
    try:
        _main(argv)
    finally:
        if argv is None:
            gc.freeze()


def _main(argv: list[str] | None) -> None:
    from gpudiag.cli.quick import analyze_call

    args = _hoisted(sys.argv[1:] if argv is None else argv)
    quick = analyze_call(args)
    try:
        if quick is not None:
            quick()
        else:
            _typer_main(args)
    except GpudiagError as e:
        if state["debug"]:
            raise
        print(f"gpudiag: error: {_printable(e.message)}", file=sys.stderr)
        if e.hint:
            print(f"  hint: {_printable(e.hint)}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # The reader of stdout went away (`gpudiag … | head`): stop quietly, as cat does.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except Exception as e:
        if _is_a(e, "Exit"):  # typer.Exit (click's): --version, --help
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        if _is_a(e, "Abort"):
            print("gpudiag: aborted", file=sys.stderr)
            sys.exit(130)
        if _is_a(e, "UsageError"):  # click/typer usage errors: gpudiag's one line
            message, hint = _usage_words(e)
            print(f"gpudiag: error: {_printable(message)}", file=sys.stderr)
            print(f"  hint: {_printable(hint)}", file=sys.stderr)
            sys.exit(int(getattr(e, "exit_code", EXIT_USAGE) or EXIT_USAGE))
        if state["debug"]:
            raise
        print(f"gpudiag: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            f"  hint: re-run as `{_debug_command(args)}` for the traceback, and please report it",
            file=sys.stderr,
        )
        sys.exit(70)


def _typer_main(args: list[str]) -> None:
    """Parse ``args`` with typer and run the command they name."""
    import typer

    from gpudiag.cli.coerce import install

    command = typer.main.get_command(_app_for(args))
    install(command)  # plain str/Path/int/float coercion: no pydantic in every process
    code = command.main(args=args, prog_name="gpudiag", standalone_mode=False)
    # Without standalone mode, typer *returns* the code of an Exit raised while a command
    # runs (Ctrl-C becomes Exit(130)) instead of exiting: a Ctrl-C'd analyze exited 0.
    # The commands themselves return None.
    if isinstance(code, int) and code:
        sys.exit(code)


def _debug_command(args: list[str]) -> str:
    """The command line that shows the traceback: these arguments with ``--debug`` first."""
    import shlex

    words = ["gpudiag", "--debug", *(a for a in args if a != "--debug")]
    line = shlex.join(words)
    return line if len(line) <= 120 else shlex.join(words[:3]) + " …"
