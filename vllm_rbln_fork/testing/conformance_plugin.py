"""A pytest plugin loaded into vLLM's own test run (``-p``), copied beside the referee tests.

vLLM's ``tests/conftest.py`` ends every test with ``cleanup_dist_env_and_memory()`` unless
the test carries the ``skip_global_cleanup`` marker; vLLM marks its own CPU-only unit tests
with it ("a ~10x speedup for non-GPU unit tests"). That clean-up frees GPU memory and tears
down distributed groups, which ``tests/v1/core`` never sets up on the CPU; what it costs here
is a full ``gc.collect()`` over some 600,000 objects (torch and vLLM imported), 0.4-1 s a test,
nine tenths of the suite's time. Both sides of the comparison run with this plugin, so the
referee is the same for both.

It runs in the vLLM venv's Python, so it imports nothing of ours.
"""

from __future__ import annotations

import pytest

MARKER = "skip_global_cleanup"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, MARKER))
