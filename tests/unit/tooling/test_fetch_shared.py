"""tests/fetch_shared.py's pinned table agrees with the shared traces, file by file."""

from __future__ import annotations

import sys
from pathlib import Path

from testpaths import TESTS

sys.path.insert(0, str(TESTS))
import fetch_shared


def test_every_shared_file_is_pinned_and_matches(shared_traces: Path, tmp_path: Path) -> None:
    on_disk = {
        p.relative_to(shared_traces).as_posix()
        for p in shared_traces.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    assert on_disk == {rel for rel, *_ in fetch_shared.FILES}
    assert fetch_shared.fetch(tmp_path, shared_traces, None, check_only=False) == []
    assert fetch_shared.fetch(tmp_path, None, None, check_only=True) == []


def test_a_changed_file_is_refused_and_not_kept(shared_traces: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    rel = "kineto/LICENSE.param"
    (source / rel).parent.mkdir(parents=True)
    (source / rel).write_bytes((shared_traces / rel).read_bytes() + b"\n")
    problems = fetch_shared.fetch(tmp_path / "dest", source, None, check_only=False)
    assert any(p.startswith(f"{rel}: size or SHA-256 differs") for p in problems)
    assert not (tmp_path / "dest" / rel).exists()


def test_every_public_file_has_a_pinned_url() -> None:
    for rel, key, source_path, _, sha in fetch_shared.FILES:
        assert len(sha) == 64, rel
        repo, commit = fetch_shared.SOURCES[key]
        assert len(commit) == 40, key
        if source_path is not None:
            url = fetch_shared._urls(key, source_path, rel, None)[0]
            assert url == f"https://raw.githubusercontent.com/{repo}/{commit}/{source_path}"
