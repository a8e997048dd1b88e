"""Regular expressions compiled on first use (issue 23).

Compiling a pattern is pure Python in ``re`` (~0.1-0.5 ms each); gpudiag's tables of
names (kernel families, host API classes, device models) hold dozens, and a small trace
needs few of them. :func:`compile` returns an object that compiles its pattern the first
time one of its attributes is used, then keeps the compiled pattern's methods as its own:
later calls cost what a compiled pattern's cost. Use it for patterns that are only called
(``search``, ``match``, …), never handed to ``re`` functions or ``isinstance`` checks.
"""

from __future__ import annotations

import re
from typing import Any, cast

__all__ = ["compile"]

_KEPT = (
    "search",
    "match",
    "fullmatch",
    "sub",
    "subn",
    "split",
    "findall",
    "finditer",
    "pattern",
    "flags",
    "groups",
    "groupindex",
)


class _Lazy:
    def __init__(self, pattern: str, flags: int) -> None:
        self._source = (pattern, flags)

    def __getattr__(self, name: str) -> Any:  # only for what is not yet in __dict__
        if name.startswith("__"):
            raise AttributeError(name)
        compiled = re.compile(*self._source)
        self.__dict__.update((n, getattr(compiled, n)) for n in _KEPT)
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"lazyre.compile({self._source[0]!r}, {self._source[1]})"


def compile(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """``re.compile(pattern, flags)``, done on first use."""
    return cast("re.Pattern[str]", _Lazy(pattern, flags))
