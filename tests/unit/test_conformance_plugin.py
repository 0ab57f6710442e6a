"""The conformance run's pytest plugin: vLLM's per-test global clean-up is skipped on both sides.

A fake referee whose conftest has vLLM's own pattern (``tests/conftest.py``: an autouse fixture
that runs ``cleanup_dist_env_and_memory()`` unless the test is marked ``skip_global_cleanup``),
run with the command the conformance tier builds, in the directory it builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vllm_rbln_fork.testing.conformance import _pytest_command, _referee
from vllm_rbln_fork.testing.outcomes import parse_junit

# vLLM's tests/conftest.py (0.31.0 to 0.33.0), the clean-up replaced by a line in a file.
CONFTEST = """
import os
import pytest

@pytest.fixture()
def should_do_global_cleanup_after_test(request) -> bool:
    return not request.node.get_closest_marker("skip_global_cleanup")

@pytest.fixture(autouse=True)
def cleanup_fixture(should_do_global_cleanup_after_test: bool):
    yield
    if should_do_global_cleanup_after_test:
        with open(os.environ["CLEANUPS"], "a") as f:
            f.write("cleanup\\n")
"""

PYPROJECT = """
[tool.pytest.ini_options]
addopts = "--strict-markers"
markers = ["skip_global_cleanup"]
"""


def _unpatched_tree(root: Path) -> Path:
    suite = root / "tests" / "v1" / "core"
    suite.mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text(CONFTEST)
    (suite / "test_a.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


def _run(cmd: list[str], referee: Path, cleanups: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["CLEANUPS"] = str(cleanups)
    return subprocess.run(cmd, cwd=referee, env=env, capture_output=True, text=True)


def test_both_sides_skip_vllms_per_test_cleanup(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    referee = _referee(_unpatched_tree(tmp_path / "tree"), work)
    junit = tmp_path / "out.xml"
    cleanups = tmp_path / "cleanups"
    cmd = _pytest_command(Path(sys.executable), junit, (), 0)

    done = _run(cmd, referee, cleanups)

    assert done.returncode == 0, done.stdout + done.stderr
    assert parse_junit(junit.read_text()) == {
        "tests/v1/core/test_a.py::test_one": "passed",
        "tests/v1/core/test_a.py::test_two": "passed",
    }
    assert not cleanups.exists(), cleanups.read_text()


def test_without_the_plugin_the_fake_conftest_cleans_up(tmp_path: Path) -> None:
    """The control: the fake conftest above really runs the clean-up when nothing marks the test."""
    work = tmp_path / "work"
    work.mkdir()
    referee = _referee(_unpatched_tree(tmp_path / "tree"), work)
    cleanups = tmp_path / "cleanups"
    cmd = _pytest_command(Path(sys.executable), tmp_path / "out.xml", (), 0)
    plugin = cmd.index("-p", cmd.index("no:cacheprovider"))
    del cmd[plugin : plugin + 2]

    done = _run(cmd, referee, cleanups)

    assert done.returncode == 0, done.stdout + done.stderr
    assert cleanups.read_text().splitlines() == ["cleanup", "cleanup"]
