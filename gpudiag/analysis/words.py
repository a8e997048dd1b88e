"""How numbers and rank lists read in user text: folded rank ranges, plurals, ordinals."""

from __future__ import annotations

from collections.abc import Iterable


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
