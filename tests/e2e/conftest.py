"""Fixtures of the e2e tier: the index test kit (``tests/support/indexkit.py``) and the servers it starts."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from vllm_rbln_fork import log

# The suite has no packages (--import-mode=importlib): shared test kits live in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import indexkit


@pytest.fixture(scope="session")
def kit() -> ModuleType:
    return indexkit


@pytest.fixture
def reporter() -> log.RecordingReporter:
    rec = log.RecordingReporter()
    log.set_reporter(rec)
    return rec
