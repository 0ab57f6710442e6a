"""The test run's bytecode folder (runner.run_bytecode_dir): in the cache, removed at the end
of the run, and a killed run's removed by the next run, never a running one's."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_rbln_fork.files import made_and_held
from vllm_rbln_fork.testing.runner import run_bytecode_dir


def test_the_run_s_bytecode_folder_goes_with_the_run_and_sweeps_a_killed_run_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path))
    root = tmp_path / "test-bytecode"
    killed = root / "run-1-1"  # made by a run that was killed: held by no process
    killed.mkdir(parents=True)
    (killed / "x.pyc").write_bytes(b"")
    with made_and_held(root / "run-2-2", lambda d: d.mkdir(parents=True)) as running:
        with run_bytecode_dir() as bytecode:
            assert bytecode.parent == root and bytecode.is_dir()
            assert not killed.exists()
            assert running.is_dir()  # another run's, in use: kept
        assert not bytecode.exists()
        assert not (root / f".{bytecode.name}.lock").exists()
    assert running.is_dir()
