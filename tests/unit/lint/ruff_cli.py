"""The ruff command the lint tests run: on PATH or in this interpreter, else the test skips."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest


def ruff() -> list[str]:
    """``ruff`` as a command line, or skip the calling test (the lint extra is not installed)."""
    found = shutil.which("ruff")
    if found is not None:
        return [found]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    pytest.skip("ruff is not installed (pip install -e .[lint])")
