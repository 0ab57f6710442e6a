"""Fixtures of the e2e tier: the index test kit (``tests/support/indexkit.py``) and the servers it starts."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

# The suite has no packages (--import-mode=importlib): shared test kits live in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import indexkit
from checks import recorder  # noqa: F401 (a fixture)


@pytest.fixture(scope="session")
def kit() -> ModuleType:
    return indexkit
