"""``gpudiag analyze`` without typer, for the command lines that need nothing typer adds (issue 34).

Importing typer and building the command costs ~30 ms of a ~250 ms small analysis. The
common spellings — root flags, ``analyze``, paths and the options below, each given once
or more, ``--opt VALUE`` or ``--opt=VALUE`` — are parsed here, with the values converted
as typer's command converts them (:func:`gpudiag.cli.coerce.convert`), and
:func:`gpudiag.cli.analyzing.run_analyze` is called as typer's command calls it. Anything
else (``--help``, an unknown option, a missing value, a value that does not convert, no
path, a short option with its value attached) returns None: typer then parses the line
and says what is wrong in its words. So this path never gives an error of its own.

:data:`ANALYZE_OPTIONS` is checked against typer's ``analyze`` command by
``tests/unit/cli/test_quick.py``: the same options, flags and types, and the same call for
the same command line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# dest, flags, kind: "flag" (a bool switch) or the type its value converts to
ANALYZE_OPTIONS: tuple[tuple[str, tuple[str, ...], Any], ...] = (
    ("steps", ("--steps",), "flag"),
    ("fmt", ("--format", "-f"), str),
    ("output", ("--output", "-o"), Path),
    ("idle_threshold", ("--idle-threshold",), float),
    ("step_marker", ("--step-marker",), str),
    ("data_marker", ("--data-marker",), str),
    ("jobs", ("--jobs", "-j"), int),
    ("nsys", ("--nsys",), Path),
    ("include_warmup", ("--include-warmup",), "flag"),
    ("scheduler", ("--scheduler",), str),
    ("timeline", ("--timeline",), Path),
    ("timeline_full", ("--timeline-full",), "flag"),
    ("no_color", ("--no-color",), "flag"),
    ("no_cache", ("--no-cache",), "flag"),
)
ROOT_FLAGS = ("--debug", "--no-color")  # the root options allowed before the command name
_BY_FLAG = {flag: (dest, kind) for dest, flags, kind in ANALYZE_OPTIONS for flag in flags}


def parse_analyze(args: list[str]) -> tuple[set[str], list[Path], dict[str, Any]] | None:
    """(root flags, paths, options) of an ``analyze`` command line, or None for typer."""
    from gpudiag.cli.coerce import convert

    i = 0
    root: set[str] = set()
    while i < len(args) and args[i] in ROOT_FLAGS:
        root.add(args[i])
        i += 1
    if i >= len(args) or args[i] != "analyze":
        return None
    rest = args[i + 1 :]
    paths: list[Path] = []
    options: dict[str, Any] = {}
    j = 0
    only_paths = False
    while j < len(rest):
        word = rest[j]
        j += 1
        if only_paths or word == "-" or not word.startswith("-"):
            if not word:
                return None  # an empty path: typer's words
            paths.append(Path(word))
            continue
        if word == "--":
            only_paths = True
            continue
        name, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        known = _BY_FLAG.get(name)
        if known is None:
            return None
        dest, kind = known
        if kind == "flag":
            if eq:
                return None
            options[dest] = True
            continue
        if eq:
            text = attached
        elif j < len(rest):
            text = rest[j]
            j += 1
        else:
            return None
        if not text or (text.startswith("-") and len(text) > 1):
            return None  # typer decides what a value that looks like an option means
        try:
            options[dest] = convert(kind, text)
        except ValueError:
            return None
    if not paths:
        return None
    return root, paths, options


def analyze_call(args: list[str]) -> Callable[[], None] | None:
    """A call that runs this ``analyze`` command line as typer's command would, or None."""
    parsed = parse_analyze(args)
    if parsed is None:
        return None
    root, paths, options = parsed

    def call() -> None:
        from gpudiag.cli.analyzing import run_analyze
        from gpudiag.cli.base import set_no_cache, set_no_color, set_root

        no_color = options.pop("no_color", False) or "--no-color" in root
        no_cache = options.pop("no_cache", False)
        set_root("--debug" in root)
        if no_color:
            set_no_color()
        if no_cache:
            set_no_cache()
        run_analyze(paths, **options)

    return call
