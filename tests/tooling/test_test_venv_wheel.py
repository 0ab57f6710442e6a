"""The test runner puts each new RBLN wheel into the warm vLLM test venv: a real venv, the
real installer (uv from the tool env), synthetic wheels
named like ours."""

from __future__ import annotations

from pathlib import Path

import indexkit as kit  # tests/support, put on sys.path by tests/tooling/conftest.py
import pytest

from vllm_rbln_fork.errors import FailedProcess, ForkError
from vllm_rbln_fork.testing.runner import install_wheel, make_locked_venv


@pytest.fixture
def python(tmp_path: Path) -> Path:
    """A fresh venv's python."""
    return kit.fresh_venv(tmp_path / "venv")


def test_a_tool_env_without_uv_is_named_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test lock has uv, so a missing binary is a damaged tool env: said, never a silent
    turn to pip (which took minutes where uv takes seconds)."""
    import uv

    def missing() -> str:
        raise FileNotFoundError("uv")

    monkeypatch.setattr(uv, "find_uv_bin", missing)
    with pytest.raises(ForkError, match="no uv binary .* Delete that folder and run the same command again"):
        install_wheel(tmp_path / "venv" / "bin" / "python", tmp_path / "x.whl", tmp_path / "vllm-test.lock")


def test_a_locked_venv_is_made_without_ensurepip_and_has_pip(tmp_path: Path) -> None:
    """make_locked_venv: uv's venv with the pip and setuptools wheels ensurepip carries (the
    conformance tier lists packages with pip), then the lock."""
    lock = tmp_path / "empty.lock"
    lock.write_text("")
    python = make_locked_venv(tmp_path / "venv", lock)
    listed = kit.venv_python(python, "import setuptools, pip; print(pip.__version__)")
    import ensurepip

    assert listed.splitlines()[-1] == ensurepip.version()


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
