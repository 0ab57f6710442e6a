"""Fixtures of the e2e tier: the index test kit (``indexkit.py``) and the servers it starts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from vllm_rbln_fork import log


def _load_indexkit() -> ModuleType:
    # The suite has no packages (--import-mode=importlib): load the kit by path, once.
    if "indexkit" in sys.modules:
        return sys.modules["indexkit"]
    spec = importlib.util.spec_from_file_location("indexkit", Path(__file__).with_name("indexkit.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["indexkit"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kit() -> ModuleType:
    return _load_indexkit()


@pytest.fixture
def reporter() -> log.RecordingReporter:
    rec = log.RecordingReporter()
    log.set_reporter(rec)
    return rec
