"""The formatter formats: at most 20 ``# fmt: skip`` (and no ``# fmt: off``) in the repository.

A table that needs alignment is data (a list of rows), not hand-aligned code kept from
``ruff format``.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from testpaths import ROOT

LIMIT = 20
SKIP = re.compile(r"#\s*fmt:\s*(skip|off)\b")  # also at the end of another comment


def _comments(text: str) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def formatter_skips(root: Path = ROOT) -> list[str]:
    """``path:line`` of every ``# fmt: skip`` / ``# fmt: off`` in the Python files under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part in {"build", "dist"} for part in rel.parts[:-1]):
            continue  # .venv, .git, build output
        for n, comment in _comments(path.read_text(errors="replace")):
            if SKIP.search(comment):
                found.append(f"{rel.as_posix()}:{n}")
    return found


def test_at_most_20_formatter_skips() -> None:
    found = formatter_skips()
    assert len(found) <= LIMIT, f"{len(found)} formatter skips (limit {LIMIT}): {found[:40]}"


def test_the_counter_finds_skips_and_offs(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        "x = 1  # fmt: skip\n# fmt: off\ny = 2\n# fmt: on\ns = '# fmt: skip'\n"
    )
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "b.py").write_text("z = 3  # fmt: skip\n")
    assert formatter_skips(tmp_path) == ["pkg/a.py:1", "pkg/a.py:2"]
