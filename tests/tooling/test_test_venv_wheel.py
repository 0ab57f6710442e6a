"""The test runner puts each new RBLN wheel into the warm vLLM test venv: a real venv, the
real installer (uv from the tool env), synthetic wheels named like ours."""

from __future__ import annotations

from pathlib import Path

import indexkit as kit  # tests/support, put on sys.path by tests/tooling/conftest.py
import pytest

from vllm_rbln_fork.errors import FailedProcess
from vllm_rbln_fork.testing.runner import install_wheel


def test_a_rebuilt_wheel_of_the_same_version_replaces_the_installed_one(tmp_path: Path) -> None:
    # A new tool or patch often rebuilds a wheel whose version did not change: an installer
    # that compares versions only would keep the old code and test it.
    python = kit.fresh_venv(tmp_path / "venv")
    lock = tmp_path / "vllm-test.lock"
    first = kit.make_wheel(tmp_path / "dist", body="EDIT = 'first'")
    install_wheel(python, first, lock)
    assert kit.venv_python(python, "import vllm; print(vllm.EDIT)") == "first"
    second = kit.make_wheel(tmp_path / "dist", body="EDIT = 'second'")  # over the first, as in dist/
    assert second == first
    install_wheel(python, second, lock)
    assert kit.venv_python(python, "import vllm; print(vllm.EDIT)") == "second"


def test_a_wheel_needing_a_package_the_lock_lacks_names_the_lock(tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    lock = tmp_path / "vllm-test.lock"
    wheel = kit.make_wheel(tmp_path / "w", requires=["rbln-not-in-the-lock>=1"])
    with pytest.raises(FailedProcess, match="vllm-test.lock") as failed:
        install_wheel(python, wheel, lock)
    assert "rbln-not-in-the-lock" in str(failed.value)
