"""The cache never costs an analysis: an unusable cache directory means no cache, said once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.fanout import cache

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "data" / "legacy_2021"


def _analyze(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPUDIAG_")}
    full.update(env)
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(FIXTURE), *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        check=False,
    )


def test_a_home_whose_cache_cannot_be_made_analyses_without_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("a file where the cache directory would go\n")
    r = _analyze(tmp_path, {"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("verdict:")
    notes = [line for line in r.stderr.splitlines() if "cannot be used" in line]
    assert len(notes) == 1, r.stderr
    assert "analysing without the cache" in notes[0]
    assert "internal error" not in r.stderr


def test_a_cache_directory_this_user_may_not_search_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a cache directory under a parent that refuses stat (another user's HOME)
    home = tmp_path / "other" / ".cache" / "gpudiag" / "ranks"
    real_stat = os.stat

    def refusing(p, *a, **kw):  # type: ignore[no-untyped-def]
        if str(p).startswith(str(tmp_path / "other")):
            raise PermissionError(13, "Permission denied", str(p))
        return real_stat(p, *a, **kw)

    monkeypatch.setattr(os, "stat", refusing)
    # THEN it is simply not usable, and nothing raises
    assert cache._usable(home) is False


def test_debug_after_the_command_name_works_and_the_hint_is_a_command(tmp_path: Path) -> None:
    r = _analyze(tmp_path, {}, "--debug", "--no-cache")
    assert r.returncode == 0, r.stderr
    from gpudiag.cli.main import _debug_command, _hoisted

    assert _hoisted(["analyze", "x", "--debug"]) == ["--debug", "analyze", "x"]
    assert _hoisted(["run", "--", "python", "t.py", "--debug"]) == [
        "run",
        "--",
        "python",
        "t.py",
        "--debug",
    ]
    assert _hoisted(["run", "python", "t.py", "--debug"]) == ["run", "python", "t.py", "--debug"]
    assert _debug_command(["analyze", "x"]) == "gpudiag --debug analyze x"
