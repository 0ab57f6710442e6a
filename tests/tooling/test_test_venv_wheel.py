"""The test runner puts each new RBLN wheel into the warm vLLM test venv: a real venv, the
real installer (uv from the tool env, or pip where uv's binary is missing), synthetic wheels
named like ours."""

from __future__ import annotations

import venv
from pathlib import Path

import indexkit as kit  # tests/support, put on sys.path by tests/tooling/conftest.py
import pytest

from vllm_rbln_fork.errors import FailedProcess
from vllm_rbln_fork.testing.runner import install_wheel


@pytest.fixture(params=["uv", "pip"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh venv's python; each case runs with uv, and with pip as when uv's binary is
    missing (the test venvs have pip: vllm_venv makes them with it)."""
    if request.param == "uv":
        return kit.fresh_venv(tmp_path / "venv")
    import uv

    def missing() -> str:
        raise FileNotFoundError("uv")

    monkeypatch.setattr(uv, "find_uv_bin", missing)
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    return tmp_path / "venv" / "bin" / "python"


def test_a_rebuilt_wheel_of_the_same_version_replaces_the_installed_one(tmp_path: Path, python: Path) -> None:
    # A new tool or patch often rebuilds a wheel whose version did not change: an installer
    # that compares versions only would keep the old code and test it.
    lock = tmp_path / "vllm-test.lock"
    first = kit.make_wheel(tmp_path / "dist", body="EDIT = 'first'")
    install_wheel(python, first, lock)
    assert kit.venv_python(python, "import vllm; print(vllm.EDIT)") == "first"
    second = kit.make_wheel(tmp_path / "dist", body="EDIT = 'second'")  # over the first, as in dist/
    assert second == first
    install_wheel(python, second, lock)
    assert kit.venv_python(python, "import vllm; print(vllm.EDIT)") == "second"


def test_a_wheel_needing_a_package_the_lock_lacks_names_the_lock(tmp_path: Path, python: Path) -> None:
    lock = tmp_path / "vllm-test.lock"
    wheel = kit.make_wheel(tmp_path / "w", requires=["rbln-not-in-the-lock>=1"])
    with pytest.raises(FailedProcess, match="vllm-test.lock") as failed:
        install_wheel(python, wheel, lock)
    assert "rbln-not-in-the-lock" in str(failed.value)
