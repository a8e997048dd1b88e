"""How numbers and rank lists read in user text: durations, folded rank ranges, plurals, ordinals.

The one place both the analysis (finding messages) and the renderers (tables) take their
wording of numbers from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

DurationStyle = Literal["table", "message", "brief", "ms", "human", "evidence"]


def duration(ns: float | None, style: DurationStyle = "table", digits: int = 1) -> str:
    """A duration in nanoseconds as text (``n/a`` when unknown), in one of six roundings.

    The roundings are those the outputs have always had (golden files lock them), so
    changing one is a visible output change:

    - ``table``: the unit that reads best — ``12.3 s`` from 10 s, ``1.23 s`` from 1 s, then
      ``ms``, ``µs`` with one decimal and whole ``ns`` (tables and reports);
    - ``message``: ``1.23 s`` from 1 s, else ``123.4 ms`` (warm-up steps);
    - ``brief``: ``1.2 s`` from 1 s, ``123 ms`` from 10 ms, else ``1.2 ms`` (stragglers);
    - ``ms``: always milliseconds with ``digits`` decimals (amounts compared in one unit);
    - ``human``: as ``ms`` below 1 s, seconds with two decimals from 1 s up — a person
      reads ``3.60 s``, not ``3604.0 ms`` (issue 24; finding messages);
    - ``evidence``: ``1.06 s``, ``35.1 ms``, ``14 µs`` — the times quoted in a cause's
      evidence line (host causes, slow steps, copy remedies).
    """
    if ns is None:
        return "n/a"
    if style == "ms" or (style == "human" and abs(ns) < 1e9):
        return f"{ns / 1e6:.{digits}f} ms"
    if style == "human":
        return f"{ns / 1e9:.2f} s"
    if style == "evidence":
        if ns >= 1e9:
            return f"{ns / 1e9:.2f} s"
        return f"{ns / 1e6:.1f} ms" if ns >= 1e6 else f"{ns / 1e3:.0f} µs"
    if style == "message":
        return f"{ns / 1e9:.2f} s" if ns >= 1e9 else f"{ns / 1e6:.1f} ms"
    if style == "brief":
        if ns >= 1e9:
            return f"{ns / 1e9:.1f} s"
        return f"{ns / 1e6:.1f} ms" if ns < 1e7 else f"{ns / 1e6:.0f} ms"
    if abs(ns) >= 10e9:
        return f"{ns / 1e9:.1f} s"
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fold(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 4, 5, 7]`` → ``"0–5, 7"``: runs of three or more folded into a range."""
    xs = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        if j - i >= 2 or (j - i == 1 and len(xs) == 2):
            parts.append(f"{xs[i]}–{xs[j]}")
        else:
            parts.extend(str(x) for x in xs[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def ranks(numbers: Iterable[int]) -> str:
    """``"rank 3"``, ``"ranks 0–1"``, ``"ranks 0–5, 7"``."""
    xs = sorted(set(numbers))
    return f"{plural(len(xs), 'rank', count=False)} {fold(xs)}"


def plural(n: int, word: str, *, count: bool = True, many: str | None = None) -> str:
    """``"1 rank"``, ``"2 ranks"``; ``count=False`` leaves the number out."""
    form = word if n == 1 else (many or word + "s")
    return f"{n} {form}" if count else form


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def percent(x: float) -> str:
    """A share as a whole percentage, never ``-0%``."""
    text = f"{x:.0%}"
    return "0%" if text in ("-0%", "−0%") else text
