"""gpudiag._support.lazyre.compile gives what re.compile gives, compiled at first use (issue 23)."""

from __future__ import annotations

import re

from gpudiag._support import lazyre


def test_same_answers_as_re():
    for pattern, flags, text in [
        (r"rank[-_]?(\d+)", re.IGNORECASE, "x RANK_12 y"),
        (r"^a|b$", 0, "cab"),
        (r"(?P<n>\d+)", 0, "no digits"),
    ]:
        lazy, real = lazyre.compile(pattern, flags), re.compile(pattern, flags)
        assert "search" not in vars(lazy)  # nothing compiled yet
        for name in ("search", "match", "fullmatch"):
            got, want = getattr(lazy, name)(text), getattr(real, name)(text)
            assert (got and got.group(0)) == (want and want.group(0))
        assert lazy.findall(text) == real.findall(text)
        assert lazy.sub("-", text) == real.sub("-", text)
        assert (lazy.pattern, lazy.flags, lazy.groups) == (real.pattern, real.flags, real.groups)
        assert vars(lazy)["search"].__self__ is real  # re's own cache: the same pattern object
