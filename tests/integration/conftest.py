"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def torch_required() -> None:
    pytest.importorskip("torch")
