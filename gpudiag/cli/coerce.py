"""Plain coercion of the CLI's option values, without pydantic.

Recent typer releases coerce every option value through a pydantic ``TypeAdapter`` that
they build on first use: importing pydantic and building the adapters costs ~50 ms and
~14 MB in every ``gpudiag`` process, more than the rest of a small analysis. gpudiag's
options are only ``str``, ``Path``, ``int``, ``float`` and ``bool`` values and lists of
them, so :func:`install` gives each such parameter of the built click command a runtime
coercion that converts them directly, with the same error messages. On a typer without
runtime coercion (click types do the work there), or for any other annotation, nothing is
changed.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")
_MESSAGES = {
    bool: "Input should be a valid boolean, unable to interpret input",
    int: "Input should be a valid integer, unable to parse string as an integer",
    float: "Input should be a valid number, unable to parse string as a number",
}


_KINDS = (str, Path, int, float, bool)


def convert(kind: type, value: Any) -> Any:
    """``value`` (a str from the command line, or already typed) as ``kind``.

    Raises ValueError with the message typer's own coercion gives.
    """
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if kind is Path:
        return Path(value)
    if kind is bool:
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError(_MESSAGES[bool])
    if kind is str:
        if isinstance(value, (int, float, Path)):
            return str(value)
        raise ValueError("Input should be a valid string")
    if kind in (int, float):
        if isinstance(value, str):
            try:
                return kind(value.strip())
            except ValueError:
                raise ValueError(_MESSAGES[kind]) from None
        if isinstance(value, int) and not isinstance(value, bool):
            return kind(value)
        raise ValueError(_MESSAGES[kind])
    raise TypeError(kind)


def _leaf(annotation: Any) -> tuple[type, bool] | None:
    """(element type, is a list) for the annotations handled here, else None."""
    if typing.get_origin(annotation) is list:
        args = typing.get_args(annotation)
        if len(args) == 1 and args[0] in _KINDS:
            return args[0], True
        return None
    if annotation in _KINDS:
        return annotation, False
    return None


def install(command: Any) -> None:
    """Give every simple parameter of ``command`` (and its subcommands) plain coercion."""
    try:
        from typer._click.exceptions import BadParameter
        from typer._coercion import RuntimeParam
    except ImportError:  # a typer that coerces with click types: nothing to replace
        return

    class Plain(RuntimeParam):
        """Converts str/Path/int/float/bool values (or lists of them) by hand."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            leaf = _leaf(self.annotation)
            assert leaf is not None
            kind, many = leaf
            try:
                if many:
                    items = value if isinstance(value, (list, tuple)) else [value]
                    return [convert(kind, v) for v in items]
                return convert(kind, value)
            except ValueError as e:
                raise BadParameter(str(e), ctx=ctx, param=param) from None

    def give(p: Any) -> None:
        desc = getattr(p, "type_descriptor", None)
        if desc is None or not hasattr(p, "_runtime_param") or p._runtime_param is not None:
            return
        if getattr(desc, "file_annotation", None) is None and _leaf(desc.annotation) is not None:
            try:
                p._runtime_param = Plain(
                    parameter_info=desc.parameter_info, annotation=desc.annotation
                )
            except (TypeError, AttributeError):  # another typer's internals: keep its own
                return

    def with_help(cmd: Any) -> None:
        """The ``--help`` option is made per context: coerce it plainly too."""
        made = cmd.get_help_option

        def get_help_option(ctx: Any) -> Any:
            opt = made(ctx)
            if opt is not None:
                give(opt)
            return opt

        cmd.get_help_option = get_help_option

    stack = [command]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        for p in getattr(cmd, "params", ()):
            give(p)
        if callable(getattr(cmd, "get_help_option", None)):
            with_help(cmd)
