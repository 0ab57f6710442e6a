"""The run's counts from pytest's own JUnit report: an xfail is counted as an expected
failure, not as a skipped check (JUnit files both under `skipped`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vllm_rbln_fork.testing.runner import Counts, _junit_counts

TESTS = """
import pytest

def test_passes():
    pass

@pytest.mark.xfail(strict=True, reason="a gap this pin has")
def test_expected_failure():
    assert False

@pytest.mark.skip(reason="left out")
def test_left_out():
    pass

def test_fails():
    assert False
"""


def test_xfail_skip_and_failure_are_told_apart(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "."],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_ADDOPTS": ""},  # a caller's --runxfail would turn the xfail into a failure
        capture_output=True,
        check=False,
    )
    assert _junit_counts(report) == Counts(passed=1, failed=1, skipped=1, xfailed=1)


def test_a_missing_report_is_a_failure(tmp_path: Path) -> None:
    assert _junit_counts(tmp_path / "none.xml") == Counts(failed=1)
