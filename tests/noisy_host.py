"""Re-running a real job when the shared test host, not gpudiag, is the likely culprit.

On a 2-core VM the same balanced CPU DDP job sometimes has one rank compute twice as long
for a step or two (seen in CI: 240 vs 480 ms of compute for one step, the ranks pinned to
their own cores). gpudiag then reports, correctly, what happened. Tests that assert that a
*balanced* job draws no finding run it again, up to ``attempts`` times, and fail only if
every attempt shows the finding: a gpudiag that always flagged balanced runs still fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def first_clean(
    make: Callable[[int], T], problems: Callable[[T], list[str]], attempts: int = 3
) -> T:
    """``make(i)`` until ``problems`` of the result is empty; AssertionError after ``attempts``."""
    seen: list[str] = []
    for i in range(attempts):
        result = make(i)
        found = problems(result)
        if not found:
            return result
        seen.append(f"attempt {i + 1}: " + "; ".join(found))
    raise AssertionError("every attempt showed: " + " | ".join(seen))
