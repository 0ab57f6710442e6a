"""``build.py`` with no arguments and the test runner's leftovers."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from vllm_rbln_fork import cli


def test_no_arguments_names_the_sub_commands(capsys) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "--pin" in err and all(f"build.py {c}" in err for c in ("checkout", "export", "test", "lint"))


def test_a_test_run_leaves_no_report_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_rbln_fork.testing.runner import run_tests

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # A tooling run whose pytest only prints its version (so it never runs this test again):
    # the runner makes its report folder, finds no report, and fails the run.
    argv = ["--tier", "tooling", "--", "--version"]
    assert run_tests(argv) == 1
    assert list(tmp_path.iterdir()) == []
